"""Triton kernels of the resident decode step (scatter staged cells, gather step rows, commit lengths), the fused
Gated DeltaNet decode step (SSM + conv, in place on the slot pools), and their torch references."""

from kernels.commit_lengths import commit_lengths
from kernels.gather_rows import gather_rows
from kernels.gdn_decode import conv1d_decode_step_, gdn_decode_step_
from kernels.reference import (
    commit_lengths_ref,
    conv1d_decode_step_ref,
    gather_rows_ref,
    gdn_decode_step_ref,
    scatter_cells_ref,
)
from kernels.scatter_cells import scatter_cells

__all__ = [
    "commit_lengths",
    "commit_lengths_ref",
    "conv1d_decode_step_",
    "conv1d_decode_step_ref",
    "gather_rows",
    "gather_rows_ref",
    "gdn_decode_step_",
    "gdn_decode_step_ref",
    "scatter_cells",
    "scatter_cells_ref",
]
