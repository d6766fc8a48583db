"""RMS norms in plain torch (float32 math, cast back to the input dtype), and the references of the fused decode
step's norm kernels built from them. The model's norms (``models.layers.norms``) are this math."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_normalize(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim (times ``weight``), in float32: one fused kernel on CUDA, where
    the unfused form costs five launches, and a decode step runs some sixty norms."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(w * rms_normalize(x)) * silu(z) over the last dim, rounded to x's dtype after the norm, the weight and the
    gate (the decode kernel rounds where this does)."""
    y = weight * rms_normalize(x, eps).to(x.dtype)
    return (y * F.silu(z.float())).to(x.dtype)


# -- references of the kernels (kernel.py) ---------------------------------------------------------------------------


def add_rms_norm_ref(h, delta, weight, eps, *, zero_centered=True, out=None):
    """h += delta (in h's dtype), then rms_normalize(h) * (1 + w) (or * w), cast to h's dtype."""
    if delta is not None:
        h.copy_(h + delta)
    w = 1.0 + weight.float() if zero_centered else weight.float()
    y = rms_normalize(h, eps, w).to(h.dtype)
    return y if out is None else out.copy_(y)


def gated_rms_norm_ref(o, z, weight, eps, out=None):
    """GatedRMSNorm(o, z) per head, flattened: [n, H * D] in weight's dtype."""
    n, H, D = o.shape
    y = gated_rms_norm(o.to(weight.dtype), z.reshape(n, H, D), weight, eps).reshape(n, H * D)
    return y if out is None else out.copy_(y)
