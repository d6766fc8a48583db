"""RMS norms of the Qwen3.5 family, computed in float32 and cast back to the input dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_normalize(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim (times ``weight``), in float32: one fused kernel on CUDA, where
    the unfused form costs five launches, and a decode step runs some sixty norms."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps)


class ZeroCenteredRMSNorm(nn.Module):
    """y = rms_normalize(x) * (1 + w); w starts at 0 (transformers' Qwen3_5RMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.eps, 1.0 + self.weight.float()).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """y = (w * rms_normalize(x)) * silu(z); w starts at 1 (transformers' Qwen3_5RMSNormGated, norm before gate)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, z, self.weight, self.eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(w * rms_normalize(x)) * silu(z) over the last dim, rounded to x's dtype after the norm, the weight and the
    gate (``GatedRMSNorm``; the decode kernel ``kernels.norms.gated_rms_norm`` rounds where this does)."""
    y = weight * rms_normalize(x, eps).to(x.dtype)
    return (y * F.silu(z.float())).to(x.dtype)
