"""Qwen3.5 text model (transformers' Qwen3_5ForCausalLM) on paged KV pools and slotted recurrent pools.

h = embed(ids); per layer h += mixer(norm1(h)) with mixer = Gated DeltaNet or gated attention, then
h += mlp(norm2(h)); logits = lm_head(norm(h)). ``state_dict`` keys and shapes equal transformers'.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from kernels.choices import DEFAULT, KernelChoices
from kernels.gates import silu_mul
from kernels.gdn_prefill import STATE_PASS_KEY_DIMS
from kernels.norms import add_rms_norm_
from models.layers.flashinfer_attention import Workspaces
from models.layers.flat import HostStaging, PassShape, device_array, exact_shape, flat_layout, host_array
from models.layers.fused import PendingNorm, Residual, decode_linear
from models.layers.mlp import SwiGLU
from models.layers.norms import ZeroCenteredRMSNorm
from models.layers.prefill_attention import DTYPES as PREFILL_KERNEL_DTYPES
from models.layers.prefill_attention import HEAD_DIMS as PREFILL_HEAD_DIMS
from models.layers.prefill_attention import FlashInferPrefill
from models.layers.rope import PartialRotary
from models.layers.specs import KVPoolSpec, RecurrentSpec
from models.qwen3_5.attention import GatedAttention
from models.qwen3_5.config import LINEAR, Qwen35Config
from models.qwen3_5.linear_attention import GatedDeltaNet
from models.qwen3_5.state import Qwen35State
from resplan.layout import StreamMode

KV_POOL = "kv"  # the one KV pool: every full-attention layer pages through it with the same block table


@attrs.frozen
class PrefillChunk:
    """One request's chunk for ``prefill_batch``: tokens start .. start+T-1 of its stream, as ``prefill`` takes them."""

    token_ids: torch.Tensor | Sequence[int]  # [T]
    pages: torch.Tensor | Sequence[int]  # [n] the request's KV pages in order
    start: int
    rec_slot: int
    pos_offset: int = 0
    saves: tuple[tuple[int, int], ...] = ()  # (p, slot): slot gets the GDN state after positions 0..p-1 (flat.py)


@attrs.frozen
class PrefillBatch:
    """One prefill pass's device inputs (models.layers.flat): N tokens of S sequences, R of them chunks. Every
    pass of one ``key`` has the same shapes and kernels, so one captured graph serves them all."""

    ids: torch.Tensor  # [N] long
    pos: torch.Tensor  # [N] long rotary positions
    write_loc: torch.Tensor  # [N] long flat K/V slot of each token
    seq_of: torch.Tensor  # [N] int32 each token's sequence
    cu_seqlens: torch.Tensor  # [S + 1] int32
    slots: torch.Tensor  # [S] long recurrent slots (the sink past the chunks)
    fresh: torch.Tensor  # [S] bool: starts its stream
    last: torch.Tensor  # [S - 2] long each chunk's last token
    chunk_indices: torch.Tensor  # [rows, 2] int32 fla's chunk index
    chunk_offsets: torch.Tensor  # [S + 1] int32
    kv_indptr: torch.Tensor  # [S + 1] int32 (the torch attention's; FlashInfer's plan has its own copy)
    kv_indices: torch.Tensor  # [P] int32
    kv_lens: torch.Tensor  # [S] int32
    # the saves (None, all three: a state allocated without saving)
    save_slot: torch.Tensor | None  # [rows] long slot receiving the GDN state entering each chunk row (0: none)
    save_at: torch.Tensor | None  # [rows] long flat index of that row's first token (the conv state is the K before it)
    final_slot: torch.Tensor | None  # [S] long slot receiving each sequence's final GDN state too (0: none)
    shape: PassShape
    kernels: bool  # the mixers on fla-core and FlashInfer (CUDA), else their torch references
    fused: bool  # the row-wise work and the conv on our Triton kernels (norms, RoPE + K/V write, gates), else torch
    attn: object = None  # the FlashInfer wrapper planned for this pass (kernels only)
    chunks: int = 0  # R: logits rows past it are padding

    @property
    def key(self) -> tuple[PassShape, bool, bool]:
        """What fixes the pass's shapes and kernels."""
        return self.shape, self.kernels, self.fused

    @property
    def tokens(self) -> int:
        return self.shape.tokens


