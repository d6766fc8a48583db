"""The fused Gated DeltaNet decode step (delta rule and conv, in place on the slotted pools).

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.gdn_decode.kernel import conv1d_decode_step_, gdn_decode_raw_step_, gdn_decode_step_
from kernels.gdn_decode.naive import conv1d_decode_step_ref, gdn_decode_raw_step_ref, gdn_decode_step_ref

__all__ = [
    "conv1d_decode_step_", "gdn_decode_raw_step_", "gdn_decode_step_", "gdn_decode_step_ref",
    "conv1d_decode_step_ref", "gdn_decode_raw_step_ref"
]
