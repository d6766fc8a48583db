"""Qwen3.5 attention's per-token prologue (q/k norms, partial RoPE, the K/V write) in one kernel.

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.attention_prep.kernel import attention_prep_
from kernels.attention_prep.naive import attention_prep_ref

__all__ = ["attention_prep_", "attention_prep_ref"]
