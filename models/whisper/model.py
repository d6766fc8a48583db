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

from kernels.choices import DEFAULT, KernelChoices
from models.layers.flashinfer_attention import Workspaces
from models.layers.flat import PassShape, device_array, exact_shape, flat_layout, host_array
from models.layers.paged import write_kv
from models.layers.prefill_attention import DTYPES as FLASHINFER_DTYPES
from models.layers.prefill_attention import HEAD_DIMS as PREFILL_HEAD_DIMS  # FlashInfer's paged prefill
from models.layers.prefill_attention import FlashInferPrefill
from models.layers.specs import KVPoolSpec
from models.whisper.config import WhisperConfig
from models.whisper.decoder import CROSS, SELF, Decoder, FlatPrefill
from models.whisper.encoder import Encoder, sinusoids
from models.whisper.pools import PagedState, allocate_pools
from resplan.buffers import StepBuffers
from resplan.layout import SINK_PAGE, StreamMode

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


@attrs.frozen(eq=False)
class PrefillAttention:
    """FlashInfer's paged prefill for a Whisper state: causal over each stream's self pages, full over its context's
    cross pages (read-only), each one wrapper a pass shape."""

    self_attn: FlashInferPrefill
    cross_attn: FlashInferPrefill


@attrs.frozen(eq=False)
class PrefillBatch:
    """One decoder prefill pass's device inputs (models.layers.flat): N tokens of S sequences, R of them chunks. Every
    pass of one ``key`` has the same shapes and kernels, so one captured graph serves them all."""

    ids: torch.Tensor  # [N] long
    pos: torch.Tensor  # [N] long learned positions
    flat: FlatPrefill  # what every layer reads, FlashInfer's planned wrappers included
    last: torch.Tensor  # [S - 2] long each chunk's last token
    shape: PassShape
    cross_pages: int  # entries of the cross page list
    kernels: bool  # attention on FlashInfer (CUDA), else the torch references
    chunks: int = 0  # R: logits rows past it are padding

    @property
    def key(self) -> tuple[PassShape, int, bool]:
        """What fixes the pass's shapes and kernels."""
        return self.shape, self.cross_pages, self.kernels

    @property
    def tokens(self) -> int:
        return self.shape.tokens


