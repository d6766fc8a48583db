"""Triton kernels of the resident decode step (scatter staged cells, gather step rows, commit lengths), the fused
Gated DeltaNet decode step (SSM + conv, in place on the slot pools), the fused decode step's row ops (residual add +
norm, gates, the attention prologue), and their torch references."""

from kernels.attention_prep import attention_prep_
from kernels.commit_lengths import commit_lengths
from kernels.gates import sigmoid_gate_mul, silu_mul
from kernels.gather_rows import gather_rows
from kernels.gdn_decode import conv1d_decode_step_, gdn_decode_raw_step_, gdn_decode_step_
from kernels.norms import add_rms_norm_, gated_rms_norm
from kernels.reference import (
    add_rms_norm_ref,
    attention_prep_ref,
    commit_lengths_ref,
    conv1d_decode_step_ref,
    gated_rms_norm_ref,
    gather_rows_ref,
    gdn_decode_raw_step_ref,
    gdn_decode_step_ref,
    scatter_cells_ref,
    sigmoid_gate_mul_ref,
    silu_mul_ref,
)
from kernels.scatter_cells import scatter_cells

__all__ = [
    "add_rms_norm_",
    "add_rms_norm_ref",
    "attention_prep_",
    "attention_prep_ref",
    "commit_lengths",
    "commit_lengths_ref",
    "conv1d_decode_step_",
    "conv1d_decode_step_ref",
    "gated_rms_norm",
    "gated_rms_norm_ref",
    "gather_rows",
    "gather_rows_ref",
    "gdn_decode_raw_step_",
    "gdn_decode_raw_step_ref",
    "gdn_decode_step_",
    "gdn_decode_step_ref",
    "scatter_cells",
    "scatter_cells_ref",
    "sigmoid_gate_mul",
    "sigmoid_gate_mul_ref",
    "silu_mul",
    "silu_mul_ref",
]
