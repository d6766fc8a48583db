"""The causal depthwise conv of a batched prefill in one kernel.

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.conv1d_prefill.kernel import conv1d_prefill
from kernels.conv1d_prefill.naive import conv1d_prefill_ref

__all__ = ["conv1d_prefill", "conv1d_prefill_ref"]
