"""The fused decode step's row norms (residual add + RMS norm, gated RMS norm).

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.norms.kernel import add_rms_norm_, gated_rms_norm
from kernels.norms.naive import add_rms_norm_ref, gated_rms_norm_ref

__all__ = ["add_rms_norm_", "gated_rms_norm", "add_rms_norm_ref", "gated_rms_norm_ref"]
