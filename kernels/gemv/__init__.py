"""Skinny GEMMs for decode (the weight stream, with silu_mul or the pre-norm folded into its loads).

``kernel``: the Triton kernel and its wrapper; ``naive``: its torch reference.
"""

from kernels.gemv.kernel import (
    DEFAULT_CONFIG,
    GEMV_CONFIGS,
    MAX_ROWS,
    NORM_CONFIGS,
    ROW_TILES,
    SILU_MUL_CONFIGS,
    gemv,
    gemv_add_rms_norm,
    gemv_silu_mul,
    gemv_wins,
    norm_fold_wins,
    silu_mul_fold_wins,
    tile_rows,
)
from kernels.gemv.naive import gemv_add_rms_norm_ref, gemv_ref, gemv_silu_mul_ref

__all__ = [
    "DEFAULT_CONFIG", "GEMV_CONFIGS", "MAX_ROWS", "NORM_CONFIGS", "ROW_TILES", "SILU_MUL_CONFIGS", "gemv",
    "gemv_add_rms_norm", "gemv_silu_mul", "gemv_wins", "norm_fold_wins", "silu_mul_fold_wins", "tile_rows", "gemv_ref",
    "gemv_silu_mul_ref", "gemv_add_rms_norm_ref"
]
