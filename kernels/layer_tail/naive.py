"""Reference of the layer's tail: the kernel chain it replaces, in torch, with the same roundings (each stored tensor
cast to the activations' dtype), float64 math between them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _normed(s: torch.Tensor, nw: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    """round(s * rsqrt(mean(s^2) + eps) * w') in float64 from the rounded s."""
    sd = s.double()
    w = 1 + nw.double() if zero_centered else nw.double()
    return (sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + eps) * w).to(s.dtype)


def layer_tail_ref(y, h, wo, nw1, eps1, wgu, wd, nw2=None, eps2=0.0, wp=None, *, zero_centered=True):
    """(p [1, NP] or d2 [1, H] without a next layer, the residual after the layer [1, H]); see kernels.layer_tail."""
    dt = y.dtype
    d1 = (y.double() @ wo.double().t()).to(dt)
    s1 = (h.double() + d1.double()).to(dt)
    gu = (_normed(s1, nw1, eps1, zero_centered).double() @ wgu.double().t()).to(dt)
    g, u = gu.double().chunk(2, dim=-1)
    a = (F.silu(g) * u).to(dt)
    d2 = (a.double() @ wd.double().t()).to(dt)
    if wp is None:
        return d2, s1
    s2 = (s1.double() + d2.double()).to(dt)
    return (_normed(s2, nw2, eps2, zero_centered).double() @ wp.double().t()).to(dt), s2
