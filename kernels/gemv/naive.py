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


def gemv_gated_rms_norm_ref(o, z, norm_weight, eps, w) -> torch.Tensor:
    """Per head (nw * o * rsqrt(mean_d(o^2) + eps)) * silu(z) @ w^T; o [1, H, D], z [1, H D], w [N, H D]."""
    n, H, D = o.shape
    od = o.double()
    y = norm_weight.double() * od * torch.rsqrt(od.pow(2).mean(-1, keepdim=True) + eps)
    x = (y * F.silu(z.double().reshape(n, H, D))).reshape(n, H * D)
    return (x @ w.double().t()).to(norm_weight.dtype)


def gemv_sigmoid_gate_ref(o, qkv, w) -> torch.Tensor:
    """(o * sigmoid(gate)) @ w^T, head h's gate at qkv[:, h 2D + D : (h + 1) 2D]; o [1, H, D], w [N, H D]."""
    n, H, D = o.shape
    gate = qkv[:, : 2 * H * D].double().reshape(n, H, 2 * D)[..., D:]
    return ((o.double() * torch.sigmoid(gate)).reshape(n, H * D) @ w.double().t()).to(o.dtype)
