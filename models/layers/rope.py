"""Rotary position embedding on the leading ``rotary_dim`` channels of each head (NeoX half-rotation).

Qwen3.5's text model uses interleaved M-RoPE, but for text every section sees the same position, so the result is
plain RoPE with ``inv_freq[i] = theta^(-2i / rotary_dim)`` on the first ``rotary_dim`` channels.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.attention_prep.naive import apply_partial_rope as apply_partial_rope
from kernels.attention_prep.naive import rotate_half as rotate_half


class PartialRotary(nn.Module):
    """Holds inv_freq (non-persistent, like transformers) and turns positions into (cos, sin)."""

    def __init__(self, head_dim: int, rotary_dim: int, theta: float) -> None:
        super().__init__()
        if rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be even and <= head_dim, got {rotary_dim} for head_dim {head_dim}")
        self.rotary_dim = rotary_dim
        self._inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))  # [r/2]
        self.register_buffer("inv_freq", self._inv_freq.clone(), persistent=False)

    def _apply(self, fn, recurse=True):
        """Follow .to(device) but stay float32 under .to(dtype): reload the CPU-computed values on the new device."""
        super()._apply(fn, recurse)
        self.inv_freq = self._inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [n] int -> cos, sin [n, rotary_dim]: angle = pos * inv_freq, repeated for both halves."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [n, rot/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [n, rot]
        return emb.cos().to(dtype), emb.sin().to(dtype)
