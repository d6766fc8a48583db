"""One adapter per model family: what the engine needs to know about a model, and nothing else.

An adapter declares the model's KV pools (key, APPEND or READ, the model's own limit on a stream), the pool positions
ride on, whether it keeps recurrent state, allocates the state tensors, runs a host-planned prefill pass over several
requests' chunks (and, for an encoder-decoder, the encoder that fills its READ pool first), and the graph-safe decode
from a bucket's StepBuffers. Models are built with random weights from a seed (no downloads):
``build_adapter(name, seed)``.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np
import torch

from kernels.choices import DEFAULT, KernelChoices
from kernels.conv1d_varlen import untuned_sizes
from models.engine.requests import InvalidRequest, Request
from models.layers.flashinfer_attention import Workspaces
from models.layers.flat import bucket_shape
from models.layers.prefill_attention import HEAD_DIMS as PREFILL_HEAD_DIMS
from models.layers.specs import KVPoolSpec
from models.qwen3_5 import KV_POOL, PrefillChunk, Qwen35Model
from models.qwen3_5 import config as qwen_config
from models.qwen3_5.config import Qwen35Config
from models.whisper import DecoderChunk, WhisperModel
from models.whisper import config as whisper_config
from models.whisper.config import WhisperConfig
from models.whisper.decoder import CROSS, SELF
from resplan import ResourceInfo, ResourceKind, Segment, StepBuffers, StreamMode

DECODE = "decode"  # the decode walk's stream label
RECURRENT, POSITIONS, SAMPLER = "rec", "pos", "sampler"  # resource keys beside the KV pools


@attrs.frozen
class PrefillInput:
    """One request's chunk of a prefill pass, as ``Adapter.prefill_last`` takes it."""

    ids: np.ndarray  # [T] int64
    pages: dict[str, np.ndarray]  # pool -> [n], the request's pages in order (host)
    start: int
    rec_slot: int
    read_lens: dict[str, int]
    pos_offset: int
    # (p, slot) pairs: once the pass has run, recurrent slot ``slot`` holds the state the request's own slot would hold
    # after stream positions 0 .. p - 1; p is start + a multiple of 64 inside the chunk, or its end start + T
    # (models.layers.flat's module doc: the bound a pass shape puts on them). Recurrent models only.
    saves: tuple[tuple[int, int], ...] = ()


