"""Skinny GEMMs for decode (the weight stream, with silu_mul, the pre-norm, the GDN output norm or attention's output
gate folded into its loads).

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.gemv.kernel import (
    DEFAULT_CONFIG,
    GATED_NORM_CONFIGS,
    GEMV_CONFIGS,
    MAX_ROWS,
    NORM_CONFIGS,
    SIGMOID_GATE_CONFIGS,
    SILU_MUL_CONFIGS,
    ConvStep,
    gated_norm_fold_wins,
    gemv,
    gemv_add_rms_norm,
    gemv_gated_rms_norm,
    gemv_sigmoid_gate,
    gemv_silu_mul,
    gemv_wins,
    norm_fold_wins,
    sigmoid_gate_fold_wins,
    silu_mul_fold_wins,
)
from kernels.gemv.naive import (
    gemv_add_rms_norm_ref,
    gemv_gated_rms_norm_ref,
    gemv_ref,
    gemv_sigmoid_gate_ref,
    gemv_silu_mul_ref,
)

__all__ = [
    "ConvStep",
    "DEFAULT_CONFIG",
    "GEMV_CONFIGS",
    "MAX_ROWS",
    "NORM_CONFIGS",
    "SILU_MUL_CONFIGS",
    "gemv",
    "gemv_add_rms_norm",
    "gemv_silu_mul",
    "gemv_wins",
    "norm_fold_wins",
    "silu_mul_fold_wins",
    "gemv_ref",
    "gemv_silu_mul_ref",
    "gemv_add_rms_norm_ref",
    "GATED_NORM_CONFIGS",
    "SIGMOID_GATE_CONFIGS",
    "gemv_gated_rms_norm",
    "gemv_sigmoid_gate",
    "gated_norm_fold_wins",
    "sigmoid_gate_fold_wins",
    "gemv_gated_rms_norm_ref",
    "gemv_sigmoid_gate_ref",
]
