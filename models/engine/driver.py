"""The engine: its config, and the decode loop that composes its parts.

``Engine(adapter, EngineConfig(planning=...))``; ``submit(request)`` validates and queues; ``step()`` runs one step;
``run(requests)`` drives steps until every request has finished. The parts, one job each:

* ``scheduler.Scheduler``: what runs next (decode rows, prefill chunks, admits, offload victims);
* ``admission.Admission``: KV pages, handles and recurrent slots, the host streams, a step's admit transaction and
  its rollback, offload and reload;
* ``table.RequestTable``: every request by handle and by id, its tokens and limits, results and their hand-over;
* ``planning.ResidentArm`` / ``planning.HostArm`` (``DecodeArm``): how a decode step is planned, early or now;
* ``graphs``: each bucket's attention, capture plan and captured graphs; ``launcher.Launcher``: input ids, replay,
  the step in flight and its readback; ``prefill.Prefill``: a step's prefill pass and first tokens.

Each returns a record of what it did, and ``EngineStats.add`` sums it.

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

Input ids: a step's sampled tokens stay on the device; a device-ids graph takes each row's id from there, and the
host copies ids only when they change (``launcher``).

**Overlap** (``EngineConfig(overlap=True)``, either arm, any attention): since a decode step's inputs are on the
device (its input ids are the last step's sampled tokens there), step N+1 is launched before step N's tokens are read,
and the host reads them while the device runs N+1; it then pre-plans N+2 (the resident plan, or the host arm's fill
and fa2 schedule) while N+1 runs. A request whose last token is in flight is RETIRED, so no later step runs it past its
length; a request that stops on a token at N has run N+1 too, and that token is dropped (rows are matched by the
admission serial they were launched with). A step with no decode rows, or with prefill work it runs itself (not
async prefill), first lands the step in flight (drain). The host arm's pre-plan writes pinned buffers that H2D copies
read asynchronously: the fill's ring and fa2's schedule wait on the event of the copy that last read them, which ran
before the step landed just before the pre-plan (``host-overlap`` in the benchmarks: what engines with asynchronous
scheduling run).

**Async prefill** (``EngineConfig.async_prefill``, on by default with CUDA): step 3's prefill chunks go to a pass
launched on a stream of its own (after the engine stream's work so far) and the step's decode rows run as a decode
step beside it; the chunks' requests stay PREFILLING until the host sees the pass landed (polled at the start and the
end of each step), which then emits their first tokens and marks their rows stale. No prefill work is composed while
a pass is in flight; a step with nothing else to run waits for it; an abort or an offload lands it first.

The pre-plan's staged crossings name pages. Whatever gives pages back (a refused admit's rollback, an offload, a
finish) drops the pre-plan if its program names one of them: otherwise a retried step with the same rows would reuse
it and write its token into a page the row no longer holds (the seed's refused-admit bug).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from functools import partial

import attrs
import numpy as np
import torch

from kernels.choices import KernelChoices
from models.engine.adapters import Adapter
from models.engine.admission import Admission
from models.engine.graphs import capture_graphs, capture_plans, make_attention, step_fn
from models.engine.launcher import InFlight, Launcher
from models.engine.planning import Checked, Early, HostArm, HostTables, Planning, ResidentArm
from models.engine.pools import AdmitRefused, AdmitTxn, pool_layout
from models.engine.prefill import PassInFlight, Prefill
from models.engine.requests import FinishReason, InvalidRequest, Limits, Request, Result, validate
from models.engine.sampler import Sampler
from models.engine.scheduler import Batch, Chunk, Order, Pending, Scheduler, decode_buckets
from models.engine.stats import EngineStats
from models.engine.table import RequestTable
from models.layers.decode_attention import Backend
from resplan import Executor, distinct_streams

__all__ = ["Ahead", "Engine", "EngineConfig", "EngineStats", "Planning"]


def _positive_or_none(_inst, attribute, value) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be > 0 (or None), got {value}")


def _negative_or_none(_inst, attribute, value) -> None:
    if value is not None and value >= 0:
        raise ValueError(f"{attribute.name} must be < 0 (more urgent than the passes' stream at 0), or None; got "
                         f"{value}")  # fmt: skip


def _positive(_inst, attribute, value) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


def _token_budget(_inst, attribute, value) -> None:
    if value is not None and value != "auto" and (not isinstance(value, int) or value <= 0):
        raise ValueError(f"{attribute.name} must be > 0, None (whole prompts) or 'auto', got {value!r}")


# token_budget "auto" (EngineConfig.prefill_budget), by where the passes run; both measured on the H200 under a burst
# and Poisson traffic, and beside the decode steps under long prompts too (README, "Prefill")
IN_STEP_TOKEN_BUDGET = 1024  # every decode row waits for the pass: the best of 512 / 1024 / 2048
BESIDE_TOKEN_BUDGET = 2048  # the rows run beside it: long prompts' TTFT p99 81 -> 59 ms at 1024 -> 2048


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
    # prefill tokens a step; None: whole prompts; "auto": prefill_budget's, by where the passes run
    token_budget: int | str | None = attrs.field(default="auto", validator=_token_budget)
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
    prefill_graphs: int = attrs.field(default=0, validator=attrs.validators.ge(0))  # token buckets of prefill graphs
    prefill_graph_tokens: int = attrs.field(default=8192, validator=_positive)  # the largest; longer passes eager
    # a step with prefill work runs its decode rows in the prefill pass, one token each (counted in token_budget),
    # instead of a decode graph beside it: one forward a mixed step
    decode_in_pass: bool = False
    # a step's prefill pass runs on a CUDA stream of its own while decode steps go on beside it; its requests join the
    # decode rows once the host sees it landed (one pass in flight; on a CPU the pass runs at launch and lands at the
    # step's end). None: on where the device is CUDA and the decode rows are not in the pass (README, "Prefill beside
    # decode")
    async_prefill: bool | None = None
    # the CUDA priority of a stream of the engine's own that its steps run on (< 0: more urgent than the passes'
    # stream, at 0), so that a decode step beside a pass is scheduled first; None: the caller's stream. The caller's
    # stream does not wait for the engine's: synchronize before reading its device state
    decode_priority: int | None = attrs.field(default=None, validator=_negative_or_none)
    kernels: KernelChoices = KernelChoices()  # the decode step's kernel forms: folds, PDL, the weight stream

    def prefill_beside(self) -> bool:
        """Whether the engine runs its passes beside its decode steps: ``async_prefill``, or (None) where the device
        is CUDA and the decode rows are not in the pass."""
        if self.async_prefill is not None:
            return self.async_prefill
        return torch.device(self.device).type == "cuda" and not self.decode_in_pass

    def prefill_budget(self) -> int | None:
        """The prefill tokens a step may run: ``token_budget``, or ("auto") BESIDE_TOKEN_BUDGET where the passes run
        beside the decode steps and IN_STEP_TOKEN_BUDGET where every decode row waits for them."""
        if self.token_budget != "auto":
            return self.token_budget
        return BESIDE_TOKEN_BUDGET if self.prefill_beside() else IN_STEP_TOKEN_BUDGET


@attrs.define
class Ahead:
    """The next step, prepared while this one's device work runs (``EngineConfig.preplan``): its decode rows'
    crossing pages, taken as an admit transaction that the step's admit continues, and its decode plan made early
    (the arm's). Each is taken once: the admit takes ``txn``, the step ``early``; pages given back meanwhile that
    ``early`` names void it."""

    txn: AdmitTxn | None = None
    early: Early | None = None

    def take_txn(self) -> AdmitTxn:
        txn, self.txn = self.txn or AdmitTxn(), None
        return txn

    def take_early(self) -> Early | None:
        early, self.early = self.early, None
        return early


@attrs.frozen(eq=False)
class InPass:
    """A prefill pass in flight beside decode steps (``EngineConfig.async_prefill``): its chunks and its launch."""

    chunks: tuple[Chunk, ...]
    launch: PassInFlight


def _handles(chunks: tuple[Chunk, ...]) -> np.ndarray:
    """[n] int64: the chunks' handles, in order."""
    return np.array([c.handle for c in chunks], np.int64)


class Engine:
    """Serves requests on one adapter: ``submit``, then ``step`` until ``has_work`` is False (or ``run``). It composes
    its parts: the scheduler, admission (pools and streams), the request table, the decode arm, the launcher and the
    prefill pass; each returns a record of what it did, summed into ``stats``."""

    def __init__(self, adapter: Adapter, config: EngineConfig | None = None) -> None:
        cfg = config or EngineConfig()
        self.adapter = adapter
        self.config = cfg
        refusal = adapter.prefill_capture_refusal() if cfg.prefill_graphs else None
        if refusal is not None:
            raise ValueError(f"prefill_graphs: {adapter.name} cannot capture its prefill pass: {refusal}; use "
                             "prefill_graphs=0")  # fmt: skip
        if cfg.max_seq_len > adapter.max_context:
            raise ValueError(f"max_seq_len {cfg.max_seq_len} is longer than {adapter.name}'s context of "
                             f"{adapter.max_context} tokens")  # fmt: skip
        H = cfg.max_running
        if cfg.max_bucket is not None and cfg.max_bucket > H:
            raise ValueError(f"max_bucket {cfg.max_bucket} is more than max_running {H}: no step has more rows than "
                             "running requests")  # fmt: skip
        widest = cfg.max_bucket or H
        if cfg.decode_in_pass and cfg.async_prefill:
            raise ValueError("decode_in_pass and async_prefill: rows riding in a pass would wait for it; choose one")
        budget = cfg.prefill_budget()
        if cfg.decode_in_pass and budget is not None and budget <= widest:
            raise ValueError(f"decode_in_pass: token_budget {budget} leaves no prompt token beside "
                             f"{widest} decode rows; give it more than max_bucket (or max_running)")  # fmt: skip
        if cfg.decode_priority is not None and torch.device(cfg.device).type != "cuda":
            raise ValueError(f"decode_priority is a CUDA stream priority; device {cfg.device} has no streams")
        w = next(adapter.model.parameters())
        if cfg.dtype is not None and getattr(torch, cfg.dtype) != w.dtype:
            raise ValueError(f"EngineConfig.dtype is {cfg.dtype} but {adapter.name}'s weights are {w.dtype}: build the "
                             "adapter in that dtype, or leave dtype None")  # fmt: skip
        self.device = device = torch.device(cfg.device)
        self.dtype = w.dtype  # weights, KV caches, the attention's inputs
        self.max_seq_len = cfg.max_seq_len
        ps = cfg.page_size
        # -- pools, streams, admission -------------------------------------------------------------------------------
        self.layout, counts = pool_layout(adapter.pools, ps, H, self.max_seq_len, cfg.num_pages, adapter.positions_pool,
                                          adapter.recurrent)  # fmt: skip
        self.append_keys = tuple(p.key for p in self.layout.append_pools)
        self.buckets = decode_buckets(cfg.max_bucket or H)
        self.scheduler = Scheduler(H, self.buckets, cfg.order, budget, self.append_keys,
                                   rows_in_budget=cfg.decode_in_pass)  # fmt: skip
        rec_slots = cfg.rec_slots if cfg.rec_slots is not None else H + 1
        self.model_state = adapter.allocate(counts, ps, rec_slots, device, w.dtype)
        self.admission = Admission(self.layout, counts, H, rec_slots if adapter.recurrent else None, self.scheduler,
                                   partial(adapter.kv_caches, self.model_state), device)  # fmt: skip
        self.admission.on_give = self._pages_given
        self.streams = self.admission.streams
        self.table = RequestTable(H, self.max_seq_len)
        # -- attention, capture plans, graphs, the decode arm --------------------------------------------------------
        self.attn = make_attention(cfg.attention, adapter, self.layout, self.buckets, ps, device, w.dtype, cfg.kernels)
        self.refusal, self.plans = capture_plans(adapter, self.layout, self.buckets, self.attn,
                                                 cfg.planning is Planning.RESIDENT)  # fmt: skip
        self.resident = cfg.planning is Planning.RESIDENT and self.refusal is None
        self.executor = Executor(self.layout, self.buckets, device)
        self.sampler = Sampler(adapter.vocab_size, device)
        self.launcher = Launcher(self.buckets, H, device, cfg.timing)
        self.tables = HostTables(self.layout, self.executor, self.plans, self.attn)

        def make_fn(b: int, greedy: bool, resident: bool) -> Callable[[], None]:
            return step_fn(adapter, self.model_state, self.executor, self.launcher, self.sampler, self.attn[b],
                           cfg.kernels, b, greedy, resident, device_ids=resident or cfg.overlap)  # fmt: skip

        # three distinct streams (torch's pool hands out 32 in turn): the decode graphs' and the passes' capture
        # streams, and the stream an async pass runs on; graphs or GEMMs that may run at once never share a cuBLAS
        # workspace (resplan.Graph)
        decode_capture, prefill_capture, pass_stream = (distinct_streams(device, 3) if device.type == "cuda"
                                                        else (None, None, None))  # fmt: skip
        W = self.layout.span(self.append_keys[0]).width
        self.host_graphs, self.graphs = capture_graphs(self.plans, self.attn, W, device, make_fn, self.resident,
                                                       decode_capture)  # fmt: skip
        self.seqs = itertools.count(1)  # step serials (resplan's seq), one a step and one a plan made early
        self.arm = (ResidentArm(self.layout, self.plans, H, self.executor, self.tables, self.streams, self.seqs,
                                cfg.row_check) if self.resident
                    else HostArm(self.tables, self.streams, self.admission.n_pages, self.append_keys, self.seqs,
                                 cfg.overlap))  # fmt: skip
        self.prefill = Prefill(adapter, self.model_state, self.sampler, self.layout, self.streams,
                               self.admission.n_pages, ps, cfg.prefill_graphs, cfg.prefill_graph_tokens, H, device,
                               cfg.timing, prefill_capture)  # fmt: skip
        self.async_prefill = cfg.prefill_beside()
        self.prefill_stream = pass_stream if self.async_prefill else None
        self.in_pass: InPass | None = None  # async_prefill: the pass in flight
        self.limits = Limits(adapter.name, adapter.vocab_size, self.max_seq_len)
        self.stats = EngineStats()
        self.ahead = Ahead()
        self._arrivals = itertools.count()
        # decode_priority: the engine's own stream, after everything its build queued on the caller's
        self.step_stream = (torch.cuda.Stream(device, priority=cfg.decode_priority)
                            if cfg.decode_priority is not None else None)  # fmt: skip
        if self.step_stream is not None:
            self.step_stream.wait_stream(torch.cuda.current_stream(device))

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

    # -- submission and results ----------------------------------------------------------------------------------
    def submit(self, request: Request, arrived: float | None = None) -> str:
        """Validate and queue a request; returns its id. Raises InvalidRequest, and nothing else changes. ``arrived``:
        when the request reached the server (``time.perf_counter()``; default now), which its TTFT counts from."""
        validate(request, self.limits)
        self.adapter.validate(request)
        rid = self.table.register(request, arrived)
        ps = self.config.page_size
        ctx = self.adapter.read_tokens(request)
        pages = tuple(
            (k, -(-(len(request.prompt) if k in self.append_keys else ctx[k]) // ps)) for k in self.admission.page_pools
        )
        self.scheduler.waiting.append(Pending(rid, request, next(self._arrivals), pages))
        return rid

    @property
    def on_finish(self) -> Callable[[Result], None] | None:
        """Called with each result as its request finishes (its id is then forgotten); None: results wait in
        ``results`` for ``pop_result``."""
        return self.table.on_finish

    @on_finish.setter
    def on_finish(self, fn: Callable[[Result], None] | None) -> None:
        self.table.on_finish = fn

    @property
    def results(self) -> dict[str, Result]:
        """Finished requests' results not handed over yet, by id."""
        return self.table.results

    def pop_result(self, request_id: str) -> Result:
        """Hand a finished request's result over and forget its id (it may be submitted again). KeyError when it
        has no result waiting: unknown, not finished yet, or already handed over."""
        return self.table.pop_result(request_id)

    def output(self, request_id: str) -> tuple[int, ...]:
        """The tokens a request has so far (for streaming): none while it waits, its result's once it finished."""
        return self.table.output(request_id)

    def has_work(self) -> bool:
        """Requests wait or run, or a launched step or pass is still to land (its rows may all have ended meanwhile)."""
        return (bool(self.scheduler.waiting) or self.scheduler.admitted > 0 or self.launcher.inflight is not None
                or self.in_pass is not None)  # fmt: skip

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

    def abort(self, request_id: str) -> bool:
        """``_abort`` on the engine's stream (``decode_priority``), or the caller's."""
        return self._on_step_stream(self._abort, request_id)

    def _abort(self, request_id: str) -> bool:
        """End a request wherever it is (waiting, mid-prefill, decoding, its token in flight, offloaded) with
        FinishReason.ABORT and the tokens it has so far. Its pages, recurrent slot and handle come back at once; its
        planner slot cools until the commit of the last step that read it, and a token of it still in flight is
        dropped when that step lands. Returns False when it had already finished (its result waits in
        ``results``); KeyError for an id the engine does not know (never submitted, or handed over)."""
        table = self.table
        if request_id not in table.rids:
            raise KeyError(f"request {request_id!r} is not known to this engine (never submitted, or handed over)")
        if request_id in table.results:
            return False
        self._land_pass(wait=True)  # its pages and slot may be the pass's, and go back now
        for pend in self.scheduler.waiting:
            if pend.rid == request_id:
                self.scheduler.waiting.remove(pend)
                table.t_submit.pop(request_id, None)
                self.stats.finished += 1
                table.hand_over(Result(request_id, len(pend.request.prompt), (), FinishReason.ABORT))
                return True
        self._finish(table.handle_of(request_id), FinishReason.ABORT)
        return True

    # -- one step ------------------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one step (on the engine's stream with ``decode_priority``, else the caller's); False when there was
        nothing to run."""
        return self._on_step_stream(self._step)

    def _on_step_stream(self, fn: Callable, *args):
        """``fn(*args)`` on the engine's stream (``decode_priority``), else on the caller's, with no stream context at
        all (entering ``torch.cuda.stream(None)`` took ~3 us on the CPU box: on every step, that is not nothing)."""
        if self.step_stream is None:
            return fn(*args)
        with torch.cuda.stream(self.step_stream):
            return fn(*args)

    def _step(self) -> bool:
        if not self.has_work():
            return False
        t0 = time.perf_counter_ns()
        self._land_pass(wait=False)
        self._reload()
        admitted, landed_ns = self._admit_step()
        if admitted is None:  # landing the step (or pass) in flight finished the last requests
            self.stats.decode_ns += time.perf_counter_ns() - t0
            return True
        batch, chunks = admitted
        early = self.ahead.take_early()
        if chunks and self.async_prefill:  # the pass goes on its stream; the rows are a decode step beside it
            self._launch_pass(chunks)
            batch = Batch(batch.rows, batch.bucket, (), ())
            if not batch.rows.size:
                self.stats.prefill_steps += 1
        if batch.host_planned:
            self._host_step(batch, chunks)
        elif batch.rows.size:
            self._decode_step(batch, early)
        self.stats.steps += 1
        self._land_pass(wait=False)
        if self.config.preplan:
            self.ahead = self._prepare_next()
        if batch.rows.size and not batch.host_planned:  # the whole iteration: a pre-plan is work a later step saves
            self.stats.decode_ns += time.perf_counter_ns() - t0
        else:  # the wait for a decode step landed before this one belongs to that decode step
            self.stats.decode_ns += landed_ns
            if batch.rows.size:
                self.stats.mixed_ns += time.perf_counter_ns() - t0 - landed_ns
        return True

    def _decode_step(self, batch: Batch, early: Early | None) -> None:
        """Prepare (plan and flush, or fill), launch, advance the host's lengths, commit; land now, or (overlap) land
        the step before and leave this one in flight."""
        rows, b = batch.rows, batch.bucket
        prepared = self.arm.prepare(rows, b, early)
        self.stats.add(prepared)
        greedy = not self.table.sampling[rows].any()
        f = self._launch(self.graphs[self.plans[b], greedy], b, rows, self.arm.device_ids, decode=True)
        self._advance(rows)
        self._count_check(self.arm.ran(rows, b, prepared.seq))
        self.scheduler.ran(rows, prepared.seq)
        self.stats.decode_steps += 1
        self.stats.decode_beside_pass += self.in_pass is not None
        self.stats.decode_rows += rows.size
        if not self.config.overlap:
            self._land(f)
            return
        last = self.table.out_of_room(rows, self.table.issued[rows])
        if last.any():
            self.scheduler.retire(rows[last])
        prev, self.launcher.inflight = self.launcher.inflight, f
        if prev is not None:
            self.stats.overlapped += 1
            self._land(prev)

    def _host_step(self, batch: Batch, chunks: tuple[Chunk, ...]) -> None:
        """Prefill chunks, and the decode rows host-planned beside them (a mixed step): in a decode graph launched
        before the pass, or (``decode_in_pass``) in the pass itself, each row its last token at its stream's end
        (the step before has landed: those tokens are the host's), sampled, advanced and emitted as a decode step's
        rows are, its next id then the host's."""
        seq = next(self.seqs)
        rows, b = batch.rows, batch.bucket
        in_pass = rows if chunks and self.config.decode_in_pass else rows[:0]
        f = None
        if rows.size and not in_pass.size:
            self.tables.fill(self.streams, rows, b, seq)
            greedy = not self.table.sampling[rows].any()
            f = self._launch(self.host_graphs[self.plans[b], greedy], b, rows, self.config.overlap, decode=False)
            self._advance(rows)
            self.scheduler.ran(rows, seq)
        prefilled = self.prefill.run(chunks, [self.table.live[c.handle].pend.request for c in chunks], in_pass,
                                     self.table.last_token[in_pass])  # fmt: skip
        self.stats.add(prefilled)
        if in_pass.size:
            self.table.issued[in_pass] += 1
            self._advance(in_pass)
            self.scheduler.ran(in_pass, seq)
            self.launcher.forget(in_pass)
            self.stats.pass_rows += in_pass.size
            self.stats.rows_decoded += in_pass.size
        self._chunks_prefilled(chunks, prefilled.ended, seq)
        self.arm.prefilled(np.concatenate([rows, _handles(chunks)]), seq)
        if rows.size:
            self.stats.mixed_steps += 1
        else:
            self.stats.prefill_steps += 1
        if f is not None:
            self._land(f)
        if in_pass.size:
            self._emit(in_pass, prefilled.decoded)
        if prefilled.ended.size:
            self._emit(prefilled.ended, prefilled.first_tokens)

    def _prepare_next(self) -> Ahead:
        """Take the next step's crossing pages now and, for a decode step, let the arm prepare it early: the resident
        plan, or under overlap the host arm's fill (copied now, behind the step in flight) and fa2 schedule. (Under
        async_prefill a step's decode rows are a decode step even beside a pass.)"""
        batch = self._compose()
        if self._must_land(batch):  # its rows may finish: prepare the step that follows with what they leave
            self._drain()
            batch = self._compose()
        rows = batch.rows
        if not self.has_work() or rows.size == 0:
            return Ahead()
        if not self.admission.crossings_fit(rows):
            return Ahead()  # the step itself will offload
        txn = AdmitTxn()
        self.admission.take_crossings(rows, txn)
        if batch.host_planned and not self.async_prefill:
            return Ahead(txn)
        early = self.arm.prepare_early(rows, batch.bucket)
        self.stats.preplans += early is not None
        return Ahead(txn, early)

    # -- prefill beside decode (async_prefill) --------------------------------------------------------------------
    def _launch_pass(self, chunks: tuple[Chunk, ...]) -> None:
        """Launch the chunks' pass on the prefill stream (after the work queued so far: pages and slots a request gave
        back may still be written by its last decode step); its requests stay PREFILLING until it lands."""
        requests = [self.table.live[c.handle].pend.request for c in chunks]
        self.in_pass = InPass(chunks, self.prefill.launch(chunks, requests, stream=self.prefill_stream))

    def _land_pass(self, wait: bool) -> None:
        """Land the pass in flight if it has finished (``wait``: in any case): its chunks count as prefilled, the
        rows it wrote are stale in the store, and the prompts it ended emit their first tokens and decode from the
        next step on."""
        p = self.in_pass
        if p is None or not (wait or p.launch.ready()):
            return
        self.in_pass = None
        prefilled = self.prefill.land(p.launch)
        self.stats.add(prefilled)
        seq = next(self.seqs)
        self._chunks_prefilled(p.chunks, prefilled.ended, seq)
        self.arm.prefilled(_handles(p.chunks), seq)
        if prefilled.ended.size:
            self._emit(prefilled.ended, prefilled.first_tokens)

    def _chunks_prefilled(self, chunks: tuple[Chunk, ...], ended: np.ndarray, seq: int) -> None:
        """A pass ran ``chunks`` (at step ``seq``): the scheduler counts them, and the prompts it ended (``ended``)
        have issued their first token."""
        for chunk in chunks:
            self.scheduler.prefilled_chunk(chunk, seq)
        self.table.issued[ended] = 1

    # -- admission -----------------------------------------------------------------------------------------------
    def _compose(self) -> Batch:
        """The next step as the scheduler composes it: no prefill work while a pass is in flight."""
        return self.scheduler.compose(self.admission.free(), prefill=self.in_pass is None)

    def _must_land(self, batch: Batch) -> bool:
        """A step is in flight and ``batch`` may not run beside it: it has no decode rows, or prefill work that runs
        in the step (not on the prefill stream), or a request waits for the handle or pages a retiring one gives back
        when it lands (so it is admitted a step earlier)."""
        if self.launcher.inflight is None:
            return False
        sch = self.scheduler
        in_step = batch.host_planned and not self.async_prefill
        return batch.rows.size == 0 or in_step or bool(sch.waiting and sch.retiring())

    def _admit_step(self) -> tuple[tuple[Batch, tuple[Chunk, ...]] | None, int]:
        """Compose and admit the step, landing a step in flight it may not run beside, offloading under KV pressure
        and rolling back refused admits. Returns (batch, chunks), or None when landing left no work; and the
        nanoseconds spent landing."""
        landed_ns = 0
        while True:
            batch = self._compose()
            if self._must_land(batch):  # (an offload below can make room for an admission: composed again, it lands)
                t = time.perf_counter_ns()
                self._drain()
                landed_ns += time.perf_counter_ns() - t
                if not self.has_work():
                    return None, landed_ns
                continue
            if batch.empty and self.in_pass is not None:  # nothing runs beside the pass: wait for it
                t = time.perf_counter_ns()
                self._land_pass(wait=True)
                landed_ns += time.perf_counter_ns() - t
                if not self.has_work():
                    return None, landed_ns
                continue
            if batch.empty:
                raise RuntimeError(
                    f"engine stalled: {len(self.scheduler.waiting)} waiting, {self.scheduler.admitted} admitted "
                    f"({len(self.scheduler.offloaded)} offloaded), free pages {self.admission.free()}"
                )
            victim = self.admission.victim(batch)
            if victim is not None:
                self._offload(victim)
                continue
            txn = self.ahead.take_txn()
            admitted = 0
            try:
                self.admission.take_crossings(batch.rows, txn)
                chunks = list(batch.chunks)
                for pend, n in batch.admits:
                    h = self._admit(pend, txn)
                    chunks.append(Chunk(h, 0, n, n == len(pend.request.prompt)))
                    admitted += 1
                return (batch, tuple(chunks)), landed_ns
            except AdmitRefused:
                for h in self.admission.rollback(txn):  # newest first: their requests go back to the queue's head
                    self.scheduler.unadmit(h, self.table.unadmit(h))
                self.stats.refused_admits += 1
                # the retry admits only those ahead of the refused one, and no more until a request finishes
                self.scheduler.admit_quota = admitted

    def _admit(self, pend: Pending, txn: AdmitTxn) -> int:
        """A handle for ``pend`` in every part, then its pages and slot (either may refuse). Returns the handle."""
        h = self.admission.take_handle(txn)
        self.table.admit(h, pend, self.adapter.eos_token_ids)
        self.launcher.forget(h)
        self.scheduler.admit(h, pend)
        self.admission.admit(h, pend)
        return h

    def _pages_given(self, pages: np.ndarray) -> None:
        """Pages went back to a pool: a plan made early whose program names one of them is stale (else a retried step
        with the same rows would reuse it and write its token into a page the row no longer holds)."""
        early = self.ahead.early
        if early is not None and self.arm.names(early, pages):
            self.ahead.early = None
            self.stats.preplan_drops += 1

    def _offload(self, h: int) -> None:
        """Copy the request's KV pages to the host, give them back, and give its slot up."""
        self._land_pass(wait=True)  # the pass may be writing them
        self.table.live[h].saved = self.admission.offload(h)
        self.arm.offload(h)
        self.scheduler.offload(h)
        self.stats.offloads += 1

    def _reload(self) -> None:
        """Bring offloaded requests back, oldest offload first, while their pages fit beside a watermark."""
        sch = self.scheduler
        while sch.offloaded:
            h = sch.offloaded[0]
            live = self.table.live[h]
            if not self.admission.reload_fits(live.saved):
                return
            self.admission.reload(h, live.saved)
            live.saved = None
            sch.reload(h)
            self.stats.reloads += 1

    # -- launch, land, emit --------------------------------------------------------------------------------------
    def _launch(self, graph, b: int, rows: np.ndarray, device_ids: bool, decode: bool) -> InFlight:
        f, launched = self.launcher.launch(graph, b, rows, self.table.serial[rows], self.table.last_token, device_ids,
                                           decode)  # fmt: skip
        self.table.issued[rows] += 1
        self.stats.add(launched)
        return f

    def _land(self, f: InFlight) -> None:
        """Wait for a launched step's tokens and emit them (dropping rows whose request finished meanwhile)."""
        landed = self.launcher.land(f)
        self.stats.add(landed)
        rows, tokens = f.rows, landed.sampled
        keep = self.table.serial[rows] == f.serial
        if not keep.all():
            self.stats.discarded += int(np.count_nonzero(~keep))
            rows, tokens = rows[keep], tokens[keep]
        if rows.size:
            self._emit(rows, tokens)

    def _drain(self) -> None:
        """Land the step in flight, if any."""
        f, self.launcher.inflight = self.launcher.inflight, None
        if f is not None:
            self._land(f)

    def _advance(self, rows: np.ndarray) -> None:
        """The host advances its APPEND lengths by the rule the graph's commit follows."""
        for k in self.append_keys:
            self.streams.kv[k].lengths[rows] += 1

    def _count_check(self, checked: Checked | None) -> None:
        if checked is None:
            return
        st = self.stats
        st.add(checked)
        st.first_mismatches.extend(checked.first[: max(0, 10 - len(st.first_mismatches))])

    def _emit(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Record each row's token; finish rows that sampled a stop token or ran out of tokens or context."""
        emitted = self.table.emit(rows, tokens, self.config.timing)
        self.stats.tokens += emitted.n
        if emitted.itl is not None:
            self.stats.itl.append(emitted.itl)
        if emitted.done.any():
            for i in np.flatnonzero(emitted.done).tolist():
                self._finish(int(rows[i]), FinishReason.STOP if emitted.stopped[i] else FinishReason.LENGTH)

    def _finish(self, h: int, reason: FinishReason) -> None:
        """Handle h's request ends: every part lets it go, and its result is handed over."""
        result, live = self.table.finish(h, reason)
        self.arm.release(h)
        self.admission.release(h)  # (a crossing page taken early for it goes back with its pages; the admit
        self.scheduler.finish(h)  # transaction still lists it, and a rollback skips it: the page is not its any more)
        self.launcher.forget(h)
        live.saved = None  # offloaded: its pages are host copies, dropped with it
        self.stats.finished += 1
        self.table.hand_over(result)
