"""Whisper's audio encoder, dense and eager: two convolutions, sinusoid positions, pre-LN transformer layers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.whisper.attention import ACT_FNS, Attention, dense_attention
from models.whisper.config import WhisperConfig


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """[length, channels]: [sin(t w_i), cos(t w_i)] with w_i = max_timescale^(-i / (channels/2 - 1))."""
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]  # [length, channels/2]
    return torch.cat([t.sin(), t.cos()], dim=1)


class EncoderLayer(nn.Module):
    """h += Attn(LN(h)); h += W2 act(W1 LN(h))."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = Attention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = ACT_FNS[cfg.activation_function]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [S, d] -> [S, d]."""
        x = self.self_attn_layer_norm(h)
        k, v = self.self_attn.key_value(x)
        h = h + self.self_attn.out(dense_attention(self.self_attn.query(x), k, v))
        h = h + self.fc2(self.act(self.fc1(self.final_layer_norm(h))))
        if h.dtype == torch.float16:  # transformers clamps fp16 encoder activations to stay finite
            big = torch.finfo(h.dtype).max - 1000
            h = h.clamp(-big, big)
        return h


class Encoder(nn.Module):
    """enc = LN(layers(gelu(conv2(gelu(conv1(mel)))) + pos)): mel [n_mels, F] -> [S, d], S = (F - 1) // 2 + 1."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.conv1 = nn.Conv1d(cfg.num_mel_bins, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, d)
        self.embed_positions.requires_grad_(False)
        self.layers = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.encoder_layers)])
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [n_mels, F] -> encoder states [S, d]. transformers insists on F = 2 * max_source_positions;
        a shorter F is accepted here and uses positions 0 .. S-1."""
        x = features.to(self.conv1.weight.dtype)[None]  # [1, n_mels, F]
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))[0].transpose(0, 1)  # [S, d]
        h = x + self.embed_positions.weight[: x.shape[0]]
        for layer in self.layers:
            h = layer(h)
        return self.layer_norm(h)