class Adapter:
    """The engine's view of a model. Subclasses fill in the family-specific parts."""

    name: str
    model: torch.nn.Module
    vocab_size: int
    pools: tuple[KVPoolSpec, ...]  # the model's KV pools (Model.kv_pool_specs)
    positions_pool: str
    recurrent: bool
    eos_token_ids: tuple[int, ...] = ()  # tokens every request stops on unless it ignores EOS (from a checkpoint)
    checkpoint = None  # the models.engine.checkpoint.Checkpoint it was loaded from; None for random weights

    @property
    def append_pools(self) -> tuple[KVPoolSpec, ...]:
        return tuple(p for p in self.pools if p.mode is StreamMode.APPEND)

    def resources(self) -> dict[str, ResourceInfo]:
        """What a decode step reads and writes, by resource key, as the planner sees it: each KV pool, the recurrent
        slot, the position offset, the sampler's cells. A subclass marks one that cannot keep rows on the device
        (a sliding window, no table), which keeps the engine host-planned."""
        out = {p.key: ResourceInfo(p.key, ResourceKind.KV) for p in self.pools}
        if self.recurrent:
            out[RECURRENT] = ResourceInfo(RECURRENT, ResourceKind.RECURRENT)
        out[POSITIONS] = ResourceInfo(POSITIONS, ResourceKind.POSITIONS)
        out[SAMPLER] = ResourceInfo(SAMPLER, ResourceKind.SAMPLER)
        return out

    def decode_walk(self) -> dict[str, list[Segment]]:
        """The decode step as one walk over the resources: every row appends one token to each APPEND pool, its
        recurrent state and its position, and only reads a READ pool (a cross-attention context)."""
        walk = {p.key: [Segment(DECODE, 1 if p.mode is StreamMode.APPEND else 0)] for p in self.pools}
        walk.update({k: [Segment(DECODE, 1)] for k in self.resources() if k not in walk})
        return walk

    @property
    def max_context(self) -> int:
        """Tokens an APPEND stream may hold (the positions the model knows)."""
        return min(p.max_seq_len for p in self.append_pools)

    def validate(self, req: Request) -> None:
        """Model-specific checks at submission (raise InvalidRequest)."""
        if req.features is not None:
            raise InvalidRequest("features", f"{self.name} takes no input features")

    def read_tokens(self, req: Request) -> dict[str, int]:
        """Tokens each READ pool will hold for ``req`` (its context), by pool key."""
        return {}

    def allocate(self, num_pages: dict[str, int], page_size: int, rec_slots: int, device, dtype,
                 workspaces: Workspaces | None = None, saving: bool = False,
                 state_dtype: torch.dtype = torch.float32):  # fmt: skip
        """The model's state: its pools, and its prefill attention where it has one, whose FlashInfer workspace comes
        from ``workspaces`` (the engine's; None: a private one). ``saving``: its passes may save recurrent states
        (``PrefillInput.saves``; False: no save work at all in a pass). ``state_dtype``: its recurrent (SSM) states'."""
        raise NotImplementedError

    def recurrent_pools(self, state) -> tuple[torch.Tensor, ...]:
        """Tensors indexed by recurrent slot (dim 0) that hold every recurrent state between them (Qwen3.5: one a kind,
        [slots, layers, ...], so a slot's copy is one copy a kind); () when the model keeps none."""
        return ()

    def kv_caches(self, state, key: str) -> tuple[torch.Tensor, ...]:
        """One pool's caches, one a layer: [num_pages, 2, page_size, heads, head_dim]."""
        raise NotImplementedError

    def kv_pages(self, state, key: str) -> tuple[torch.Tensor, ...]:
        """Tensors indexed by page (dim 0) that hold one pool's whole KV between them (Qwen3.5: one,
        [num_pages, layers, ...], so a page's copy is one copy); by default its caches, one a layer."""
        return self.kv_caches(state, key)

    def encode(self, state, req: Request, pages: dict[str, torch.Tensor]) -> None:
        """Fill the READ pools for ``req`` (its context), before its first prefill chunk."""

    def prefill_last(self, state, chunks: list[PrefillInput], kc: KernelChoices = DEFAULT) -> torch.Tensor:
        """Several requests' chunks (one each) in one eager pass: the logits of each chunk's last token [R, V].
        ``kc``: the pass's kernels (``prefill_kernels``, ``prefill_fused``; the engine's ``EngineConfig.kernels``)."""
        raise NotImplementedError

    def prefill_warm_sizes(self, largest: int, ran: tuple[int, ...], kc: KernelChoices = DEFAULT) -> tuple[int, ...]:
        """Token counts of eager passes that, run once before serving, tune every kernel an eager pass of at most
        ``largest`` tokens would tune at its first use, beside passes of ``ran`` tokens run already (the captured
        buckets'); () where a pass tunes nothing."""
        return ()

    def prefill_capture_refusal(self, kc: KernelChoices = DEFAULT) -> str | None:
        """Why prefill_inputs / prefill_forward with the kernels ``kc`` chooses do not give a capturable pass here,
        or None where they do."""
        return "no capturable prefill pass"

    def prefill_shape(self, state, tokens: int, max_chunks: int):
        """The shape of a pass padded to ``tokens`` that holds up to ``max_chunks`` chunks (a token bucket's)."""
        raise NotImplementedError(f"{self.name}: no capturable prefill pass")

    def prefill_inputs(self, state, chunks: list[PrefillInput], shape=None, kc: KernelChoices = DEFAULT):
        """``prefill_last``'s chunks as one pass's device inputs in ``shape`` (``prefill_shape``'s; None: the chunks'
        own): an attrs record with ``key`` (what fixes its shapes and kernels, those ``kc`` chooses) and ``tokens``,
        whose tensor fields are every input ``prefill_forward`` reads; that forward has no host sync. Its logits'
        rows past the chunks are padding."""
        raise NotImplementedError(f"{self.name}: no capturable prefill pass")

    def prefill_forward(self, state, batch) -> torch.Tensor:
        """The pass over ``prefill_inputs``' record (its kernels chosen there): ``prefill_last``'s logits [R, V].
        Graph-safe."""
        raise NotImplementedError(f"{self.name}: no capturable prefill pass")

    scores_prompts = False  # its passes give every token's hidden state (``prefill_hidden``): prompt logprobs

    def prefill_hidden(self, state, batch) -> torch.Tensor:
        """The pass over ``prefill_inputs``' record as ``prefill_forward`` runs it, returning every token's final
        hidden state [N, hidden] instead, whose ``logits`` are the model's (the last tokens' rows give
        ``prefill_forward``'s)."""
        raise NotImplementedError(f"{self.name}: no prompt logprobs")

    def logits(self, state, hidden: torch.Tensor) -> torch.Tensor:
        """The logits [n, V] of final hidden states [n, hidden] (``prefill_hidden``'s rows)."""
        raise NotImplementedError(f"{self.name}: no prompt logprobs")

    def decode(self, state, ids: torch.Tensor, bufs: StepBuffers, attn=None,
               kc: KernelChoices = DEFAULT) -> torch.Tensor:  # fmt: skip
        """One token a row from the static buffers, graph-safe: ids [b] -> logits [b, V]. ``attn``: the bucket's
        decode attention (FlashInfer on the GPU); None = plain torch. ``kc``: the forms its kernels take (the
        engine's ``EngineConfig.kernels``; a model without Triton decode kernels ignores them)."""
        raise NotImplementedError

    def attention_dims(self) -> tuple[int, int, int, float]:
        """(query heads, kv heads, head dim, softmax scale) of the decode attention a GPU backend serves."""
        raise NotImplementedError(f"{self.name}: no GPU attention backend for this model")


