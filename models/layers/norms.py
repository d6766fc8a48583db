"""RMS norms of the Qwen3.5 family, computed in float32 and cast back to the input dtype."""

from __future__ import annotations

import torch
from torch import nn

from kernels.norms.naive import gated_rms_norm as gated_rms_norm
from kernels.norms.naive import rms_normalize as rms_normalize


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
