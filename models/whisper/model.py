"""Whisper (transformers' WhisperForConditionalGeneration) with a paged decoder: encode once, prefill, decode a step.

State is two paged pools (``models.layers.paged`` layout, page 0 the sink): ``"self"`` holds each decoder layer's
self-attention K/V and grows by one token a row per decode step (APPEND); ``"cross"`` holds each decoder layer's
projection of the encoder output, written once by ``encode`` and only read afterwards (READ).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch
from torch import nn

from models.layers.flat import exact_shape, flat_layout, host_array
from models.layers.paged import write_kv
from models.layers.specs import KVPoolSpec
from models.whisper.config import WhisperConfig
from models.whisper.decoder import CROSS, SELF, Decoder, FlatPrefill
from models.whisper.encoder import Encoder, sinusoids
from models.whisper.pools import PagedState, allocate_pools
from resplan.buffers import StepBuffers
from resplan.layout import StreamMode

PageIds = torch.Tensor | Sequence[int]


def _slots(pages: torch.Tensor, start: int, n: int, page_size: int) -> torch.Tensor:
    """Flat pool slots of stream positions start .. start + n - 1: pages[t // ps] * ps + t % ps. -> [n] long."""
    t = torch.arange(start, start + n, device=pages.device)
    return pages[t // page_size] * page_size + t % page_size


@attrs.frozen(eq=False)
class DecoderChunk:
    """One request's chunk of decoder tokens in a batched prefill (``WhisperModel.prefill_batch``)."""

    token_ids: PageIds  # [T]
    self_pages: PageIds  # the request's self pages in order, covering start + T tokens
    start: int  # stream position of the first token
    cross_pages: PageIds  # the request's cross pages in order
    cross_len: int  # cross tokens stored (0: no context)
    pos_offset: int = 0  # token i sits at position pos_offset + start + i


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
        h, _ = self._flat_pass(state, [DecoderChunk(token_ids, self_pages, start, cross_pages, cross_len, pos_offset)])
        return self.proj_out(h)  # [T, V]

    def _check_chunk(self, state: PagedState, ids_shape, n_pages: int, start: int, n_cross_pages: int,
                     cross_len: int, pos_offset: int) -> None:  # fmt: skip
        """Refuses a chunk its pages, context or positions cannot hold, by name."""
        if len(ids_shape) != 1 or ids_shape[0] == 0:
            raise ValueError(f"token_ids must be a non-empty [T], got shape {tuple(ids_shape)}")
        T = ids_shape[0]
        ps, ps_cross = state[SELF][0].shape[2], state[CROSS][0].shape[2]
        if start < 0 or n_pages * ps < start + T:
            raise ValueError(f"{n_pages} self pages of {ps} cannot hold positions {start} .. {start + T - 1}")
        if cross_len < 0 or n_cross_pages * ps_cross < cross_len:
            raise ValueError(f"{n_cross_pages} cross pages of {ps_cross} cannot hold {cross_len} tokens")
        if pos_offset + start + T > self.cfg.max_target_positions or pos_offset + start < 0:
            raise ValueError(f"positions up to {pos_offset + start + T - 1} exceed {self.cfg.max_target_positions - 1}")

    @torch.no_grad()
    def prefill_batch(self, state: PagedState, chunks: Sequence[DecoderChunk]) -> torch.Tensor:
        """Several requests' chunks (one each) as one flat pass (``models.layers.flat``): each is ``prefill`` of its
        own, and the pass returns the logits of each chunk's last token [R, V]."""
        h, last = self._flat_pass(state, chunks)
        return self.proj_out(h[last])

    def _flat_pass(self, state: PagedState, chunks: Sequence[DecoderChunk]) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder over the chunks laid out as one flat stream: final states [N, d] and each chunk's last token
        [R]."""
        dev = self.proj_out.weight.device
        ps, ps_cross = state[SELF][0].shape[2], state[CROSS][0].shape[2]
        pages = [host_array(c.self_pages) for c in chunks]
        cross = [host_array(c.cross_pages) for c in chunks]
        for c, p, x in zip(chunks, pages, cross, strict=True):  # the ids' own shape: a [T] vector
            self._check_chunk(state, np.shape(c.token_ids), p.size, c.start, x.size, c.cross_len, c.pos_offset)
        ids = [host_array(c.token_ids) for c in chunks]
        held = [-(-(c.start + len(t)) // ps) for c, t in zip(chunks, ids, strict=True)]
        shape = exact_shape([len(t) for t in ids], held)
        lay = flat_layout(ids, [c.start for c in chunks], [c.pos_offset for c in chunks], [0] * len(chunks), pages,
                          ps, shape)  # fmt: skip
        cross_lens = np.zeros(shape.seqs, np.int64)  # the two empty sequences past the chunks have no context
        cross_lens[: len(chunks)] = [c.cross_len for c in chunks]
        used = [x[: -(-c.cross_len // ps_cross)] for c, x in zip(chunks, cross, strict=True)]
        counts = np.zeros(shape.seqs, np.int64)
        counts[: len(chunks)] = [u.size for u in used]

        def put(a: np.ndarray, dtype=torch.int32) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev, dtype)

        flat = FlatPrefill(
            write_loc=put(lay.write_loc, torch.long), cu_seqlens=put(lay.cu_seqlens), self_indptr=put(lay.kv_indptr),
            self_indices=put(lay.kv_indices), self_lens=put(lay.kv_lens),
            cross_indptr=put(np.concatenate([[0], np.cumsum(counts)])),
            cross_indices=put(np.concatenate([*used, np.zeros(1, np.int64)])), cross_lens=put(cross_lens),
        )  # fmt: skip
        h = self.model.decoder.prefill_flat(put(lay.ids, torch.long), put(lay.pos, torch.long), state[SELF],
                                            state[CROSS], flat)  # fmt: skip
        return h, put(lay.last[: len(chunks)], torch.long)

    # -- the decode step (graph-safe) ----------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, state: PagedState, input_ids: torch.Tensor, bufs: StepBuffers) -> torch.Tensor:
        """One token a row from the static buffers: input_ids [b] -> logits [b, V]. No host sync, static shapes."""
        if bufs.positions is None:
            raise ValueError("Whisper's decoder needs StepBuffers.positions (learned positional embedding)")
        h = self.model.decoder.decode(input_ids, state[SELF], state[CROSS], bufs)  # [b, d]
        return self.proj_out(h)
