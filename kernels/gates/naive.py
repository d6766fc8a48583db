"""References of the elementwise gate kernels: float32 math, one rounding to the output dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_ref(gu, out=None):
    """silu(gate) * up on the halves of gu [n, 2I], in float32, cast once."""
    g, u = gu.float().chunk(2, dim=-1)
    y = (F.silu(g) * u).to(gu.dtype)
    return y if out is None else out.copy_(y)


def sigmoid_gate_mul_ref(o, qkv, out=None):
    """o [n, H, D] * sigmoid(gate) with head h's gate at qkv[:, h * 2D + D : (h + 1) * 2D], flattened."""
    n, H, D = o.shape
    gate = qkv[:, : H * 2 * D].reshape(n, H, 2 * D)[..., D:]
    y = (o.float() * torch.sigmoid(gate.float())).to(o.dtype).reshape(n, H * D)
    return y if out is None else out.copy_(y)
