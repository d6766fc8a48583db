"""The engine and its decode loop: pools, scheduler, host streams, and the two planning arms.

``Engine(adapter, EngineConfig(planning=...))``; ``submit(request)`` validates and queues; ``step()`` runs one step;
``run(requests)`` drives steps until every request has finished.

One step:

1. reload offloaded requests there is room for (oldest offload first);
2. compose the step (scheduler), offloading the least recently run requests while its decode rows' crossings need more
   pages than are free, then **admit** it as one transaction: the decode rows' crossing pages (taken early, with the
   pre-plan, or now), and for each admitted request a handle, its prompt's pages and a recurrent slot. A refusal
   rolls the whole admit back, including the crossing pages the pre-plan named, and drops that pre-plan (see below);
   the step is then composed again, admitting only the requests ahead of the refused one until a request finishes;
3. a step with prefill work is **host-planned**: the decode rows (a mixed step) from a host fill of the bucket's
   buffers, then each prefill chunk eagerly; the rows it touched are marked stale. A step of decode rows only is a
   **decode step**: the resident arm plans it (``resplan.plan``), flushes the program and replays the bucket's graph
   (gather, forward, sample, commit lengths); the host arm fills the same buffers from the streams (one H2D) and
   replays its graph (forward, sample). The host then advances its APPEND lengths by one, the planner commits, and the
   optional row check compares every row the step read with the streams;
4. sampled tokens are read back: outputs, stop tokens and lengths are checked with numpy over the rows;
5. **pre-plan** the next step, as a pipelined engine does while the device runs: compose it, take its decode rows'
   crossing pages, and (resident arm, decode step) plan it. The next step reuses that plan when it runs the same rows
   in the same bucket with no planner transition in between.

Input ids: a step's sampled tokens stay on the device (``tokens_all``); a resident graph takes each row's input id
from there when the row ran in the last replayed step (``src`` = its position), else from a host id (a row that
prefilled, or last ran earlier). The host copies ``(ids, src)`` only when they change: a steady step copies none.

**Overlap** (``EngineConfig(overlap=True)``, either arm, any attention): since a decode step's inputs are on the
device (its input ids are the last step's sampled tokens there), step N+1 is launched before step N's tokens are read,
and the host reads them while the device runs N+1; it then pre-plans N+2 (the resident plan, or the host arm's fill
and fa2 plan) while N+1 runs. A request whose last token is in flight is RETIRED, so no later step runs it past its
length; a request that stops on a token at N has run N+1 too, and that token is dropped (rows are matched by the
admission serial they were launched with). A step with prefill work, or none at all, first lands the step in flight
(drain). The host arm's pre-plan writes pinned buffers that H2D copies read asynchronously: the fill's ring and fa2's
plan wait on the event of the copy that last read them, which ran before the step landed just before the pre-plan
(``host-overlap`` in the benchmarks: what engines with asynchronous scheduling run).

The pre-plan's staged crossings name pages. Whatever gives pages back (a refused admit's rollback, an offload, a
finish) drops the pre-plan if its program names one of them: otherwise a retried step with the same rows would reuse
it and write its token into a page the row no longer holds (the seed's refused-admit bug).
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial

import attrs
import numpy as np
import torch

from models.engine.adapters import DECODE, Adapter, PrefillInput
from models.engine.host_arm import HostFill
from models.engine.pools import AdmitRefused, AdmitTxn, Crossing, PagePool, handle_pool, pool_layout, recurrent_pool
from models.engine.prefill_graphs import PrefillGraphs
from models.engine.requests import FinishReason, InvalidRequest, Limits, Request, Result, validate
from models.engine.sampler import Sampler
from models.engine.scheduler import Batch, Chunk, Order, Pending, Scheduler, Status, decode_buckets
from models.layers.decode_attention import Backend
from resplan import (
    BucketPlan,
    CaptureError,
    Executor,
    FlushProgram,
    Graph,
    HostStreams,
    Mismatch,
    PlannerState,
    ResidentStream,
    SamplerCell,
    Step,
    build_planner,
    capture_streams,
    commit,
    float_bits,
    mark_stale,
    offload,
    plan,
    release,
    row_check,
)

log = logging.getLogger(__name__)


class Planning(enum.Enum):
    RESIDENT = "resident"  # decode steps planned through resplan: rows live in the device store
    HOST = "host"  # every decode step's buffers rebuilt from the streams on the host


def _positive_or_none(_inst, attribute, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be > 0 (or None), got {value}")


def _positive(_inst, attribute, value) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen
class EngineConfig:
    """How an engine serves: its planning arm, concurrency and buckets, decode order, pools, prefill budget."""

    planning: Planning = Planning.RESIDENT
    max_running: int = attrs.field(default=8, validator=_positive)  # requests admitted at once (concurrency)
    max_bucket: int | None = attrs.field(default=None, validator=_positive_or_none)  # widest bucket; None: max_running
    order: Order = Order.ARRIVAL
    page_size: int = attrs.field(default=16, validator=_positive)
    num_pages: int | None = attrs.field(default=None, validator=_positive_or_none)  # per APPEND pool, sink included
    max_seq_len: int = attrs.field(default=256, validator=_positive)  # the context, at most the model's
    token_budget: int | None = attrs.field(default=None, validator=_positive_or_none)  # prefill tokens a step
    rec_slots: int | None = attrs.field(default=None, validator=_positive_or_none)  # sink included; None: c + 1
    row_check: bool = False  # compare every row a resident step read with the streams (syncs; debug)
    preplan: bool = True  # plan the next decode step early, as a pipelined engine does
    device: str = "cpu"
    dtype: str | None = attrs.field(default=None, validator=attrs.validators.in_((None, "float32", "bfloat16",
                                                                                 "float16")))  # fmt: skip
    # model weights and KV caches; None: the weights' own (random weights: float32; a checkpoint: its dtype)
    attention: Backend = Backend.TORCH  # decode attention: TORCH, FA2 or XQA (CUDA), TRITON (CUDA, or interpreted)
    timing: bool = False  # ITL samples, decode graph and prefill GPU time (CUDA events; a prefill pass then syncs)
    overlap: bool = False  # launch each decode step before reading the last one's tokens (input ids on the device)
    prefill_graphs: int = attrs.field(default=0, validator=attrs.validators.ge(0))  # prefill shapes kept captured
    prefill_graph_tokens: int = attrs.field(default=8192, validator=_positive)  # longer passes stay eager


@attrs.define
class EngineStats:
    """Counters over an engine's life. "decode steps" are steps of decode rows only (resident in the resident arm)."""

    steps: int = 0
    decode_steps: int = 0
    mixed_steps: int = 0  # host-planned: prefill chunks and decode rows
    prefill_steps: int = 0  # host-planned: prefill chunks only
    prefill_chunks: int = 0
    rows_decoded: int = 0  # real decode rows run (every kind of step)
    padded_rows: int = 0
    tokens: int = 0  # tokens generated, a prefill's first token included
    finished: int = 0
    rows_whole: int = 0  # resident: rows written whole (new, displaced earlier, stale)
    new_rows: int = 0  # resident: rows that took a slot
    crossings: int = 0  # resident: block-table cells staged because a row's token opened a page
    displacements: int = 0  # resident: requests that lost their slot to a step
    h2d_copies: int = 0  # decode steps: planning H2D (flush program, or the host fill's) and input-ids copies
    h2d_bytes: int = 0
    ids_copies: int = 0  # decode steps whose input ids (and sources) changed, so the host copied them
    overlapped: int = 0  # decode steps launched before the previous decode step's tokens were read
    discarded: int = 0  # rows a step ran for a request that had stopped on a token meanwhile (overlap)
    empty_flushes: int = 0  # resident decode steps that issued no H2D at all
    prefill_passes: int = 0  # prefill passes, eager or replayed (one a step with prefill work)
    prefill_tokens: int = 0  # prompt tokens they ran
    prefill_ns: int = 0  # their wall time: inputs, the pass, first-token sampling and readback
    prefill_host_ns: int = 0  # of which the host spent enqueueing them, until it waits for the first tokens
    prefill_gpu_ms: float = 0.0  # their GPU time, the pass and first-token sampling (CUDA events; with timing on)
    mixed_ns: int = 0  # wall time of the mixed steps (decode rows beside prefill chunks), whole step() each
    plan_ns: int = 0  # decode steps: plan + flush (resident) or fill + copy (host), wherever it ran
    attn_schedule_ns: int = 0  # decode steps: the attention's host schedule (fa2's plan()), with its table build
    launch_ns: int = 0  # decode steps: input ids copy (if any) + graph replay launch + token readback enqueue
    wait_ns: int = 0  # decode steps: waiting for the sampled tokens (the GPU finishing the step)
    decode_ns: int = 0  # decode steps: wall time of the whole step() (compose, admit, plan, replay, emit, pre-plan)
    decode_rows: int = 0  # decode steps: real rows (tokens) they produced
    gpu_ms: float = 0.0  # decode steps: graph time on the GPU (CUDA events; with timing on)
    itl: list = attrs.Factory(list)  # with timing on: per step, [n] gaps since each row's last token (s)
    preplans: int = 0
    preplan_hits: int = 0
    preplan_drops: int = 0  # dropped because pages its program named were given back
    refused_admits: int = 0
    offloads: int = 0
    reloads: int = 0
    row_checks: int = 0
    mismatches: int = 0
    first_mismatches: list[Mismatch] = attrs.Factory(list)

    def per_decode_step(self, value: int) -> float:
        return value / self.decode_steps if self.decode_steps else 0.0


