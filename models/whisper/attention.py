"""Whisper attention projections, under transformers' parameter names (k_proj has no bias)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACT_FNS = {"gelu": F.gelu, "relu": F.relu}  # transformers' ACT2FN["gelu"] is the exact (erf) GELU


class Attention(nn.Module):
    """q = (x Wq + bq) / sqrt(dh), k = x Wk, v = x Wv + bv; out = a Wo + bo. Heads split the last dim."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.scaling = self.head_dim**-0.5
        # Definition order matches transformers' WhisperAttention, so state_dict() lists keys in the same order.
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.q_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., h, dh], already scaled by 1/sqrt(dh) (transformers scales q before q k^T)."""
        return (self.q_proj(x) * self.scaling).unflatten(-1, (self.n_heads, self.head_dim))

    def key_value(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[..., d] -> k, v each [..., h, dh]."""
        k = self.k_proj(x).unflatten(-1, (self.n_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.n_heads, self.head_dim))
        return k, v

    def out(self, a: torch.Tensor) -> torch.Tensor:
        """[..., h, dh] -> [..., d]."""
        return self.out_proj(a.flatten(-2))


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T) v, no mask, q pre-scaled. q, k, v [S, h, dh] -> [S, h, dh]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale=1.0)
    return out.transpose(0, 1)  # [S, h, dh]
