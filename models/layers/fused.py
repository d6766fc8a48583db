"""Projections that share an input, run as one GEMM: their weights become row blocks of one fused weight.

``fused_weight(owner, name, *linears)`` concatenates the linears' weights once into ``W [sum(out_i), in]`` and re-points
each ``linear.weight`` at its block of W (a view), so ``state_dict``/``load_state_dict`` still read and write the same
storage and the fused GEMM ``x @ W^T`` sees every later weight update. The fusion is cached on ``owner`` and rebuilt
if a weight no longer lives in W (after ``.to()``, or a replaced parameter). Building allocates, so it must not happen
inside a CUDA-graph capture: call the model's ``fuse_projections()`` first (``build_adapter`` does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _is_fused(w: torch.Tensor, linears: tuple[nn.Linear, ...]) -> bool:
    """Every linear's weight is the matching row block of w."""
    row, offset = w.stride(0) * w.element_size(), 0
    for lin in linears:
        p = lin.weight
        if p.device != w.device or p.dtype != w.dtype or p.data_ptr() != w.data_ptr() + offset * row:
            return False
        offset += p.shape[0]
    return offset == w.shape[0]


def fused_weight(owner: nn.Module, name: str, *linears: nn.Linear) -> torch.Tensor:
    """The fused weight [sum(out_i), in] of ``linears`` (bias-free, one input width), built on first use."""
    cache = owner.__dict__.setdefault("_fused_weights", {})
    w = cache.get(name)
    if w is not None and _is_fused(w, linears):
        return w
    if any(lin.bias is not None for lin in linears) or len({lin.in_features for lin in linears}) != 1:
        raise ValueError(f"{name}: fuses bias-free linears of one input width only")
    if linears[0].weight.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{name}: projections not fused before CUDA-graph capture; call fuse_projections() first")
    with torch.no_grad():
        w = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    offset = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(w[offset : offset + n], requires_grad=lin.weight.requires_grad)
        offset += n
    cache[name] = w
    return w


def decode_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T for a decode step: the Triton weight stream (kernels.gemv) on CUDA at the shapes where it
    was measured faster than cuBLAS (``kernels.gemv.GEMV_CONFIGS``), else ``F.linear``."""
    if x.is_cuda:
        from kernels.gemv import gemv, gemv_wins

        if gemv_wins(x.shape[0], w.shape[0], w.shape[1]):
            return gemv(x, w)
    return F.linear(x, w)


FOLD_SILU_MUL = True  # decode_silu_mul_linear folds silu_mul into the weight stream where it runs (benches turn it off)


def decode_silu_mul_linear(gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(silu(gu[:, :K]) * gu[:, K:]) @ w[N, K]^T for a decode step (gu [M, 2K], SwiGLU's gate|up output): on CUDA where
    it was measured faster, one kernel with silu_mul folded into its loads (kernels.gemv.gemv_silu_mul, equal to the
    two-step value bit for bit); else kernels.gates.silu_mul then ``decode_linear``."""
    from kernels.gates import silu_mul

    if gu.is_cuda:
        from kernels.gemv import gemv_silu_mul, silu_mul_fold_wins

        if FOLD_SILU_MUL and silu_mul_fold_wins(gu.shape[0], w.shape[0], w.shape[1]):
            return gemv_silu_mul(gu, w)
    return decode_linear(silu_mul(gu), w)