@attrs.define(eq=False)
class Live:
    """An admitted request."""

    pend: Pending
    saved: dict[str, tuple[int, list[torch.Tensor]]] | None = None  # offloaded: pool -> (pages, per-layer copies)


@attrs.frozen(eq=False)
class InFlight:
    """A launched step whose sampled tokens the host has not read yet."""

    rows: np.ndarray  # [n] handles, in the step's row order
    serial: np.ndarray  # [n] their admissions' serials at launch: a row whose serial changed since is dropped
    bucket: int
    parity: int  # which pinned readback buffer and events it uses
    decode: bool  # a pure decode step (its phases count in the stats)


@attrs.frozen(eq=False)
class PrePlan:
    """The next resident decode step, planned early. Valid while rows, bucket and planner state are what it was made
    for."""

    key: bytes  # rows.tobytes()
    bucket: int
    base: PlannerState  # the state it was planned from
    state: PlannerState
    program: FlushProgram
    seq: int
    plan_ns: int


@attrs.frozen(eq=False)
class EarlyFill:
    """The next host-planned decode step, filled (buffers copied) and its attention scheduled early, while the step in
    flight runs.
    Valid while its rows, bucket and their streams' lengths, page counts and last pages are what it was made from."""

    key: bytes  # rows.tobytes()
    bucket: int
    seen: np.ndarray  # what the fill read of the rows' streams (EarlyFill.of)
    seq: int
    plan_ns: int
    attn_schedule_ns: int

    @staticmethod
    def of(engine: Engine, rows: np.ndarray) -> np.ndarray:
        """Each APPEND pool's lengths, page counts and last page of ``rows``: a refused admit's rollback, the only
        thing that changes them between a pre-plan and its step without changing the rows, moves one of these."""
        parts = []
        for k in engine.append_keys:
            s, held = engine.streams.kv[k], engine.n_pages[k][rows]
            parts += [s.lengths[rows], held, s.pages[rows, np.maximum(held - 1, 0)]]
        return np.concatenate(parts)


