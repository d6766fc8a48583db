"""The fused decode step's elementwise gates (SwiGLU's silu_mul, the attention output gate).

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.gates.kernel import BLOCK_SILU, sigmoid_gate_mul, silu_mul
from kernels.gates.naive import sigmoid_gate_mul_ref, silu_mul_ref

__all__ = ["BLOCK_SILU", "sigmoid_gate_mul", "silu_mul", "silu_mul_ref", "sigmoid_gate_mul_ref"]