# PrefillBatch's index arrays, as ``flat_layout`` names them (the saves' only where the state saves)
_BATCH_ARRAYS = ("ids", "pos", "write_loc", "seq_of", "cu_seqlens", "slots", "fresh", "last", "chunk_indices",
                 "chunk_offsets", "kv_indptr", "kv_indices", "kv_lens")  # fmt: skip
_SAVE_ARRAYS = ("save_slot", "save_at", "final_slot")


def _check_chunk(state: Qwen35State, T: int, n_pages: int, start: int, rec_slot: int) -> None:
    """A prefill chunk's arguments, refused with the reason."""
    if T == 0 or start < 0:
        raise ValueError(f"prefill needs T >= 1 tokens and start >= 0, got T={T}, start={start}")
    if n_pages * state.page_size < start + T:
        raise ValueError(f"{n_pages} pages of {state.page_size} cannot hold {start + T} tokens")
    if not 0 < rec_slot < state.num_slots:
        raise ValueError(f"rec_slot must be in 1..{state.num_slots - 1} (0 is the sink), got {rec_slot}")


class DecoderLayer(nn.Module):
    """Pre-norm block: h += mixer(input_layernorm(h)); h += mlp(post_attention_layernorm(h))."""

    def __init__(self, cfg: Qwen35Config, layer_type: str) -> None:
        super().__init__()
        self.is_linear = layer_type == LINEAR
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class Qwen35Backbone(nn.Module):
    """transformers' Qwen3_5TextModel parameters: embed_tokens, layers, norm."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


def prefill_kernel_refusal(cfg: Qwen35Config) -> str | None:
    """Why a model of ``cfg`` has no prefill kernels for its head shapes (None: it has): the GDN state pass takes key
    heads of ``STATE_PASS_KEY_DIMS``, FlashInfer's paged prefill the head widths of its ``HEAD_DIMS``."""
    if cfg.linear_key_head_dim not in STATE_PASS_KEY_DIMS:
        return (f"the GDN state pass takes key heads of {' or '.join(map(str, STATE_PASS_KEY_DIMS))}, not "
                f"{cfg.linear_key_head_dim}")  # fmt: skip
    if cfg.head_dim not in PREFILL_HEAD_DIMS:
        return f"FlashInfer's paged prefill takes heads of {PREFILL_HEAD_DIMS}, not {cfg.head_dim}"
    return None