class QwenAdapter(Adapter):
    """Qwen3.5: one APPEND pool "kv" (positions on it) and a recurrent slot per request."""

    def __init__(self, name: str, model: Qwen35Model) -> None:
        self.name = name
        self.model = model
        cfg = model.cfg
        self.vocab_size = cfg.vocab_size
        self.pools = model.kv_pool_specs()
        self.positions_pool = KV_POOL
        self.recurrent = True

    def allocate(self, num_pages, page_size, rec_slots, device, dtype, workspaces=None, saving=False,
                 state_dtype=torch.float32):  # fmt: skip
        return self.model.allocate_state(num_pages[KV_POOL], page_size, rec_slots, device, dtype, workspaces, saving,
                                         ssm_dtype=state_dtype)  # fmt: skip

    def kv_caches(self, state, key):
        return state.kv

    def kv_pages(self, state, key):
        return state.page_major()

    def recurrent_pools(self, state) -> tuple[torch.Tensor, ...]:
        return state.slot_major()

    def prefill_last(self, state, chunks, kc=DEFAULT):
        """All chunks in one pass (``Qwen35Model.prefill_batch``)."""
        return self.prefill_forward(state, self.prefill_inputs(state, chunks, kc=kc))

    def prefill_warm_sizes(self, largest, ran, kc=DEFAULT):
        """One pass a tuning class of the varlen conv (``token_class``) that a pass of at most ``largest`` tokens
        reaches and ``ran`` did not: its tuner benchmarks every config at a class's first pass (~1-2 s on an H100)."""
        return untuned_sizes(largest, ran) if self.model.uses_prefill_kernels(kc) else ()  # (torch's tune nothing)

    def prefill_capture_refusal(self, kc=DEFAULT):
        m = self.model
        if m.lm_head.weight.is_cuda and not m.uses_prefill_kernels(kc):  # a CPU "graph" re-runs the pass
            why = m.prefill_kernel_refusal() or (f"prefill_kernels off, or {m.lm_head.weight.dtype} weights: the "
                                                 "kernels need bf16 or fp16")  # fmt: skip
            return f"its prefill runs the torch references on CUDA ({why}), which read lengths back to the host"
        return None

    def prefill_shape(self, state, tokens, max_chunks):
        # the chunks' requests hold distinct pages, so the pool's page count bounds the pages of any pass
        return bucket_shape(tokens, max_chunks, state.num_pages, state.page_size)

    def prefill_inputs(self, state, chunks, shape=None, kc=DEFAULT):
        return self.model.prefill_inputs(
            state, [PrefillChunk(c.ids, c.pages[KV_POOL], c.start, c.rec_slot, c.pos_offset, tuple(c.saves))
                    for c in chunks], shape, graphed=shape is not None, kc=kc)  # fmt: skip

    def prefill_forward(self, state, batch):
        return self.model.prefill_forward(state, batch)

    scores_prompts = True

    def prefill_hidden(self, state, batch):
        return self.model.prefill_hidden(state, batch)

    def logits(self, state, hidden):
        return self.model.lm_head(hidden)

    def decode(self, state, ids, bufs, attn=None, kc=DEFAULT):
        return self.model.decode(state, ids, bufs, attn, kc)

    def attention_dims(self):
        c = self.model.cfg
        return c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.head_dim**-0.5


