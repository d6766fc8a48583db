"""Whisper (transformers' WhisperForConditionalGeneration) with a paged decoder: encode once, prefill, decode a step.

State is two paged pools (``models.layers.paged`` layout, page 0 the sink): ``"self"`` holds each decoder layer's
self-attention K/V and grows by one token a row per decode step (APPEND); ``"cross"`` holds each decoder layer's
projection of the encoder output, written once by ``encode`` and only read afterwards (READ).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from models.layers.paged import write_kv
from models.layers.specs import KVPoolSpec
from models.whisper.config import WhisperConfig
from models.whisper.decoder import CROSS, SELF, Decoder, PrefillChunk
from models.whisper.encoder import Encoder, sinusoids
from models.whisper.pools import PagedState, allocate_pools
from resplan.buffers import StepBuffers
from resplan.layout import StreamMode

PageIds = torch.Tensor | Sequence[int]


def _slots(pages: torch.Tensor, start: int, n: int, page_size: int) -> torch.Tensor:
    """Flat pool slots of stream positions start .. start + n - 1: pages[t // ps] * ps + t % ps. -> [n] long."""
    t = torch.arange(start, start + n, device=pages.device)
    return pages[t // page_size] * page_size + t % page_size


class _EncoderDecoder(nn.Module):
    """transformers' WhisperModel: the ``model.`` prefix of the state dict."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)


class WhisperModel(nn.Module):
    """logits = proj_out(decoder(ids | encoder(mel))); state_dict() matches WhisperForConditionalGeneration's."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = _EncoderDecoder(cfg)
        self.proj_out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_word_embeddings:
            self.proj_out.weight = self.model.decoder.embed_tokens.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """transformers' init: N(0, init_std) weights, zero biases, unit LayerNorms, sinusoid encoder positions."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Conv1d):
                m.weight.normal_(0.0, std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, std)
                if m.padding_idx is not None:
                    m.weight[m.padding_idx].zero_()
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
        pos = self.model.encoder.embed_positions.weight
        pos.copy_(sinusoids(*pos.shape))

    # -- pools ---------------------------------------------------------------------------------------------------
    def kv_pool_specs(self) -> tuple[KVPoolSpec, KVPoolSpec]:
        """Pools: "self" (decoder self-attn K/V, appended per step), "cross" (encoder K/V, written once, then read)."""
        c = self.cfg
        heads, hd = c.decoder_attention_heads, c.head_dim
        return (
            KVPoolSpec(SELF, StreamMode.APPEND, c.decoder_layers, heads, hd, c.max_target_positions),
            KVPoolSpec(CROSS, StreamMode.READ, c.decoder_layers, heads, hd, c.max_source_positions),
        )

    def allocate_state(
        self, num_pages: dict[str, int], page_size: dict[str, int], device=None, dtype: torch.dtype | None = None
    ) -> PagedState:
        """Zeroed per-layer caches for both pools: {"self": (kv per layer), "cross": (kv per layer)}."""
        w = self.proj_out.weight
        return allocate_pools(
            self.kv_pool_specs(), num_pages, page_size, device=device or w.device, dtype=dtype or w.dtype
        )

    # -- host-planned, eager -------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, state: PagedState, input_features: torch.Tensor, cross_pages: PageIds) -> int:
        """Encoder once on mel [n_mels, F]; stores K_l = enc Wk_l, V_l = enc Wv_l + bv_l of every decoder layer l
        at cross positions 0 .. S-1 of cross_pages. Returns S = (F - 1) // 2 + 1, the context length."""
        c = self.cfg
        if input_features.ndim != 2 or input_features.shape[0] != c.num_mel_bins:
            raise ValueError(f"input_features must be [{c.num_mel_bins}, frames], got {tuple(input_features.shape)}")
        n_ctx = (input_features.shape[1] - 1) // 2 + 1
        if n_ctx > c.max_source_positions:
            raise ValueError(f"{input_features.shape[1]} frames give {n_ctx} encoder tokens > {c.max_source_positions}")
        kv = state[CROSS]
        ps = kv[0].shape[2]
        pages = torch.as_tensor(cross_pages, dtype=torch.long, device=kv[0].device)
        if pages.numel() * ps < n_ctx:
            raise ValueError(f"{pages.numel()} cross pages of {ps} hold fewer than the {n_ctx} encoder tokens")
        enc = self.model.encoder(input_features.to(self.proj_out.weight.device))  # [S, d]
        slots = _slots(pages, 0, n_ctx, ps)  # [S]
        for layer, cache in zip(self.model.decoder.layers, kv, strict=True):
            k, v = layer.encoder_attn.key_value(enc)  # [S, h, dh] each
            write_kv(cache, slots, k, v)
        return n_ctx

    @torch.no_grad()
    def prefill(
        self,
        state: PagedState,
        token_ids: torch.Tensor,  # [T]
        self_pages: PageIds,
        start: int,
        cross_pages: PageIds,
        cross_len: int,
        pos_offset: int = 0,
    ) -> torch.Tensor:
        """Decoder over tokens at stream positions start .. start+T-1 (self K/V written there; causal over the
        stream, full over cross_len cross tokens), token i at position pos_offset + start + i. -> logits [T, V]."""
        c = self.cfg
        dev = self.proj_out.weight.device
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=dev)
        if ids.ndim != 1 or ids.numel() == 0:
            raise ValueError(f"token_ids must be a non-empty [T], got shape {tuple(ids.shape)}")
        T = ids.numel()
        ps, ps_cross = state[SELF][0].shape[2], state[CROSS][0].shape[2]
        pages = torch.as_tensor(self_pages, dtype=torch.long, device=dev)
        cpages = torch.as_tensor(cross_pages, dtype=torch.long, device=dev)
        if start < 0 or pages.numel() * ps < start + T:
            raise ValueError(f"{pages.numel()} self pages of {ps} cannot hold positions {start} .. {start + T - 1}")
        if cross_len < 0 or cpages.numel() * ps_cross < cross_len:
            raise ValueError(f"{cpages.numel()} cross pages of {ps_cross} cannot hold {cross_len} tokens")
        if pos_offset + start + T > c.max_target_positions or pos_offset + start < 0:
            raise ValueError(f"positions up to {pos_offset + start + T - 1} exceed {c.max_target_positions - 1}")
        chunk = PrefillChunk(pages, _slots(pages, start, T, ps), start, cpages, cross_len)
        positions = torch.arange(pos_offset + start, pos_offset + start + T, device=dev)  # [T]
        h = self.model.decoder.prefill(ids, positions, state[SELF], state[CROSS], chunk)  # [T, d]
        return self.proj_out(h)

    # -- the decode step (graph-safe) ----------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, state: PagedState, input_ids: torch.Tensor, bufs: StepBuffers) -> torch.Tensor:
        """One token a row from the static buffers: input_ids [b] -> logits [b, V]. No host sync, static shapes."""
        if bufs.positions is None:
            raise ValueError("Whisper's decoder needs StepBuffers.positions (learned positional embedding)")
        h = self.model.decoder.decode(input_ids, state[SELF], state[CROSS], bufs)  # [b, d]
        return self.proj_out(h)