class Qwen35Model(nn.Module):
    """Qwen3.5 causal LM with host-planned ``prefill`` (one request's chunk; ``prefill_batch``: several requests', one
    chunk each) and graph-safe batched ``decode``. Which kernels each takes is the caller's ``KernelChoices``
    (``fused_decode``, ``prefill_kernels``, ``prefill_fused``), passed to every call."""

    tp = None  # this rank's models.qwen3_5.tp.TensorParallel when the model is one shard of a tensor-parallel group

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Qwen35Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = PartialRotary(cfg.head_dim, cfg.rotary_dim, cfg.rope_theta)  # no state_dict entries
        self._pool_index = {layer: i for i, layer in enumerate(cfg.full_layers)}
        self._pool_index.update({layer: i for i, layer in enumerate(cfg.linear_layers)})

    # -- pools -------------------------------------------------------------------------------------------------------
    def kv_pool_specs(self) -> tuple[KVPoolSpec, ...]:
        """One paged pool, "kv", shared by every full-attention layer, appended to by decode."""
        c = self.cfg
        return (KVPoolSpec(KV_POOL, StreamMode.APPEND, len(c.full_layers), c.num_key_value_heads, c.head_dim,
                           c.max_position_embeddings),)  # fmt: skip

    def recurrent_specs(self, ssm_dtype: torch.dtype = torch.float32) -> tuple[RecurrentSpec, ...]:
        """Per GDN layer: conv state (conv_dim, K) and SSM state (hv, dk, dv) in ``ssm_dtype``."""
        c = self.cfg
        conv = (c.conv_dim, c.linear_conv_kernel_dim)
        ssm = (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
        return tuple(RecurrentSpec(layer, conv, ssm, ssm_dtype) for layer in c.linear_layers)

    def allocate_state(
        self, num_pages: int, page_size: int, num_rec_slots: int, device: torch.device | str, dtype: torch.dtype,
        workspaces: Workspaces | None = None,
        saving: bool = False,
        ssm_dtype: torch.dtype = torch.float32,
    ) -> Qwen35State:
        """Zeroed pools: KV [num_pages, 2, page_size, hk, d] per attention layer, conv (in ``dtype``) and SSM (in
        ``ssm_dtype``; its math is float32 either way) slots per GDN layer, each kind one tensor over the layers.
        On CUDA in 16 bits also the prefill pass's FlashInfer attention, its workspace taken from ``workspaces``
        (the owner's; None: a private one)."""
        if num_pages < 2 or num_rec_slots < 2:
            raise ValueError("need >= 2 pages and >= 2 recurrent slots (page 0 and slot 0 are sinks)")
        (kv_spec,) = self.kv_pool_specs()
        kv = kv_spec.allocate_stacked(num_pages, page_size, device=device, dtype=dtype)
        rec = self.recurrent_specs(ssm_dtype)
        specs = {attrs.evolve(s, layer=0) for s in rec}  # every GDN layer's pools alike: one tensor a kind
        if len(specs) != 1:
            raise ValueError(f"the GDN layers' state shapes differ or there are none: {sorted(map(str, specs))}")
        (spec,) = specs
        conv = torch.zeros(len(rec), num_rec_slots, *spec.conv_shape, dtype=dtype, device=device)
        ssm = torch.zeros(len(rec), num_rec_slots, *spec.ssm_shape, dtype=spec.ssm_dtype, device=device)
        attn = None
        if torch.device(device).type == "cuda" and dtype in PREFILL_KERNEL_DTYPES:
            c = self.cfg
            attn = FlashInferPrefill(c.num_attention_heads, c.num_key_value_heads, c.head_dim, page_size, dtype, device,
                                     c.head_dim**-0.5, workspaces=workspaces)  # fmt: skip
        staging = HostStaging(device) if torch.device(device).type == "cuda" else None
        return Qwen35State(kv, conv, ssm, page_size=page_size, num_pages=num_pages, num_slots=num_rec_slots,
                           saving=saving, prefill_attention=attn, staging=staging)  # fmt: skip

    # -- forward -----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(
        self,
        state: Qwen35State,
        token_ids: torch.Tensor | Sequence[int],  # [T]
        pages: torch.Tensor | Sequence[int],  # [n] the request's KV pages in order
        start: int,  # tokens already stored (0 for the first chunk)
        rec_slot: int,
        pos_offset: int = 0,
        kc: KernelChoices = DEFAULT,  # the pass's kernels (prefill_kernels, prefill_fused)
        saves: Sequence[tuple[int, int]] = (),  # (p, slot) saves of the GDN state (PrefillChunk.saves)
    ) -> torch.Tensor:
        """One request's chunk, eager: logits [T, V]. Writes its K/V and leaves the GDN state in ``rec_slot`` (and
        in the save slots, ``saves``)."""
        chunk = PrefillChunk(token_ids, pages, start, rec_slot, pos_offset, tuple(saves))
        h = self._prefill_pass(state, self.prefill_inputs(state, [chunk], kc=kc))
        return self.lm_head(self.model.norm(h))  # [T, V]

    @torch.inference_mode()  # cheaper per operation than no_grad: prefill dispatches thousands
    def prefill_batch(self, state: Qwen35State, chunks: Sequence[PrefillChunk],
                      kc: KernelChoices = DEFAULT) -> torch.Tensor:  # fmt: skip
        """Several requests' chunks in one eager pass, each as ``prefill`` runs it: the logits of each chunk's last
        token [R, V]. Requests (their recurrent slots) must be distinct."""
        return self.prefill_forward(state, self.prefill_inputs(state, chunks, kc=kc))[: len(chunks)]

    def prefill_inputs(self, state: Qwen35State, chunks: Sequence[PrefillChunk], shape: PassShape | None = None,
                       graphed: bool = False, kc: KernelChoices = DEFAULT) -> PrefillBatch:  # fmt: skip
        """The chunks checked and laid out as one pass's device inputs in ``shape`` (default: the chunks' exact
        shape), FlashInfer's plan included (host work: the only part that reads them). ``graphed``: the pass may be
        captured (FlashInfer's plan then keeps its grid fixed for the shape). ``kc``: the pass's kernels, resolved
        here into the batch's ``kernels`` and ``fused`` (what ``prefill_forward`` reads)."""
        device = self.lm_head.weight.device
        ps = state.page_size
        for c in chunks:
            _check_chunk(state, len(c.token_ids), len(c.pages), c.start, c.rec_slot)
        if len({c.rec_slot for c in chunks}) != len(chunks):
            raise ValueError("prefill_batch: two chunks of one recurrent slot (one chunk a request a pass)")
        for r, c in enumerate(chunks):
            for p, slot in c.saves:
                if not 0 < slot < state.num_slots:
                    raise ValueError(f"chunk {r}: a save at p={p} into slot {slot}, not in 1..{state.num_slots - 1}")
        ids = [host_array(c.token_ids) for c in chunks]
        pages = [host_array(c.pages) for c in chunks]
        if shape is None:
            held = [-(-(c.start + len(t)) // ps) for c, t in zip(chunks, ids, strict=True)]
            shape = exact_shape([len(t) for t in ids], held)
        if not state.saving and any(c.saves for c in chunks):
            raise ValueError("saves in a pass over a state allocated with saving=False")
        lay = flat_layout(ids, [c.start for c in chunks], [c.pos_offset for c in chunks],
                          [c.rec_slot for c in chunks], pages, ps, shape,
                          [c.saves for c in chunks] if state.saving else None)  # fmt: skip
        kernels = self.uses_prefill_kernels(kc)
        if kernels and state.prefill_attention is None:
            raise ValueError("prefill kernels need a state allocated on CUDA (its FlashInfer prefill attention)")
        attn = None
        if kernels:
            attn = state.prefill_attention.prepare(shape, lay.cu_seqlens, lay.kv_indptr, lay.kv_indices,
                                                   lay.kv_last_page_len, graphed)  # fmt: skip

        names = _BATCH_ARRAYS + (_SAVE_ARRAYS if state.saving else ())
        arrays = [getattr(lay, n) for n in names]
        up = (state.staging.up(arrays) if state.staging is not None
              else [device_array(a, device) for a in arrays])  # fmt: skip
        fields = dict.fromkeys(_SAVE_ARRAYS) | dict(zip(names, up, strict=True))  # (no saves: None)
        return PrefillBatch(**fields, shape=shape, kernels=kernels, fused=self.uses_prefill_fused(kc), attn=attn,
                            chunks=lay.chunks)  # fmt: skip

    @torch.inference_mode()
    def prefill_forward(self, state: Qwen35State, batch: PrefillBatch) -> torch.Tensor:
        """The pass over ``batch``: the logits of each chunk's last token [S - 2, V] (rows past ``batch.chunks`` are
        padding). No host sync on the kernels' path, every shape fixed by ``batch.key``: capturable, and one captured
        pass serves every batch of its key (engine/prefill_graphs.py)."""
        h = self._prefill_pass(state, batch)
        return self.lm_head(self.model.norm(h[batch.last]))  # [S - 2, V]

    @torch.inference_mode()
    def prefill_hidden(self, state: Qwen35State, batch: PrefillBatch) -> torch.Tensor:
        """The pass over ``batch`` as ``prefill_forward`` runs it: every token's final hidden state, normed [N,
        hidden] (``lm_head`` of a row is its logits; ``prefill_forward``'s are those of ``batch.last``)."""
        return self.model.norm(self._prefill_pass(state, batch))

    def _prefill_pass(self, state: Qwen35State, batch: PrefillBatch) -> torch.Tensor:
        """The layers over the flat stream: row-wise work over all N tokens; the conv, delta rule and attention per
        sequence (varlen kernels). Returns the final hidden states [N, hidden] (before the last norm)."""
        h = self.model.embed_tokens(batch.ids)  # [N, hidden]
        cos, sin = self.rotary(batch.pos, h.dtype)  # [N, rot]
        if batch.fused:
            return self._prefill_layers_fused(state, batch, h, cos, sin)
        for i, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(h)
            j = self._pool_index[i]
            if layer.is_linear:
                h = h + self._reduce(layer.linear_attn.prefill(x, state.conv[j], state.ssm[j], batch))
            else:
                h = h + self._reduce(layer.self_attn.prefill(x, state.kv[j], cos, sin, batch, state.prefill_attention))
            h = h + self._reduce(layer.mlp.forward_one_gemm(layer.post_attention_layernorm(h)))
        return h

    def _prefill_layers_fused(self, state, batch, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``_prefill_pass``'s layers with each residual add folded into the next norm (add_rms_norm_, in place on
        h) and silu_mul one kernel: the row-wise work of a pass in Triton, as the decode step has it. [N, hidden]."""
        delta = None  # the last sublayer's output, added into h by the next norm
        for i, layer in enumerate(self.model.layers):
            ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
            x = add_rms_norm_(h, delta, ln1.weight, ln1.eps, pdl=False)  # delta reduced already
            j = self._pool_index[i]
            if layer.is_linear:
                delta = layer.linear_attn.prefill(x, state.conv[j], state.ssm[j], batch)
            else:
                delta = layer.self_attn.prefill(x, state.kv[j], cos, sin, batch, state.prefill_attention)
            x = add_rms_norm_(h, self._reduce(delta), ln2.weight, ln2.eps, pdl=False)
            gate_up = F.linear(x, layer.mlp.gate_up_weight())
            delta = self._reduce(F.linear(silu_mul(gate_up, pdl=False), layer.mlp.down_proj.weight))
        return h.add_(delta)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """A sublayer's output summed over the tensor-parallel ranks (each holds a row-parallel output projection's
        share), in place; x itself on one rank."""
        return x if self.tp is None else self.tp.all_reduce(x)

    def uses_prefill_fused(self, kc: KernelChoices = DEFAULT) -> bool:
        """Whether prefill's row-wise work runs our Triton kernels: ``kc.prefill_fused``, or by default where the
        weights are on CUDA."""
        return self.lm_head.weight.is_cuda if kc.prefill_fused is None else kc.prefill_fused

    def uses_prefill_kernels(self, kc: KernelChoices = DEFAULT) -> bool:
        """Whether prefill runs the CUDA kernels (fla, FlashInfer, the Triton conv): ``kc.prefill_kernels``, or by
        default where the weights are on CUDA in bf16 or fp16 (FlashInfer's paged prefill has no float32 kernels, so
        a float32 model prefills on the torch references; asking for the kernels there is refused)."""
        w = self.lm_head.weight
        shapes = self.prefill_kernel_refusal()
        if kc.prefill_kernels is None:
            return w.is_cuda and w.dtype in PREFILL_KERNEL_DTYPES and shapes is None
        if kc.prefill_kernels and w.dtype not in PREFILL_KERNEL_DTYPES:
            raise ValueError(f"prefill_kernels needs bf16 or fp16 weights (FlashInfer's paged prefill), not {w.dtype}")
        if kc.prefill_kernels and shapes is not None:
            raise ValueError(f"prefill_kernels: {shapes}")
        return kc.prefill_kernels

    def prefill_kernel_refusal(self) -> str | None:
        """Why this model's head shapes have no prefill kernels (None: they have; ``prefill_kernel_refusal``)."""
        return prefill_kernel_refusal(self.cfg)

    def fuse_projections(self) -> Qwen35Model:
        """Fuse each layer's same-input projections into one weight (views; see models.layers.fused). Call after
        ``.to(device, dtype)`` and before capturing a graph of the fused decode."""
        for layer in self.model.layers:
            if layer.is_linear:
                layer.linear_attn.in_weight()
            else:
                layer.self_attn.qkv_weight()
            layer.mlp.gate_up_weight()
        return self

    def uses_fused_decode(self, kc: KernelChoices = DEFAULT) -> bool:
        """Whether ``decode`` runs the fused Triton step: ``kc.fused_decode``, or by default where CUDA runs it."""
        return self.lm_head.weight.is_cuda if kc.fused_decode is None else kc.fused_decode

    @torch.no_grad()
    def decode(self, state: Qwen35State, input_ids: torch.Tensor, bufs, attn=None,
               kc: KernelChoices = DEFAULT) -> torch.Tensor:  # fmt: skip
        """One token a row from the static StepBuffers (pool "kv", positions, recurrent_slots): logits [b, V].
        ``attn``: the bucket's decode attention (FlashInfer XQA / fa2 on the GPU); None = plain torch. ``kc``: the
        step's kernels: the fused Triton step or plain torch (``fused_decode``), and the forms the fused step's kernels
        take (folds, PDL, the weight stream; ``kernels.choices``).

        CUDA-graph safe: no host sync, no data-dependent shapes; padding rows hit the sink page and sink slot.
        """
        if self.uses_fused_decode(kc):
            return self._decode_fused(state, input_ids, bufs, attn, kc)
        block_table, seq_lens = bufs.block_tables[KV_POOL], bufs.seq_lens[KV_POOL]  # [b, W], [b]
        write_loc, slots = bufs.write_loc[KV_POOL], bufs.recurrent_slots  # [b], [b]
        h = self.model.embed_tokens(input_ids)  # [b, hidden]
        cos, sin = self.rotary(bufs.positions, h.dtype)  # [b, rot]
        for i, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(h)
            j = self._pool_index[i]
            if layer.is_linear:
                h = h + self._reduce(layer.linear_attn.decode(x, state.conv[j], state.ssm[j], slots, kc))
            else:
                h = h + self._reduce(layer.self_attn.decode(x, state.kv[j], block_table, seq_lens, write_loc, cos, sin,
                                                            attn))  # fmt: skip
            h = h + self._reduce(layer.mlp(layer.post_attention_layernorm(h)))
        return self.lm_head(self.model.norm(h))  # [b, V]

    def _decode_fused(self, state: Qwen35State, input_ids: torch.Tensor, bufs, attn, kc: KernelChoices) -> torch.Tensor:
        """``decode`` with each residual add folded into the next norm (add_rms_norm_) and the fused layer forms:
        about ten kernels a layer instead of some fifty, two fewer at one row where each sublayer's pre-norm folds
        into its first GEMM (models.layers.fused.decode_normed_linear; the residual stream then alternates between two
        buffers, ``Residual``). Same math; roundings differ only where a kernel keeps float32 across what the torch
        path rounds (tests/test_qwen3_5_vs_transformers.py holds it to transformers)."""
        block_table, seq_lens = bufs.block_tables[KV_POOL], bufs.seq_lens[KV_POOL]  # [b, W], [b]
        write_loc, slots = bufs.write_loc[KV_POOL], bufs.recurrent_slots  # [b], [b]
        res = Residual(self.model.embed_tokens(input_ids))  # res.h [b, hidden], the residual stream
        cos, sin = self.rotary(bufs.positions, res.h.dtype)  # [b, rot]
        delta = None  # the last sublayer's output, added into the stream by the next norm
        for i, layer in enumerate(self.model.layers):
            # each sublayer's input: its pre-norm, applied by its first projection (alone, or folded into the GEMM)
            x = PendingNorm(res, delta, layer.input_layernorm.weight, layer.input_layernorm.eps)
            j = self._pool_index[i]
            if layer.is_linear:
                delta = layer.linear_attn.decode_fused(x, state.conv[j], state.ssm[j], slots, kc)
            else:
                delta = layer.self_attn.decode_fused(x, state.kv[j], block_table, seq_lens, write_loc, cos, sin, attn,
                                                     kc=kc)  # fmt: skip
            delta = self._reduce(delta)
            x = PendingNorm(res, delta, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps)
            delta = self._reduce(layer.mlp.forward_fused(x, kc))
        # the last norm is not folded into the lm_head GEMM (see kernels.gemv.NORM_CONFIGS)
        x = add_rms_norm_(res.h, delta, self.model.norm.weight, self.model.norm.eps, pdl=kc.pdl)
        return decode_linear(x, self.lm_head.weight, kc)  # [b, V]
