"""The fused Gated DeltaNet decode step (delta rule and conv, in place on the slotted pools).

``kernel``: the conv and delta-rule kernels and their wrappers; ``mixer``: both and the gated norm as one kernel;
``naive``: their torch references.
"""

from kernels.gdn_decode.kernel import conv1d_decode_step_, gdn_decode_raw_step_, gdn_decode_step_
from kernels.gdn_decode.mixer import gdn_decode_mixer_step_
from kernels.gdn_decode.naive import (
    conv1d_decode_step_ref,
    gdn_decode_mixer_step_ref,
    gdn_decode_raw_step_ref,
    gdn_decode_step_ref,
)

__all__ = [
    "conv1d_decode_step_", "gdn_decode_raw_step_", "gdn_decode_step_", "gdn_decode_step_ref",
    "conv1d_decode_step_ref", "gdn_decode_raw_step_ref", "gdn_decode_mixer_step_", "gdn_decode_mixer_step_ref",
]
