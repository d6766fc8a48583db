"""Triton kernels, one folder per op: the kernel (``kernel.py``) beside its torch reference (``naive.py``).

``kernels.rows``: the resident-row ops resplan's executor runs in the graph (scatter staged cells, gather a step's
rows, commit lengths). The model's decode ops: ``gdn_decode`` (the fused Gated DeltaNet step, in place on the slot
pools), ``norms``, ``gates``, ``attention_prep`` (the attention prologue), ``gemv`` (skinny GEMMs), ``paged_decode``
(plan-free split-KV attention). The prefill pass's: ``conv1d_varlen`` (the causal conv over sequences back to back)
and ``gdn_prefill`` (fla-core's chunked delta rule, CUDA only; a torch reference everywhere).
``choices.KernelChoices`` is the one value that says which forms they take (PDL launches, the one-row folds, where
the weight stream runs), passed down a model's decode walk; ``pdl`` is the launch switch it sets and ``runtime`` says
whether Triton's interpreter runs them. Nothing here imports ``models``.
"""

from kernels.attention_prep import attention_prep_, attention_prep_ref
from kernels.gates import sigmoid_gate_mul, sigmoid_gate_mul_ref, silu_mul, silu_mul_ref
from kernels.gdn_decode import (
    conv1d_decode_step_,
    conv1d_decode_step_ref,
    gdn_decode_raw_step_,
    gdn_decode_raw_step_ref,
    gdn_decode_step_,
    gdn_decode_step_ref,
)
from kernels.norms import add_rms_norm_, add_rms_norm_ref, gated_rms_norm, gated_rms_norm_ref
from kernels.rows import (
    commit_lengths,
    commit_lengths_ref,
    gather_rows,
    gather_rows_ref,
    scatter_cells,
    scatter_cells_ref,
)

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