class Engine:
    def __init__(self, adapter: Adapter, config: EngineConfig | None = None) -> None:
        cfg = config or EngineConfig()
        self.adapter = adapter
        self.config = cfg
        self.resident = cfg.planning is Planning.RESIDENT
        if cfg.prefill_graphs and not adapter.capturable_prefill:
            raise ValueError(f"prefill_graphs: {adapter.name} has no capturable prefill pass; use prefill_graphs=0")
        self.device = torch.device(cfg.device)
        ps = cfg.page_size
        if cfg.max_seq_len > adapter.max_context:
            raise ValueError(f"max_seq_len {cfg.max_seq_len} is longer than {adapter.name}'s context of "
                             f"{adapter.max_context} tokens")  # fmt: skip
        self.max_seq_len = cfg.max_seq_len
        H = cfg.max_running
        if cfg.max_bucket is not None and cfg.max_bucket > H:
            raise ValueError(f"max_bucket {cfg.max_bucket} is more than max_running {H}: no step has more rows than "
                             "running requests")  # fmt: skip
        # -- pools and layout ----------------------------------------------------------------------------------------
        self.layout, counts = pool_layout(adapter.pools, ps, H, self.max_seq_len, cfg.num_pages, adapter.positions_pool,
                                          adapter.recurrent)  # fmt: skip
        self.page_pools = {k: PagePool(k, n, ps) for k, n in counts.items()}
        self.append_keys = tuple(p.key for p in self.layout.append_pools)
        self.read_keys = tuple(p.key for p in self.layout.read_pools)
        self.streams = HostStreams.zeros(self.layout, H)
        self.n_pages = {k: np.zeros(H, np.int64) for k in self.page_pools}  # pages each handle holds
        self.handles = handle_pool(H)
        rec_slots = cfg.rec_slots if cfg.rec_slots is not None else H + 1
        self.rec = recurrent_pool(rec_slots) if adapter.recurrent else None
        w = next(adapter.model.parameters())
        if cfg.dtype is not None and getattr(torch, cfg.dtype) != w.dtype:
            raise ValueError(f"EngineConfig.dtype is {cfg.dtype} but {adapter.name}'s weights are {w.dtype}: build the "
                             "adapter in that dtype, or leave dtype None")  # fmt: skip
        self.dtype = w.dtype  # weights, KV caches, the attention's inputs
        self.model_state = adapter.allocate(
            {k: p.num_pages for k, p in self.page_pools.items()}, ps, rec_slots, self.device, w.dtype
        )
        # -- buckets, planner, executor, graphs ----------------------------------------------------------------------
        self.buckets = decode_buckets(cfg.max_bucket or H)
        self.scheduler = Scheduler(H, self.buckets, cfg.order, cfg.token_budget, self.append_keys)
        self.backend = cfg.attention
        self.attn = self._make_attention()
        self.refusal, streams = self._capture_streams()
        self.plans = {b: BucketPlan.build(b, streams, self.attn[b] is None or self.attn[b].backend.host_plan_free)
                      for b in self.buckets}  # fmt: skip
        self.state: PlannerState | None = (build_planner(self.layout, list(self.plans.values()), H) if self.resident
                                           else None)  # fmt: skip
        self.executor = Executor(self.layout, self.buckets, self.device)
        self.sampler = Sampler(adapter.vocab_size, self.device)
        self._make_io()
        # the engine takes a page exactly when a token opens it, so no stream holds a page past its used columns
        self.fills = {b: HostFill(self.layout, self.executor.buffers[b], exact_pages=True) for b in self.buckets}
        self.host_graphs, self.graphs = self._capture()
        self.prefill_graphs = (
            PrefillGraphs(partial(adapter.prefill_forward, self.model_state), self.device, cfg.prefill_graphs,
                          cfg.prefill_graph_tokens)
            if cfg.prefill_graphs else None
        )  # fmt: skip
        # -- per-handle request state --------------------------------------------------------------------------------
        self.gen = np.zeros(H, np.int64)  # tokens generated
        self.t_first = np.zeros(H)  # wall clock of each handle's first token
        self.t_last = np.zeros(H)  # and of its latest
        self._t_submit: dict[str, float] = {}
        self.max_tokens = np.zeros(H, np.int64)
        self.sampling = np.zeros(H, bool)  # temperature > 0: the step replays the sampling graph
        self.prompt_len = np.zeros(H, np.int64)
        self.last_token = np.zeros(H, np.int64)
        self.out = np.zeros((H, self.max_seq_len), np.int32)  # generated tokens by handle
        self.stop = np.full((H, 1), -1, np.int64)  # stop tokens by handle, -1 padded
        self.live: dict[int, Live] = {}
        self.results: dict[str, Result] = {}
        self.limits = Limits(adapter.name, adapter.vocab_size, self.max_seq_len)
        self.stats = EngineStats()
        self._arrivals = itertools.count()
        self._rids: set[str] = set()  # ids submitted whose results have not been handed over
        self._auto_ids = itertools.count()
        self._seq = 0
        self._txn: AdmitTxn | None = None  # crossing pages taken early for the next step
        self._preplan: PrePlan | EarlyFill | None = None
        self.serial = np.zeros(H, np.int64)  # bumped by every admit and finish of a handle
        self.issued = np.zeros(H, np.int64)  # tokens launched (generated or in flight)
        self._inflight: InFlight | None = None
        self.on_finish: Callable[[Result], None] | None = None

    def _make_io(self) -> None:
        """The step's input ids and sampled tokens, on the device and in pinned host buffers (two of each, used by
        alternate launches: a buffer is rewritten only after the launch before last has landed)."""
        B, cuda = self.buckets[-1], self.device.type == "cuda"
        i64 = dict(dtype=torch.int64, device=self.device)
        self.tokens_all = torch.zeros(B, **i64)  # [B] the last replayed step's sampled tokens, in its row order
        self.tokens = {b: self.tokens_all[:b] for b in self.buckets}  # [b] written by bucket b's graphs
        self.idsrc = {b: torch.zeros(2, b, **i64) for b in self.buckets}  # [2, b]: host ids; src (-1: host id)
        self.ids = {b: self.idsrc[b][0] for b in self.buckets}  # [b] a host-planned graph's input ids
        self._idsrc_now = {b: np.zeros((2, b), np.int64) for b in self.buckets}  # what idsrc[b] holds
        self._idsrc_now_ids = {b: self._idsrc_now[b][0] for b in self.buckets}  # views made once (hot path)
        flat = [torch.zeros(2 * B, dtype=torch.int64, pin_memory=cuda) for _ in range(2)]
        self._idsrc_host = [{b: t[: 2 * b].view(2, b) for b in self.buckets} for t in flat]
        self._idsrc_host_np = [{b: v.numpy() for b, v in d.items()} for d in self._idsrc_host]
        self._ids_host = [{b: d[b][0] for b in self.buckets} for d in self._idsrc_host]
        self._ids_host_np = [{b: d[b][0] for b in self.buckets} for d in self._idsrc_host_np]
        toks = [torch.zeros(B, dtype=torch.int64, pin_memory=cuda) for _ in range(2)]
        self._tok_host = [{b: t[:b] for b in self.buckets} for t in toks]
        self._tok_np = [t.numpy() for t in toks]
        self._landed = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._timers = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda
                        else None for _ in range(2)]  # fmt: skip
        self._prefill_timer = ((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                               if cuda and self.config.timing else None)  # fmt: skip
        self._parity = 0
        H = self.config.max_running
        self._tok_pos = np.full(H, -1, np.int64)  # each handle's position in tokens_all, -1 when not there
        self._last_rows = np.zeros(0, np.int64)  # the rows of the step that wrote tokens_all
        self._arange = np.arange(B, dtype=np.int64)

    @classmethod
    def build(cls, model: str, config: EngineConfig | None = None, seed: int = 0) -> Engine:
        """An engine serving the named model (random weights from ``seed``)."""
        from models.engine.adapters import build_adapter

        cfg = config or EngineConfig()
        return cls(build_adapter(model, seed, cfg.device, getattr(torch, cfg.dtype or "float32")), cfg)

    @classmethod
    def from_pretrained(cls, path, config: EngineConfig | None = None) -> Engine:
        """An engine serving a Hugging Face model directory (``models.engine.checkpoint``): its weights in
        ``config.dtype``, or the checkpoint's own; its end-of-sequence tokens stop every request that does not set
        ``ignore_eos``. Text in and out: ``models.engine.text.Tokenizer.from_pretrained(path)``."""
        from models.engine.checkpoint import load_adapter

        cfg = config or EngineConfig()
        return cls(load_adapter(path, cfg.device, getattr(torch, cfg.dtype) if cfg.dtype else None), cfg)

    # -- graphs --------------------------------------------------------------------------------------------------
    def _capture_streams(self) -> tuple[CaptureError | None, dict[str, ResidentStream]]:
        """The stream record of each KV pool in the decode walk the adapter declares, checked by the planner's capture
        rules (``resplan.capture_streams``); a resource that cannot keep rows on the device keeps the engine
        host-planned, logged once with its typed reason. Returns (that refusal or None, the pools' records)."""
        plain = {p.key: ResidentStream(DECODE, p.mode) for p in self.layout.pools}
        try:
            streams = capture_streams(self.adapter.decode_walk(), self.adapter.resources(), self.adapter.positions_pool)
        except CaptureError as e:
            if self.resident:
                log.warning("%s: resident planning refused, the engine is host-planned: %s", self.adapter.name, e)
                self.resident = False
            return e, plain
        return None, {k: streams[k] for k in plain}

    def _make_attention(self) -> dict[int, object]:
        """Each bucket's decode attention: None (plain torch), one XQA or Triton attention shared by every bucket, or
        fa2 per bucket. Triton runs on a CPU too, in Triton's interpreter."""
        if self.backend is Backend.TORCH:
            return {b: None for b in self.buckets}
        if self.device.type != "cuda" and self.backend is not Backend.TRITON:
            raise ValueError(f"attention {self.backend.value} runs on CUDA only; use Backend.TORCH on {self.device}")
        if self.read_keys or len(self.append_keys) != 1:
            raise ValueError(f"{self.adapter.name}: GPU attention backends serve one appended pool, no read pools")
        from models.layers.flashinfer_attention import make_decode_attention

        hq, hk, d, scale = self.adapter.attention_dims()
        W = self.layout.span(self.append_keys[0]).width
        common = dict(max_pages_per_row=W, num_qo_heads=hq, num_kv_heads=hk, head_dim=d,
                      page_size=self.config.page_size, device=self.device, dtype=self.dtype,
                      sm_scale=scale)
        if self.backend in (Backend.XQA, Backend.TRITON):
            shared = make_decode_attention(self.backend, batch_size=self.buckets[-1], **common)
            return {b: shared for b in self.buckets}
        return {b: make_decode_attention(Backend.FA2, batch_size=b, **common) for b in self.buckets}

    def _schedule_attention(self, b: int, fill: HostFill) -> None:
        """A bucket whose attention is not host-plan-free (fa2) builds its schedule on the host from the block table and
        lengths ``fill`` built last (both arms, every step)."""
        if not self.plans[b].host_plan_free:
            bt, sl = fill.tables(self.append_keys[0])
            self.attn[b].schedule(bt, sl)

    def _capture(self) -> tuple[dict[tuple[BucketPlan, bool], Graph], dict[tuple[BucketPlan, bool], Graph]]:
        """Capture every bucket once per sampling mode, largest first, in one memory pool: the host-planned graphs
        (mixed steps, and the host arm's decode) and, in the resident arm, the resident decode graphs. Keys are
        ``(capture plan, greedy)``: a step whose rows are all greedy replays the argmax graph and skips the sampler's
        top-k over the vocabulary (hundreds of microseconds of GPU time at 64 rows)."""
        W = self.layout.span(self.append_keys[0]).width
        for b in self.buckets:  # a captured run of a host-planned attention needs a plan: the trash rows' (1 token)
            if not self.plans[b].host_plan_free:
                self.attn[b].schedule(np.zeros((b, W), np.int32), np.ones(b, np.int32))
        pool, host, resident = None, {}, {}
        for b in reversed(self.buckets):
            key = self.plans[b]
            for greedy in (False, True):
                host[key, greedy] = Graph(self._step_fn(b, greedy, resident=False), self.device, pool)
                pool = host[key, greedy].pool
                if self.resident:
                    resident[key, greedy] = Graph(self._step_fn(b, greedy, resident=True), self.device, pool)
        return host, (resident if self.resident else host)

    def _step_fn(self, b: int, greedy: bool, resident: bool) -> Callable[[], None]:
        """One decode step of bucket b: (resident: scatter + gather rows,) forward, sample, (resident: commit). A
        resident graph, and under overlap a host-planned one too, takes its input ids from the device."""
        ex, bufs, host_ids, out = self.executor, self.executor.buffers[b], self.ids[b], self.tokens[b]
        src, last = self.idsrc[b][1], self.tokens_all
        attn = self.attn[b]
        device_ids = resident or self.config.overlap

        def fn() -> None:
            ids = host_ids
            if resident:
                ex.before_forward(b)
            if device_ids:
                ids = torch.where(src >= 0, last[src.clamp(min=0)], host_ids)  # [b] last step's token, or the host's
            logits = self.adapter.decode(self.model_state, ids, bufs, attn)  # [b, V]
            out.copy_(logits.argmax(-1) if greedy else self.sampler(logits, bufs.sampler, bufs.positions))
            if resident:
                ex.after_forward(b)

        return fn

    # -- submission ----------------------------------------------------------------------------------------------
    def submit(self, request: Request, arrived: float | None = None) -> str:
        """Validate and queue a request; returns its id. Raises InvalidRequest, and nothing else changes. ``arrived``:
        when the request reached the server (``time.perf_counter()``; default now), which its TTFT counts from."""
        validate(request, self.limits)
        self.adapter.validate(request)
        rid = request.request_id
        if rid is None:
            rid = f"req-{next(self._auto_ids)}"
            while rid in self._rids:
                rid = f"req-{next(self._auto_ids)}"
        elif rid in self._rids:
            raise InvalidRequest("request_id", f"{rid!r} is in use (submitted, and its result not handed over)")
        self._rids.add(rid)
        self._t_submit[rid] = time.perf_counter() if arrived is None else arrived
        ps = self.config.page_size
        ctx = self.adapter.read_tokens(request)
        pages = tuple(
            (k, -(-(len(request.prompt) if k in self.append_keys else ctx[k]) // ps)) for k in self.page_pools
        )
        self.scheduler.waiting.append(Pending(rid, request, next(self._arrivals), pages))
        return rid

    def has_work(self) -> bool:
        """Requests wait or run, or a launched step is still to land (its rows may all have ended meanwhile)."""
        return bool(self.scheduler.waiting) or self.scheduler.admitted > 0 or self._inflight is not None

    def run(self, requests: Iterable[Request], on_step: Callable[[Engine], None] | None = None):
        """Submit every request and step until all have finished: a Result per request (handed over), or the
        InvalidRequest that refused it (the others run on). ``on_step`` is called after every step."""
        if self.on_finish is not None:
            raise ValueError("run() hands its results back itself: clear on_finish, or submit and step yourself")
        ids: list[str | InvalidRequest] = []
        for r in requests:
            try:
                ids.append(self.submit(r))
            except InvalidRequest as e:
                ids.append(e)
        while self.has_work():
            self.step()
            if on_step is not None:
                on_step(self)
        return [self.pop_result(i) if isinstance(i, str) else i for i in ids]

    # -- one step ------------------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one step; False when there was nothing to run."""
        if not self.has_work():
            return False
        t0 = time.perf_counter_ns()
        self._reload()
        admitted, landed_ns = self._admit_step()
        if admitted is None:  # landing the step in flight finished the last requests
            self.stats.decode_ns += time.perf_counter_ns() - t0
            return True
        batch, chunks = admitted
        if batch.host_planned:
            self._host_step(batch, chunks)
        else:
            self._decode_step(batch)
        self.stats.steps += 1
        if self.config.preplan:
            self._preplan_next()
        if not batch.host_planned:  # the loop's whole iteration: a pre-plan is work a later decode step saves
            self.stats.decode_ns += time.perf_counter_ns() - t0
        else:  # the wait for a decode step landed before this one belongs to that decode step
            self.stats.decode_ns += landed_ns
            if batch.rows.size:
                self.stats.mixed_ns += time.perf_counter_ns() - t0 - landed_ns
        return True

    def _must_land(self, batch: Batch) -> bool:
        """A step is in flight and ``batch`` may not run beside it: it has prefill work or no decode rows, or a request
        waits for the handle or pages a retiring one gives back when it lands (so it is admitted a step earlier)."""
        if self._inflight is None:
            return False
        sch = self.scheduler
        return batch.rows.size == 0 or batch.host_planned or bool(sch.waiting and sch.retiring())

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _free(self) -> dict[str, int]:
        return {k: p.free for k, p in self.page_pools.items()}

    def _admit_step(self) -> tuple[tuple[Batch, tuple[Chunk, ...]] | None, int]:
        """Compose and admit the step, landing a step in flight it may not run beside, offloading under KV pressure
        and rolling back refused admits. Returns (batch, chunks), or None when landing left no work; and the
        nanoseconds spent landing."""
        landed_ns = 0
        while True:
            batch = self.scheduler.compose(self._free())
            if self._must_land(batch):  # (an offload below can make room for an admission: composed again, it lands)
                t = time.perf_counter_ns()
                self._drain()
                landed_ns += time.perf_counter_ns() - t
                if not self.has_work():
                    return None, landed_ns
                continue
            if batch.empty:
                raise RuntimeError(
                    f"engine stalled: {len(self.scheduler.waiting)} waiting, {self.scheduler.admitted} admitted "
                    f"({len(self.scheduler.offloaded)} offloaded), free pages {self._free()}"
                )
            if self._relieve_pressure(batch):
                continue
            txn, self._txn = (self._txn or AdmitTxn()), None
            admitted = 0
            try:
                self._take_crossings(batch.rows, txn)
                chunks = list(batch.chunks)
                for pend, n in batch.admits:
                    h = self._admit(pend, txn)
                    chunks.append(Chunk(h, 0, n, n == len(pend.request.prompt)))
                    admitted += 1
                return (batch, tuple(chunks)), landed_ns
            except AdmitRefused:
                self._rollback(txn)
                self.stats.refused_admits += 1
                # the retry admits only those ahead of the refused one, and no more until a request finishes
                self.scheduler.admit_quota = admitted

    def _crossing_need(self, rows: np.ndarray) -> dict[str, int]:
        """Pages the rows' next tokens open, by APPEND pool."""
        need = {}
        for k in self.append_keys:
            col = self.streams.kv[k].lengths[rows] // self.config.page_size
            need[k] = int(np.count_nonzero(col >= self.n_pages[k][rows]))
        return need

    def _relieve_pressure(self, batch: Batch) -> bool:
        """Offload one request if the decode rows' crossings need more pages than are free; True if it did."""
        need = self._crossing_need(batch.rows)
        if all(need[k] <= self.page_pools[k].free for k in need):
            return False
        in_step = np.concatenate([batch.rows, np.array([c.handle for c in batch.chunks], np.int64)])
        victims = self.scheduler.victims(in_step)
        if victims.size == 0:  # only this step's rows hold pages: the least recently run of them goes
            r = batch.rows
            victims = r[np.lexsort((self.scheduler.arrival[r], self.scheduler.last_run[r]))]
        self._offload(int(victims[0]))
        return True

    def _take_crossings(self, rows: np.ndarray, txn: AdmitTxn) -> None:
        """A page for each row whose next token opens one (vectorised per pool)."""
        ps = self.config.page_size
        for k in self.append_keys:
            s, held = self.streams.kv[k], self.n_pages[k]
            col = s.lengths[rows] // ps
            need = col >= held[rows]
            if not need.any():
                continue
            h, c = rows[need], col[need]
            pages = self.page_pools[k].take(h.size)
            s.pages[h, c] = pages
            held[h] += 1
            txn.crossings.append(Crossing(k, h, c, pages))

    def _admit(self, pend: Pending, txn: AdmitTxn) -> int:
        """Handle, prompt (and context) pages, recurrent slot; each may refuse. Returns the handle."""
        h = self.handles.take()
        txn.admitted.append(h)
        self.serial[h] += 1
        self.issued[h] = 0
        self._tok_pos[h] = -1
        self.scheduler.admit(h, pend)
        self.live[h] = Live(pend)
        st = self.streams
        for k, n in pend.pages:
            pages = self.page_pools[k].take(n)
            st.kv[k].pages[h, :n] = pages
            self.n_pages[k][h] = n
        if self.rec is not None:
            st.recurrent_slot[h] = self.rec.take()
        for s in st.kv.values():
            s.lengths[h] = 0
            s.epoch[h] += 1
        st.pos_offset[h] = 0
        sp = pend.request.sampling
        st.sampler[h, SamplerCell.TEMPERATURE] = float_bits(sp.temperature)
        st.sampler[h, SamplerCell.TOP_P] = float_bits(sp.top_p)
        st.sampler[h, SamplerCell.TOP_K] = sp.top_k
        st.sampler[h, SamplerCell.SEED] = sp.seed
        self.sampling[h] = sp.temperature > 0
        self.gen[h] = 0
        self.max_tokens[h] = sp.max_tokens
        self.prompt_len[h] = len(pend.request.prompt)
        self.last_token[h] = pend.request.prompt[-1]
        stops = sp.stop_token_ids if sp.ignore_eos else tuple(dict.fromkeys(sp.stop_token_ids
                                                                          + self.adapter.eos_token_ids))
        if len(stops) > self.stop.shape[1]:
            self.stop = np.pad(self.stop, ((0, 0), (0, len(stops) - self.stop.shape[1])), constant_values=-1)
        self.stop[h] = -1
        self.stop[h, : len(stops)] = stops
        return h

    def _rollback(self, txn: AdmitTxn) -> None:
        """Give back everything a refused admit took, newest first, and put its requests back at the queue's head."""
        for h in reversed(txn.admitted):
            live = self.live.pop(h)
            self._free_pages(h)
            if self.rec is not None and self.streams.recurrent_slot[h]:
                self.rec.give(int(self.streams.recurrent_slot[h]))
                self.streams.recurrent_slot[h] = 0
            self.handles.give(h)
            self.scheduler.unadmit(h, live.pend)
        for c in reversed(txn.crossings):
            s, held = self.streams.kv[c.pool], self.n_pages[c.pool]
            still = (s.pages[c.handles, c.cols] == c.pages) & (held[c.handles] == c.cols + 1)  # not offloaded since
            h = c.handles[still]
            s.pages[h, c.cols[still]] = 0
            held[h] -= 1
            self._give_pages(c.pool, c.pages[still])

    def _give_pages(self, key: str, pages: np.ndarray) -> None:
        self.page_pools[key].give(pages)
        self._drop_preplan_naming(pages)

    def _drop_preplan_naming(self, pages: np.ndarray) -> None:
        """Pages went back to a pool: a pre-plan whose program names one of them is stale. (Its cells are crossing
        pages and whole-row runs; a narrow cell that happens to equal a page id only costs a re-plan.)"""
        pp = self._preplan
        if not isinstance(pp, PrePlan) or pages.size == 0:  # a EarlyFill checks its rows' streams where it is used
            return
        named = np.concatenate([pp.program.staged_val, pp.program.run_cells])
        if np.isin(pages, named).any():
            self._preplan = None
            self.stats.preplan_drops += 1

    def _free_pages(self, h: int) -> None:
        """Every page of handle h goes back to its pool; its streams keep their lengths."""
        for k, held in self.n_pages.items():
            s = self.streams.kv[k]
            self._give_pages(k, s.pages[h, : held[h]].copy())
            s.pages[h] = 0
            held[h] = 0
            s.epoch[h] += 1

    # -- offload and reload --------------------------------------------------------------------------------------
    def _offload(self, h: int) -> None:
        """Copy the request's KV pages to the host, give them back, and give its slot up."""
        saved = {}
        for k, held in self.n_pages.items():
            n = int(held[h])
            idx = torch.from_numpy(self.streams.kv[k].pages[h, :n].astype(np.int64)).to(self.device)
            saved[k] = (n, [c[idx].to("cpu", copy=True) for c in self.adapter.kv_caches(self.model_state, k)])
        self._free_pages(h)
        self.live[h].saved = saved
        if self.resident:
            self.state = offload(self.state, h)
        self.scheduler.offload(h)
        self.stats.offloads += 1

    def _reload(self) -> None:
        """Bring offloaded requests back, oldest offload first, while their pages fit beside a watermark."""
        sch = self.scheduler
        while sch.offloaded:
            h = sch.offloaded[0]
            saved = self.live[h].saved
            resident = np.count_nonzero((sch.status == Status.DECODING) | (sch.status == Status.PREFILLING))
            watermark = np.count_nonzero(sch.status == Status.DECODING) if resident else 0
            if any(
                saved[k][0] + (watermark if k in self.append_keys else 0) > self.page_pools[k].free for k in saved
            ):
                return
            for k, (n, copies) in saved.items():
                pages = self.page_pools[k].take(n)
                self.streams.kv[k].pages[h, :n] = pages
                self.streams.kv[k].epoch[h] += 1
                self.n_pages[k][h] = n
                idx = torch.from_numpy(pages.astype(np.int64)).to(self.device)
                for c, t in zip(self.adapter.kv_caches(self.model_state, k), copies, strict=True):
                    c[idx] = t.to(self.device)
            self.live[h].saved = None
            sch.reload(h)
            self.stats.reloads += 1

    # -- running steps -------------------------------------------------------------------------------------------
    def _launch(self, graph: Graph, b: int, rows: np.ndarray, device_ids: bool, decode: bool) -> InFlight:
        """Copy the step's input ids (a graph that takes them from the device: only if they changed), replay, enqueue
        the sampled tokens' readback. ``decode``: a pure decode step, whose phases (launch, wait, GPU time) the stats
        count."""
        n, k = rows.size, self._parity
        self._parity ^= 1
        st = self.stats
        t0 = time.perf_counter_ns()
        if device_ids:
            self._stage_idsrc(b, rows, k)
        else:
            assert self._inflight is None, "a host-planned step's ids are the host's: land the step in flight first"
            a = self._ids_host_np[k][b]
            a[:n] = self.last_token[rows]
            a[n:] = 0
            self._idsrc_now_ids[b][:] = a
            self.ids[b].copy_(self._ids_host[k][b], non_blocking=True)
            if decode:
                st.h2d_copies += 1
                st.h2d_bytes += 8 * b
        timer = self._timers[k] if self.config.timing and decode else None
        if timer is not None:
            timer[0].record()
        graph.replay()
        if timer is not None:
            timer[1].record()
        self._tok_host[k][b].copy_(self.tokens[b], non_blocking=True)
        if self._landed[k] is not None:
            self._landed[k].record()
        self._tok_pos[self._last_rows] = -1  # tokens_all now holds this step's tokens
        self._tok_pos[rows] = self._arange[:n]
        self._last_rows = rows
        self.issued[rows] += 1
        if decode:
            st.launch_ns += time.perf_counter_ns() - t0
        st.rows_decoded += n
        st.padded_rows += b - n
        return InFlight(rows, self.serial[rows], b, k, decode)

    def _stage_idsrc(self, b: int, rows: np.ndarray, k: int) -> None:
        """A resident step's (host ids, src): src = each row's position in the last replayed step's tokens, -1 for
        a row not in it, whose id the host knows (it prefilled, or last ran in a step already read back). Copied to
        the device only when it differs from what idsrc[b] holds."""
        n = rows.size
        src = self._tok_pos[rows]
        now = self._idsrc_now[b]
        if n == b and np.array_equal(now[1], src) and src.min() >= 0 and not now[0].any():
            return  # steady: every row takes the token the last step sampled for it, as the device already has
        new = self._idsrc_host_np[k][b]
        new[1, :n] = src
        new[1, n:] = -1
        new[0, :n] = np.where(src < 0, self.last_token[rows], 0)
        new[0, n:] = 0
        if np.array_equal(now, new):
            return
        now[:] = new
        self.idsrc[b].copy_(self._idsrc_host[k][b], non_blocking=True)
        self.stats.h2d_copies += 1
        self.stats.h2d_bytes += 16 * b
        self.stats.ids_copies += 1

    def _land(self, f: InFlight) -> None:
        """Wait for a launched step's tokens and emit them (dropping rows whose request finished meanwhile)."""
        st = self.stats
        t0 = time.perf_counter_ns()
        if self._landed[f.parity] is not None:
            self._landed[f.parity].synchronize()
        tokens = self._tok_np[f.parity][: f.rows.size].copy()
        if f.decode:
            st.wait_ns += time.perf_counter_ns() - t0
            if self.config.timing and self._timers[f.parity] is not None:
                st.gpu_ms += self._timers[f.parity][0].elapsed_time(self._timers[f.parity][1])
        rows = f.rows
        keep = self.serial[rows] == f.serial
        if not keep.all():
            st.discarded += int(np.count_nonzero(~keep))
            rows, tokens = rows[keep], tokens[keep]
        if rows.size:
            self._emit(rows, tokens)

    def _drain(self) -> None:
        """Land the step in flight, if any."""
        f, self._inflight = self._inflight, None
        if f is not None:
            self._land(f)

    def _advance(self, rows: np.ndarray) -> None:
        """The host advances its APPEND lengths by the rule the graph's commit follows."""
        for k in self.append_keys:
            self.streams.kv[k].lengths[rows] += 1

    def _decode_step(self, batch: Batch) -> None:
        rows, b = batch.rows, batch.bucket
        st = self.stats
        pp, self._preplan = self._preplan, None
        if self.resident:
            t0 = time.perf_counter_ns()
            if isinstance(pp, PrePlan) and pp.bucket == b and pp.base is self.state and pp.key == rows.tobytes():
                state, program, seq = pp.state, pp.program, pp.seq
                t0 -= pp.plan_ns  # planned early; it counts all the same
                st.preplan_hits += 1
            else:
                seq = self._next_seq()
                state, program = plan(self.state, Step(rows, b, seq), self.streams)
            self.state = state
            self.executor.flush(program)
            st.plan_ns += time.perf_counter_ns() - t0
            st.rows_whole += program.rows_whole
            st.new_rows += program.new_rows
            st.crossings += program.crossings
            st.displacements += program.displaced.size
            st.h2d_copies += program.h2d_copies
            st.h2d_bytes += program.h2d_bytes
            st.empty_flushes += program.empty
            if not self.plans[b].host_plan_free:
                t0 = time.perf_counter_ns()
                self.fills[b].build(self.streams, rows)  # the resident arm keeps its tables on the device; fa2 still
                self._schedule_attention(b, self.fills[b])  # wants host ones
                st.attn_schedule_ns += time.perf_counter_ns() - t0
        elif (isinstance(pp, EarlyFill) and pp.bucket == b and pp.key == rows.tobytes()
              and np.array_equal(pp.seen, EarlyFill.of(self, rows))):  # fmt: skip
            seq = pp.seq  # filled, copied and planned early, while the step before ran
            st.plan_ns += pp.plan_ns
            st.attn_schedule_ns += pp.attn_schedule_ns
            st.preplan_hits += 1
        else:
            seq = self._next_seq()
            fill_ns, attn_ns = self._host_fill(rows, b)
            st.plan_ns += fill_ns
            st.attn_schedule_ns += attn_ns
        f = self._launch(self.graphs[self.plans[b], not self.sampling[rows].any()], b, rows,
                         self.resident or self.config.overlap,
                         decode=True)  # fmt: skip
        self._advance(rows)
        if self.resident:
            self.state = commit(self.state, seq)
            if self.config.row_check:
                self._row_check(rows, b)
        self.scheduler.ran(rows, seq)
        st.decode_steps += 1
        st.decode_rows += rows.size
        if not self.config.overlap:
            self._land(f)
            return
        last = self._out_of_room(rows, self.issued[rows])
        if last.any():
            self.scheduler.retire(rows[last])
        prev, self._inflight = self._inflight, f
        if prev is not None:
            st.overlapped += 1
            self._land(prev)

    def _host_fill(self, rows: np.ndarray, b: int) -> tuple[int, int]:
        """The host arm's planning of a decode step: fill bucket b's buffers from the streams (one H2D, counted) and
        plan the attention (fa2). Returns the nanoseconds of each, for the caller to count where the step runs."""
        t0 = time.perf_counter_ns()
        self.fills[b].fill(self.streams, rows)
        t1 = time.perf_counter_ns()
        self._schedule_attention(b, self.fills[b])
        self.stats.h2d_copies += 1
        self.stats.h2d_bytes += self.fills[b].nbytes
        return t1 - t0, time.perf_counter_ns() - t1

    def _row_check(self, rows: np.ndarray, b: int) -> None:
        bad = row_check(self.executor.store_numpy(), self.state, rows, self.streams, self.executor.buffers[b])
        self.stats.row_checks += 1
        self.stats.mismatches += len(bad)
        self.stats.first_mismatches.extend(bad[: max(0, 10 - len(self.stats.first_mismatches))])

    def _host_step(self, batch: Batch, chunks: tuple[Chunk, ...]) -> None:
        """Prefill chunks, and the decode rows host-planned beside them (a mixed step)."""
        self._preplan = None  # this step commits a new seq: a plan made before it is stale
        seq = self._next_seq()
        rows, b = batch.rows, batch.bucket
        f = None
        if rows.size:
            self.fills[b].fill(self.streams, rows)
            self._schedule_attention(b, self.fills[b])
            f = self._launch(self.host_graphs[self.plans[b], not self.sampling[rows].any()], b, rows,
                             self.config.overlap, decode=False)
            self._advance(rows)
            self.scheduler.ran(rows, seq)
        t0 = time.perf_counter_ns()
        timer = self._prefill_timer
        if timer is not None:
            timer[0].record()
        first_rows, first_tokens = self._prefill(chunks, seq)
        if timer is not None:
            timer[1].record()
            timer[1].synchronize()
            self.stats.prefill_gpu_ms += timer[0].elapsed_time(timer[1])
        self.stats.prefill_ns += time.perf_counter_ns() - t0
        self.stats.prefill_passes += 1
        self.stats.prefill_tokens += sum(c.n for c in chunks)
        if self.resident:
            touched = np.concatenate([rows, np.array([c.handle for c in chunks], np.int64)])
            self.state = commit(mark_stale(self.state, touched), seq)
        if f is not None:
            self.stats.mixed_steps += 1
            self._land(f)
        else:
            self.stats.prefill_steps += 1
        if first_rows.size:
            self._emit(first_rows, first_tokens)

    def _prefill(self, chunks: tuple[Chunk, ...], seq: int) -> tuple[np.ndarray, np.ndarray]:
        """A step's chunks in one eager adapter call. Returns the handles of the chunks that end their prompts and
        their first tokens (sampled from each chunk's last logits), [m] int64 each."""
        t0 = time.perf_counter_ns()
        st = self.streams
        if not chunks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        inputs = []
        for chunk in chunks:
            h, start, n = chunk.handle, chunk.start, chunk.n
            req = self.live[h].pend.request
            pages = {
                k: torch.from_numpy(st.kv[k].pages[h, : self.n_pages[k][h]].astype(np.int64)).to(self.device)
                for k in self.page_pools
            }
            if start == 0 and self.read_keys:
                self.adapter.encode(self.model_state, req, pages)
                for k, n_ctx in self.adapter.read_tokens(req).items():
                    st.kv[k].lengths[h] = n_ctx
                    st.kv[k].epoch[h] += 1
            inputs.append(PrefillInput(
                ids=torch.tensor(req.prompt[start : start + n], dtype=torch.int64, device=self.device),
                pages=pages,
                start=start,
                rec_slot=int(st.recurrent_slot[h]) if st.recurrent_slot is not None else 0,
                read_lens={k: int(st.kv[k].lengths[h]) for k in self.read_keys},
                pos_offset=int(st.pos_offset[h]),
            ))  # fmt: skip
        if self.prefill_graphs is None:
            logits = self.adapter.prefill_last(self.model_state, inputs)  # [R, V]
        else:
            logits = self.prefill_graphs.run(self.adapter.prefill_inputs(self.model_state, inputs))
        for chunk in chunks:
            for k in self.append_keys:
                st.kv[k].lengths[chunk.handle] = chunk.start + chunk.n
                st.kv[k].epoch[chunk.handle] += 1
            self.scheduler.prefilled_chunk(chunk, seq)
        self.stats.prefill_chunks += len(chunks)
        ends = [i for i, c in enumerate(chunks) if c.last]
        hs = np.array([chunks[i].handle for i in ends], np.int64)
        if not ends:
            self.stats.prefill_host_ns += time.perf_counter_ns() - t0
            return hs, np.zeros(0, np.int64)
        self.issued[hs] = 1
        cells = torch.from_numpy(st.sampler[hs]).to(self.device)  # [m, 4]
        pos = [inputs[i].pos_offset + chunks[i].start + chunks[i].n - 1 for i in ends]
        drawn = self.sampler(logits[ends], cells, torch.tensor(pos, dtype=torch.int64, device=self.device))
        self.stats.prefill_host_ns += time.perf_counter_ns() - t0
        return hs, drawn.cpu().numpy()

    # -- outputs -------------------------------------------------------------------------------------------------
    def _emit(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Record each row's token; finish rows that sampled a stop token or ran out of tokens or context."""
        g = self.gen[rows]
        now = time.perf_counter()
        first = g == 0
        if first.any():
            self.t_first[rows[first]] = now
        if self.config.timing and not first.all():
            self.stats.itl.append(now - self.t_last[rows[~first]])
        self.t_last[rows] = now
        self.out[rows, g] = tokens
        g += 1
        self.gen[rows] = g
        self.last_token[rows] = tokens
        self.stats.tokens += rows.size
        stop = (self.stop[rows] == tokens[:, None]).any(1)
        done = stop | self._out_of_room(rows, g)
        if done.any():
            for i in np.flatnonzero(done).tolist():
                self._finish(int(rows[i]), FinishReason.STOP if stop[i] else FinishReason.LENGTH)

    def _out_of_room(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """[n] bool: with ``tokens`` generated, the row has no token left (max_tokens) or no context left."""
        return (tokens >= self.max_tokens[rows]) | (self.prompt_len[rows] + tokens >= self.max_seq_len)

    def _finish(self, h: int, reason: FinishReason) -> None:
        live = self.live.pop(h)
        rid = live.pend.rid
        n = int(self.gen[h])
        ttft = self.t_first[h] - self._t_submit.pop(rid, float("nan"))
        itl = (self.t_last[h] - self.t_first[h]) / (n - 1) if n > 1 else float("nan")
        result = Result(rid, int(self.prompt_len[h]), tuple(self.out[h, :n].tolist()), reason, ttft, itl)
        if self.resident:
            self.state = release(self.state, h)
        self._free_pages(h)
        for s in self.streams.kv.values():
            s.lengths[h] = 0
        if self.rec is not None:
            self.rec.give(int(self.streams.recurrent_slot[h]))
            self.streams.recurrent_slot[h] = 0
        self.handles.give(h)
        self.scheduler.finish(h)
        self.serial[h] += 1  # a step in flight that ran it drops its token
        self._tok_pos[h] = -1
        if live.saved is not None:  # offloaded: its pages are host copies, dropped with it
            live.saved = None
        # (a crossing page taken early for it, with the pre-plan, went back with its pages; the admit transaction
        # still lists it, and a rollback skips it: it checks the page is still the handle's last one)
        self.stats.finished += 1
        self._hand_over(result)

    def _hand_over(self, result: Result) -> None:
        """A finished request's result goes to ``on_finish`` (and its id is forgotten), or waits in ``results``."""
        if self.on_finish is not None:
            self._rids.discard(result.request_id)
            self.on_finish(result)
        else:
            self.results[result.request_id] = result

    # -- the request table ---------------------------------------------------------------------------------------
    def pop_result(self, request_id: str) -> Result:
        """Hand a finished request's result over and forget its id (it may be submitted again). KeyError when it
        has no result waiting: unknown, not finished yet, or already handed over."""
        try:
            result = self.results.pop(request_id)
        except KeyError:
            state = "has not finished" if request_id in self._rids else "is not known to this engine"
            raise KeyError(f"request {request_id!r} {state}: no result to hand over") from None
        self._rids.discard(request_id)
        return result

    def output(self, request_id: str) -> tuple[int, ...]:
        """The tokens a request has so far (for streaming): none while it waits, its result's once it finished."""
        if request_id in self.results:
            return self.results[request_id].tokens
        h = next((h for h, live in self.live.items() if live.pend.rid == request_id), None)
        if h is not None:
            return tuple(self.out[h, : self.gen[h]].tolist())
        if request_id in self._rids:
            return ()
        raise KeyError(f"request {request_id!r} is not known to this engine (never submitted, or handed over)")

    def abort(self, request_id: str) -> bool:
        """End a request wherever it is (waiting, mid-prefill, decoding, its token in flight, offloaded) with
        FinishReason.ABORT and the tokens it has so far. Its pages, recurrent slot and handle come back at once; its
        planner slot cools until the commit of the last step that read it, and a token of it still in flight is
        dropped when that step lands. Returns False when it had already finished (its result waits in
        ``results``); KeyError for an id the engine does not know (never submitted, or handed over)."""
        if request_id not in self._rids:
            raise KeyError(f"request {request_id!r} is not known to this engine (never submitted, or handed over)")
        if request_id in self.results:
            return False
        for pend in self.scheduler.waiting:
            if pend.rid == request_id:
                self.scheduler.waiting.remove(pend)
                self._t_submit.pop(request_id, None)
                self.stats.finished += 1
                self._hand_over(Result(request_id, len(pend.request.prompt), (), FinishReason.ABORT))
                return True
        h = next(h for h, live in self.live.items() if live.pend.rid == request_id)
        self._finish(h, FinishReason.ABORT)
        return True

    # -- pre-plan ------------------------------------------------------------------------------------------------
    def _preplan_next(self) -> None:
        """Take the next step's crossing pages now and, for a decode step, plan it: the resident plan, or under
        overlap the host arm's fill (copied now, behind the step in flight) and fa2 plan."""
        batch = self.scheduler.compose(self._free())
        if self._must_land(batch):  # its rows may finish: plan the step that follows with what they leave
            self._drain()
            batch = self.scheduler.compose(self._free())
        if not self.has_work():
            return
        rows = batch.rows
        if rows.size == 0:
            return
        need = self._crossing_need(rows)
        if any(need[k] > self.page_pools[k].free for k in need):
            return  # the step itself will offload
        txn = AdmitTxn()
        self._take_crossings(rows, txn)
        self._txn = txn
        if batch.host_planned or not (self.resident or self.config.overlap):
            return
        seq = self._next_seq()
        if self.resident:
            t0 = time.perf_counter_ns()
            state, program = plan(self.state, Step(rows, batch.bucket, seq), self.streams)
            dt = time.perf_counter_ns() - t0
            self._preplan = PrePlan(rows.tobytes(), batch.bucket, self.state, state, program, seq, dt)
        else:
            fill_ns, attn_ns = self._host_fill(rows, batch.bucket)
            self._preplan = EarlyFill(rows.tobytes(), batch.bucket, EarlyFill.of(self, rows), seq, fill_ns,
                                        attn_ns)  # fmt: skip
        self.stats.preplans += 1

