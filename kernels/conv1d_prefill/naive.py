"""The reference of the batched prefill conv: torch's depthwise ``F.conv1d``, then silu."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv1d_prefill_ref(xs: torch.Tensor, weight: torch.Tensor, T: int) -> torch.Tensor:
    """xs [R, K + T, C], weight [C, K] -> out[r, t, c] = silu(sum_j weight[c, j] xs[r, t + 1 + j, c]) [R, T, C]."""
    out = F.conv1d(xs.transpose(1, 2), weight[:, None, :], groups=weight.shape[0])[:, :, 1 : T + 1]  # [R, C, T]
    return F.silu(out).transpose(1, 2)
