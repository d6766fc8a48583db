"""References of the decode GEMMs: float64 math, no intermediate rounding, cast once to the activation's dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gemv_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T."""
    return (x.double() @ w.double().t()).to(x.dtype)


def gemv_silu_mul_ref(gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(silu(gu[:, :K]) * gu[:, K:]) @ w[N, K]^T (gu [M, 2K])."""
    g, u = gu.double().chunk(2, dim=-1)
    return ((F.silu(g) * u) @ w.double().t()).to(gu.dtype)


def gemv_add_rms_norm_ref(h, delta, norm_weight, eps, w, *, zero_centered=True) -> torch.Tensor:
    """s = h + delta, y = s * rsqrt(mean(s^2) + eps) * (1 + nw) (or * nw) @ w^T; h [M, K], w [N, K]."""
    s = h.double() + (0 if delta is None else delta.double())
    nw = 1 + norm_weight.double() if zero_centered else norm_weight.double()
    x = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * nw
    return (x @ w.double().t()).to(h.dtype)