class WhisperAdapter(Adapter):
    """Whisper: "self" APPEND (positions on it), "cross" READ, filled by the encoder at a request's first chunk."""

    def __init__(self, name: str, model: WhisperModel) -> None:
        self.name = name
        self.model = model
        cfg = model.cfg
        self.vocab_size = cfg.vocab_size
        self.pools = model.kv_pool_specs()
        self.positions_pool = SELF
        self.recurrent = False

    def validate(self, req):
        cfg = self.model.cfg
        if cfg.decoder_start_token_id not in req.prompt:  # (first, or after <|startofprev|> and a previous text)
            raise InvalidRequest("prompt", f"a Whisper decoder prompt holds its start token "
                                           f"{cfg.decoder_start_token_id} (models.engine.audio.decoder_prompt builds "
                                           f"one), got {list(req.prompt[:8])}")  # fmt: skip
        f = req.features
        if not isinstance(f, torch.Tensor) or f.ndim != 2 or f.shape[0] != cfg.num_mel_bins or f.shape[1] < 1:
            got = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
            raise InvalidRequest(
                "features", f"{self.name} needs log-mel features [{cfg.num_mel_bins}, frames], got {got}"
            )
        if not torch.isfinite(f).all():
            raise InvalidRequest("features", "features hold a non-finite value")
        n_ctx = self._n_ctx(req)
        if n_ctx > cfg.max_source_positions:
            raise InvalidRequest(
                "features", f"{f.shape[1]} frames give {n_ctx} encoder tokens > {cfg.max_source_positions}"
            )

    @staticmethod
    def _n_ctx(req: Request) -> int:
        return (req.features.shape[1] - 1) // 2 + 1

    def read_tokens(self, req):
        return {CROSS: self._n_ctx(req)}

    def allocate(self, num_pages, page_size, rec_slots, device, dtype, workspaces=None, saving=False,
                 state_dtype=torch.float32):  # fmt: skip
        return self.model.allocate_state(num_pages, {k: page_size for k in num_pages}, device=device, dtype=dtype,
                                         workspaces=workspaces)  # fmt: skip

    def kv_caches(self, state, key):
        return state[key]

    def encode(self, state, req, pages):
        self.model.encode(state, req.features, pages[CROSS])

    def prefill_last(self, state, chunks, kc=DEFAULT):
        """All chunks in one flat pass (``WhisperModel.prefill_batch``): FlashInfer's attention where the state has
        it (and ``kc`` does not turn it off), else the torch references, one sequence at a time."""
        return self.prefill_forward(state, self.prefill_inputs(state, chunks, kc=kc))

    def prefill_capture_refusal(self, kc=DEFAULT):
        m, w = self.model, self.model.proj_out.weight
        if w.is_cuda and (kc.prefill_kernels is False or not m.has_prefill_kernels(w.device, w.dtype)):
            return (f"its prefill attention runs the torch references on CUDA (prefill_kernels off, or {w.dtype} "
                    f"weights and head width {m.cfg.head_dim}: FlashInfer's needs bf16 or fp16 and a width in "
                    f"{PREFILL_HEAD_DIMS}), which read lengths back to the host")  # fmt: skip
        return None

    def prefill_shape(self, state, tokens, max_chunks):
        kv = state[SELF][0]  # the chunks' requests hold distinct pages: the pool's page count bounds any pass's
        return bucket_shape(tokens, max_chunks, kv.shape[0], kv.shape[2])

    def prefill_inputs(self, state, chunks, shape=None, kc=DEFAULT):
        if any(c.saves for c in chunks):
            raise ValueError(f"{self.name} keeps no recurrent state: a prefill chunk cannot save any")
        return self.model.prefill_inputs(state, [
            DecoderChunk(c.ids, c.pages[SELF], c.start, c.pages[CROSS], c.read_lens.get(CROSS, 0), c.pos_offset)
            for c in chunks], shape, graphed=shape is not None, kc=kc)  # fmt: skip

    def prefill_forward(self, state, batch):
        return self.model.prefill_forward(state, batch)

    def decode(self, state, ids, bufs, attn=None, kc=DEFAULT):
        if attn is not None:
            raise ValueError(f"{self.name}: decode runs plain torch attention only (no GPU backend for two pools)")
        return self.model.decode(state, ids, bufs)


MODEL_CONFIGS: dict[str, Qwen35Config | WhisperConfig] = {
    "qwen3_5-tiny": qwen_config.tiny,
    "qwen3_5-0.8b": qwen_config.qwen3_5_0_8b,
    "qwen3_5-2b": qwen_config.qwen3_5_2b,
    "whisper-test": whisper_config.tiny,  # test-sized (2 + 2 layers, 128 tokens)
    "whisper-tiny": whisper_config.whisper_tiny,
    "whisper-large-v3": whisper_config.whisper_large_v3,
}


def _build(name: str) -> Adapter:
    cfg = MODEL_CONFIGS[name]
    if isinstance(cfg, Qwen35Config):
        return QwenAdapter(name, Qwen35Model(cfg))
    return WhisperAdapter(name, WhisperModel(cfg))


MODELS: dict[str, Callable[[str], Adapter]] = {name: _build for name in MODEL_CONFIGS}


def model_context(name: str) -> int:
    """Tokens a decoder stream of the named model may hold (what ``Adapter.max_context`` gives), without building it."""
    cfg = MODEL_CONFIGS[name]
    return cfg.max_position_embeddings if isinstance(cfg, Qwen35Config) else cfg.max_target_positions


def build_adapter(
    name: str, seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Adapter:
    """The named model with random weights drawn from ``seed`` (the global RNG is left as it was)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        adapter = MODELS[name](name)
    adapter.model.to(device=device, dtype=dtype).eval()
    if hasattr(adapter.model, "fuse_projections"):
        adapter.model.fuse_projections()  # before any capture: the fused decode's GEMMs read one weight each
    return adapter