class _EncoderDecoder(nn.Module):
    """transformers' WhisperModel: the ``model.`` prefix of the state dict."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)


class WhisperModel(nn.Module):
    """logits = proj_out(decoder(ids | encoder(mel))); state_dict() matches WhisperForConditionalGeneration's. Whether
    a prefill pass runs FlashInfer's attention is the caller's ``KernelChoices.prefill_kernels``, passed to each
    call."""

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
        self, num_pages: dict[str, int], page_size: dict[str, int], device=None, dtype: torch.dtype | None = None,
        workspaces: Workspaces | None = None,
    ) -> PagedState:
        """Zeroed per-layer caches for both pools: {"self": (kv per layer), "cross": (kv per layer)}; where FlashInfer
        serves the shape, the prefill pass's two attentions, sharing the prefill workspace of ``workspaces`` (the
        owner's; None: a private one)."""
        w = self.proj_out.weight
        device, dtype = torch.device(device or w.device), dtype or w.dtype
        state = allocate_pools(self.kv_pool_specs(), num_pages, page_size, device=device, dtype=dtype)
        c = self.cfg
        if self.has_prefill_kernels(device, dtype):
            heads = c.decoder_attention_heads  # q is scaled by the projection (Attention.query): sm_scale 1
            ws = Workspaces(device) if workspaces is None else workspaces
            state.prefill_attention = PrefillAttention(
                FlashInferPrefill(heads, heads, c.head_dim, page_size[SELF], dtype, device, 1.0, causal=True,
                                  workspaces=ws),
                FlashInferPrefill(heads, heads, c.head_dim, page_size[CROSS], dtype, device, 1.0, causal=False,
                                  workspaces=ws))  # fmt: skip
        return state

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
        kc: KernelChoices = DEFAULT,  # the pass's kernels (prefill_kernels)
    ) -> torch.Tensor:
        """Decoder over tokens at stream positions start .. start+T-1 (self K/V written there; causal over the
        stream, full over cross_len cross tokens), token i at position pos_offset + start + i. -> logits [T, V]."""
        chunk = DecoderChunk(token_ids, self_pages, start, cross_pages, cross_len, pos_offset)
        batch = self.prefill_inputs(state, [chunk], kc=kc)
        return self.proj_out(self._hidden(state, batch))  # [T, V] (an exact pass has no padding tokens)

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
    def prefill_batch(self, state: PagedState, chunks: Sequence[DecoderChunk],
                      kc: KernelChoices = DEFAULT) -> torch.Tensor:  # fmt: skip
        """Several requests' chunks (one each) as one flat pass (``models.layers.flat``): each is ``prefill`` of its
        own, and the pass returns the logits of each chunk's last token [R, V]."""
        return self.prefill_forward(state, self.prefill_inputs(state, chunks, kc=kc))[: len(chunks)]

    def has_prefill_kernels(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether a state on ``device`` in ``dtype`` gets FlashInfer's prefill attention: CUDA, bf16 or fp16, and a
        head width FlashInfer serves."""
        return device.type == "cuda" and dtype in FLASHINFER_DTYPES and self.cfg.head_dim in PREFILL_HEAD_DIMS

    def uses_prefill_kernels(self, state: PagedState, kc: KernelChoices = DEFAULT) -> bool:
        """Whether a pass over ``state`` runs FlashInfer's paged prefill: ``kc.prefill_kernels``, or by default where
        the state has it (CUDA, bf16 or fp16, a head width FlashInfer serves); else the torch references."""
        has = getattr(state, "prefill_attention", None) is not None  # (a plain dict of pools has none)
        if kc.prefill_kernels and not has:
            raise ValueError("prefill_kernels: this state has no FlashInfer prefill attention (it needs CUDA, bf16 or "
                             f"fp16 pools and a head width in {PREFILL_HEAD_DIMS}, got {self.cfg.head_dim})")
        return has if kc.prefill_kernels is None else kc.prefill_kernels

    def prefill_inputs(self, state: PagedState, chunks: Sequence[DecoderChunk], shape: PassShape | None = None,
                       graphed: bool = False, kc: KernelChoices = DEFAULT) -> PrefillBatch:  # fmt: skip
        """The chunks checked and laid out as one pass's device inputs in ``shape`` (default: the chunks' exact
        shape), FlashInfer's two plans included (host work). ``graphed``: the pass may be captured (its plans then
        keep their grids fixed for the shape). ``kc``: the pass's kernels, resolved here into the batch's
        ``kernels``. A sequence with no context (the padding, empty ones, a chunk of cross length 0) lists the cross
        sink page once and its cross output is masked to 0."""
        dev = self.proj_out.weight.device
        ps, ps_cross = state[SELF][0].shape[2], state[CROSS][0].shape[2]
        pages = [host_array(c.self_pages) for c in chunks]
        cross = [host_array(c.cross_pages) for c in chunks]
        for c, p, x in zip(chunks, pages, cross, strict=True):  # the ids' own shape: a [T] vector
            self._check_chunk(state, np.shape(c.token_ids), p.size, c.start, x.size, c.cross_len, c.pos_offset)
        ids = [host_array(c.token_ids) for c in chunks]
        if shape is None:
            held = [-(-(c.start + len(t)) // ps) for c, t in zip(chunks, ids, strict=True)]
            shape = exact_shape([len(t) for t in ids], held)
        lay = flat_layout(ids, [c.start for c in chunks], [c.pos_offset for c in chunks], [0] * len(chunks), pages,
                          ps, shape)  # fmt: skip
        S, R = shape.seqs, len(chunks)
        cross_lens = np.zeros(S, np.int64)  # the sequences past the chunks have no context
        cross_lens[:R] = [c.cross_len for c in chunks]
        counts = np.maximum(1, -(-cross_lens // ps_cross))  # [S] no context: the sink page, once
        cross_indptr = np.concatenate([[0], np.cumsum(counts)])
        n_cross = state[CROSS][0].shape[0] + S if graphed else int(cross_indptr[-1])  # every request's pages + sinks
        cross_indices = np.full(n_cross, SINK_PAGE, np.int64)
        for r, c in enumerate(chunks):  # one slice a chunk, as flat_layout's self pages
            n = -(-c.cross_len // ps_cross)
            cross_indices[cross_indptr[r] : cross_indptr[r] + n] = cross[r][:n]
        live = cross_lens > 0  # [S]
        kernels = self.uses_prefill_kernels(state, kc)
        self_attn = cross_attn = None
        if kernels:
            i32 = np.int32
            self_attn = state.prefill_attention.self_attn.prepare(
                shape, lay.cu_seqlens, lay.kv_indptr, lay.kv_indices, lay.kv_last_page_len, graphed)
            cross_attn = state.prefill_attention.cross_attn.prepare(
                shape, lay.cu_seqlens, cross_indptr.astype(i32), cross_indices.astype(i32),
                ((np.maximum(cross_lens, 1) - 1) % ps_cross + 1).astype(i32), graphed)  # fmt: skip

        def put(a: np.ndarray, dtype=torch.int32) -> torch.Tensor:
            return device_array(a, dev, dtype)

        flat = FlatPrefill(
            write_loc=put(lay.write_loc, torch.long), cu_seqlens=put(lay.cu_seqlens), self_indptr=put(lay.kv_indptr),
            self_indices=put(lay.kv_indices), self_lens=put(lay.kv_lens), cross_indptr=put(cross_indptr),
            cross_indices=put(cross_indices), cross_lens=put(cross_lens),
            cross_live=put(live[lay.seq_of], torch.bool)[:, None, None], self_attn=self_attn, cross_attn=cross_attn,
        )  # fmt: skip
        return PrefillBatch(ids=put(lay.ids, torch.long), pos=put(lay.pos, torch.long), flat=flat,
                            last=put(lay.last, torch.long), shape=shape, cross_pages=n_cross, kernels=kernels,
                            chunks=R)  # fmt: skip

    @torch.no_grad()
    def prefill_forward(self, state: PagedState, batch: PrefillBatch) -> torch.Tensor:
        """The pass over ``batch``: the logits of each chunk's last token [S - 2, V] (rows past ``batch.chunks`` are
        padding). On FlashInfer no host sync and every shape fixed by ``batch.key``: capturable, one captured pass
        for every batch of its key (engine/prefill_graphs.py)."""
        return self.proj_out(self._hidden(state, batch)[batch.last])

    def _hidden(self, state: PagedState, batch: PrefillBatch) -> torch.Tensor:
        """The decoder's final states over the pass [N, d]."""
        return self.model.decoder.prefill_flat(batch.ids, batch.pos, state[SELF], state[CROSS], batch.flat)

    # -- the decode step (graph-safe) ----------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, state: PagedState, input_ids: torch.Tensor, bufs: StepBuffers) -> torch.Tensor:
        """One token a row from the static buffers: input_ids [b] -> logits [b, V]. No host sync, static shapes."""
        if bufs.positions is None:
            raise ValueError("Whisper's decoder needs StepBuffers.positions (learned positional embedding)")
        h = self.model.decoder.decode(input_ids, state[SELF], state[CROSS], bufs)  # [b, d]
        return self.proj_out(h)
