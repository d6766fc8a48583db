"""Whisper's text decoder on paged pools: causal self-attention on an APPEND pool, cross-attention on a READ pool."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import nn

from models.layers.paged import paged_decode_attention, write_kv
from models.layers.prefill_attention import paged_prefill_ref
from models.whisper.attention import ACT_FNS, Attention
from models.whisper.config import WhisperConfig
from resplan.buffers import StepBuffers

SELF, CROSS = "self", "cross"  # pool keys: the decode walk appends to SELF and only reads CROSS


@attrs.frozen(eq=False)
class FlatPrefill:
    """A prefill pass: one or more requests' chunks as one flat token stream (``models.layers.flat``'s sequences: the
    chunks, the padding, then empty ones), what every layer of the pass reads. N tokens, S sequences."""

    write_loc: torch.Tensor  # [N] long, flat self slot of each token
    cu_seqlens: torch.Tensor  # [S + 1] int32
    self_indptr: torch.Tensor  # [S + 1] int32, each sequence's pages in self_indices
    self_indices: torch.Tensor  # [P] int32, self pages in order
    self_lens: torch.Tensor  # [S] int32, self tokens each sequence attends over (its stream through this chunk)
    cross_indptr: torch.Tensor  # [S + 1] int32
    cross_indices: torch.Tensor  # [Pc] int32, cross pages in order
    cross_lens: torch.Tensor  # [S] int32, cross tokens stored (0: no context, the cross output is its bias only)
    cross_live: torch.Tensor  # [N, 1, 1] bool: the token's sequence has a context (else its cross attention is 0)
    self_attn: object = None  # FlashInfer's wrappers planned for this pass (models.layers.prefill_attention), or None:
    cross_attn: object = None  # the torch references


@attrs.frozen(eq=False)
class DecodeStep:
    """What every layer of a decode step reads, derived once from the StepBuffers (device ops only, no host sync)."""

    self_table: torch.Tensor  # [b, W] int32
    self_lens: torch.Tensor  # [b] int32, max(L + 1, 1): never 0, so no row makes a NaN that could reach a sink page
    write_loc: torch.Tensor  # [b] int32, flat self slot of this step's token
    cross_table: torch.Tensor  # [b, Wc] int32
    cross_lens: torch.Tensor  # [b] int32, max(seq_lens, 1): a row with no context reads the sink's slot 0 ...
    cross_live: torch.Tensor  # [b, 1, 1] bool, seq_lens > 0: ... and its attention output is then zeroed

    @classmethod
    def from_buffers(cls, bufs: StepBuffers) -> DecodeStep:
        n_cross = bufs.seq_lens[CROSS]
        return cls(
            self_table=bufs.block_tables[SELF],
            self_lens=bufs.seq_lens[SELF].clamp(min=1),
            write_loc=bufs.write_loc[SELF],
            cross_table=bufs.block_tables[CROSS],
            cross_lens=n_cross.clamp(min=1),
            cross_live=(n_cross > 0)[:, None, None],
        )


class DecoderLayer(nn.Module):
    """h += SelfAttn(LN(h)) (causal); h += CrossAttn(LN(h), enc); h += W2 act(W1 LN(h))."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = Attention(d, cfg.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = Attention(d, cfg.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.decoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = ACT_FNS[cfg.activation_function]

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        """W2 act(W1 LN(h) + b1) + b2. [..., d] -> [..., d]."""
        return self.fc2(self.act(self.fc1(self.final_layer_norm(h))))

    def prefill_flat(self, h: torch.Tensor, self_kv: torch.Tensor, cross_kv: torch.Tensor, flat: FlatPrefill):
        """h [N, d] -> [N, d] over a flat stream of chunks: every token's self K/V written first, then each sequence's
        causal self-attention over its stream and full cross-attention over its context (its bias only where it has
        none)."""
        x = self.self_attn_layer_norm(h)
        k, v = self.self_attn.key_value(x)  # [N, h, dh] each
        write_kv(self_kv, flat.write_loc, k, v)
        q = self.self_attn.query(x)  # [N, h, dh]
        if flat.self_attn is not None:
            a = flat.self_attn.run(q, self_kv)
        else:
            a = paged_prefill_ref(q, self_kv, flat.cu_seqlens, flat.self_indptr, flat.self_indices, flat.self_lens,
                                  1.0)  # fmt: skip
        h = h + self.self_attn.out(a)

        q = self.encoder_attn.query(self.encoder_attn_layer_norm(h))  # [N, h, dh]
        if flat.cross_attn is not None:  # (a sequence with no context attends over the sink's slot 0: masked below)
            a = flat.cross_attn.run(q, cross_kv)
        else:
            a = paged_prefill_ref(q, cross_kv, flat.cu_seqlens, flat.cross_indptr, flat.cross_indices,
                                  flat.cross_lens, 1.0, causal=False)  # fmt: skip
        h = h + self.encoder_attn.out(torch.where(flat.cross_live, a, 0.0))
        return h + self._mlp(h)

    def decode(self, h: torch.Tensor, self_kv: torch.Tensor, cross_kv: torch.Tensor, step: DecodeStep) -> torch.Tensor:
        """h [b, d] -> [b, d]; one token a row: append its self K/V at write_loc, attend over self_lens tokens."""
        x = self.self_attn_layer_norm(h)
        k, v = self.self_attn.key_value(x)  # [b, h, dh] each
        write_kv(self_kv, step.write_loc, k, v)
        q = self.self_attn.query(x)  # [b, h, dh]
        a = paged_decode_attention(q, self_kv, step.self_table, step.self_lens, scale=1.0)
        h = h + self.self_attn.out(a)

        q = self.encoder_attn.query(self.encoder_attn_layer_norm(h))  # [b, h, dh]
        a = paged_decode_attention(q, cross_kv, step.cross_table, step.cross_lens, scale=1.0)
        a = torch.where(step.cross_live, a, 0.0)  # [b, h, dh]
        h = h + self.encoder_attn.out(a)
        return h + self._mlp(h)


class Decoder(nn.Module):
    """hidden = LN(layers(E_tok[ids] + E_pos[positions])): token ids -> final decoder states."""

    def __init__(self, cfg: WhisperConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_token_id)
        self.embed_positions = nn.Embedding(cfg.max_target_positions, d)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.decoder_layers)])
        self.layer_norm = nn.LayerNorm(d)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[n] ids, [n] positions -> [n, d] (Whisper does not scale token embeddings)."""
        return self.embed_tokens(ids.long()) + self.embed_positions(positions.long())

    def prefill_flat(
        self,
        ids: torch.Tensor,  # [N]
        positions: torch.Tensor,  # [N]
        self_kv: Sequence[torch.Tensor],
        cross_kv: Sequence[torch.Tensor],
        flat: FlatPrefill,
    ) -> torch.Tensor:
        """-> final states [N, d] of a flat pass."""
        h = self.embed(ids, positions)
        for layer, ks, kc in zip(self.layers, self_kv, cross_kv, strict=True):
            h = layer.prefill_flat(h, ks, kc, flat)
        return self.layer_norm(h)

    def decode(
        self, ids: torch.Tensor, self_kv: Sequence[torch.Tensor], cross_kv: Sequence[torch.Tensor], bufs: StepBuffers
    ) -> torch.Tensor:
        """ids [b] at bufs.positions -> final states [b, d]."""
        step = DecodeStep.from_buffers(bufs)
        h = self.embed(ids, bufs.positions)
        for layer, ks, kc in zip(self.layers, self_kv, cross_kv, strict=True):
            h = layer.decode(h, ks, kc, step)
        return self.layer_norm(h)
