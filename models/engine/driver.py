"""The engine core: the step loop that composes the parts, and the interface a client drives.

``submit`` validates and queues a request, ``abort`` ends one wherever it is, ``step`` runs one step and returns what
it gave (``StepOutput``: new tokens by request id, finished requests' results), ``has_work`` says whether any is
left; ``run`` drives them over a list of requests. Each part is the only writer of its state: ``Scheduler`` (what
runs next), ``Admission`` (pages, handles, recurrent slots, the host streams), ``RequestTable`` (requests, tokens,
the outbox), the decode arm (``ResidentArm`` / ``HostArm``) and ``EarlyStep`` (the next step prepared early),
``Launcher`` (input ids, replay, the step in flight, readback), ``Prefill`` (a pass, or the one beside the steps).

One step: (1) land the pass beside the decode steps if it has finished, reload offloaded requests that fit; (2)
compose the step, offloading while its rows' crossings find no pages, and admit it as one transaction (a refusal
rolls it back whole, voids an early plan naming a page given back, and admits only the requests ahead of the refused
one); (3) prefill work goes beside the decode steps on its own stream (``PrefillPlacement.BESIDE``) or runs in the
step, its decode rows from a host fill before the pass or inside it (``IN_PASS``), and the rows a pass wrote are
stale in the store; (4) a decode step is prepared by the arm (resident plan and flush, or host fill), replayed,
advanced and committed; (5) tokens are read back and emitted, and finished requests let go by every part; (6) the
next step is prepared early (its crossing pages, the arm's plan or fill).

With overlap step N+1 is launched before N's tokens are read (its input ids are on the device): a request whose
last token is in flight RETIRES, and a request that stopped at N has N+1's token dropped (rows carry their admission
serial). A step with no decode rows, or prefill work in the step, lands the step in flight first.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable
from functools import partial

import numpy as np
import torch

from models.engine.adapters import Adapter
from models.engine.admission import Admission
from models.engine.config import DECODE_STREAM_PRIORITY, EngineConfig, Planning, PrefillPlacement, check_fits
from models.engine.graphs import build_graphs, engine_streams, priority_stream
from models.engine.launcher import InFlight, Launcher
from models.engine.planning import EarlyStep, HostFills, decode_arm
from models.engine.pools import pool_layout
from models.engine.prefill import Prefill, Prefilled
from models.engine.requests import FinishReason, InvalidRequest, Limits, Request, Result, StepOutput, validate
from models.engine.sampler import Sampler
from models.engine.scheduler import Batch, Chunk, Pending, Scheduler, decode_buckets
from models.engine.stats import EarlySteps, EngineStats, Events, StepKind, StepTime, Tokens
from models.engine.table import RequestTable
from models.layers.flashinfer_attention import Workspaces
from resplan import Executor


def _handles(chunks: tuple[Chunk, ...]) -> np.ndarray:
    """[n] int64: the chunks' handles, in order."""
    return np.array([c.handle for c in chunks], np.int64)


def _on_step_stream(method):
    """The method runs on the engine's own stream where it has one (``BESIDE_PRIORITY``), else with no stream
    context at all (entering even ``torch.cuda.stream(None)`` costs microseconds a step)."""

    @functools.wraps(method)
    def on_stream(self, *args):
        if self.step_stream is None:
            return method(self, *args)
        with torch.cuda.stream(self.step_stream):
            return method(self, *args)

    return on_stream


class Engine:
    """Serves requests on one adapter (module doc). ``stats`` sums what every part did."""

    def __init__(self, adapter: Adapter, config: EngineConfig | None = None) -> None:
        cfg = self.config = config or EngineConfig()
        check_fits(cfg, adapter)
        self.adapter, self.device = adapter, torch.device(cfg.device)
        H, ps, dtype = cfg.max_running, cfg.page_size, next(adapter.model.parameters()).dtype
        self.layout, counts = pool_layout(adapter.pools, ps, H, cfg.max_seq_len, cfg.num_pages, adapter.positions_pool,
                                          adapter.recurrent)  # fmt: skip
        self.buckets = decode_buckets(cfg.widest_bucket)
        self.scheduler = Scheduler(H, self.buckets, cfg.order, cfg.token_budget, self.layout.append_keys,
                                   rows_in_budget=cfg.prefill is PrefillPlacement.IN_PASS)  # fmt: skip
        rec_slots = cfg.rec_slots if cfg.rec_slots is not None else H + 1
        kernels, workspaces = cfg.kernels.resolved(), Workspaces(self.device)  # (the environment read once, here)
        self.model_state = adapter.allocate(counts, ps, rec_slots, self.device, dtype, workspaces)
        self.admission = Admission(self.layout, counts, H, rec_slots if adapter.recurrent else None,
                                   partial(adapter.kv_caches, self.model_state), self.device)  # fmt: skip
        self.streams = self.admission.streams  # (admission writes them; the arms and the passes read them)
        self.table = RequestTable(H, cfg.max_seq_len)
        self.executor = Executor(self.layout, self.buckets, self.device)
        self.sampler = Sampler(adapter.vocab_size, self.device)
        self.launcher = Launcher(self.buckets, H, self.device, cfg.timing)
        decode_capture, prefill_capture, pass_stream = engine_streams(self.device)
        self.graphs = build_graphs(adapter, self.model_state, self.layout, self.buckets, cfg.attention,
                                   cfg.planning is Planning.RESIDENT, self.executor, self.launcher, self.sampler,
                                   kernels, cfg.overlap, dtype, ps, workspaces, decode_capture)  # fmt: skip
        self.resident = self.graphs.resident
        self.fills = HostFills(self.layout, self.executor, self.graphs.plans, self.graphs.attn)
        self.seqs = itertools.count(1)  # step serials (resplan's seq), one a step and one a plan made early
        self.arm = decode_arm(self.resident, self.graphs.plans, self.executor, self.fills, self.admission, self.seqs,
                              cfg.row_check, cfg.overlap)  # fmt: skip
        self.prefill = Prefill(adapter, self.model_state, self.sampler, self.layout, self.streams,
                               self.admission.n_pages, ps, cfg.prefill_graphs, cfg.prefill_graph_tokens, H, self.device,
                               cfg.timing, kernels, prefill_capture,
                               pass_stream if cfg.prefill.beside else None)  # fmt: skip
        self.limits = Limits(adapter.name, adapter.vocab_size, cfg.max_seq_len)
        self.stats = EngineStats()
        self.early = EarlyStep()
        self._arrivals = itertools.count()
        self.step_stream = (priority_stream(self.device, DECODE_STREAM_PRIORITY)
                            if cfg.prefill is PrefillPlacement.BESIDE_PRIORITY else None)  # fmt: skip

    @classmethod
    def build(cls, model: str, config: EngineConfig | None = None, seed: int = 0) -> Engine:
        """An engine serving the named model (random weights from ``seed``, in ``config.dtype`` or float32)."""
        from models.engine.adapters import build_adapter

        cfg = config or EngineConfig()
        return cls(build_adapter(model, seed, cfg.device, cfg.dtype or torch.float32), cfg)

    @classmethod
    def from_pretrained(cls, path, config: EngineConfig | None = None) -> Engine:
        """An engine serving a Hugging Face model directory (``models.engine.checkpoint``): its weights in
        ``config.dtype``, or the checkpoint's own; its end-of-sequence tokens stop every request that does not set
        ``ignore_eos``. Text in and out: ``models.engine.text.Tokenizer.from_pretrained(path)``."""
        from models.engine.checkpoint import load_adapter

        cfg = config or EngineConfig()
        return cls(load_adapter(path, cfg.device, cfg.dtype), cfg)

    # -- the interface -------------------------------------------------------------------------------------------
    def submit(self, request: Request, arrived: float | None = None) -> str:
        """Validate and queue a request; returns its id. Raises InvalidRequest, and nothing else changes. ``arrived``:
        when the request reached the server (``time.perf_counter()``; default now), which its TTFT counts from."""
        validate(request, self.limits)
        self.adapter.validate(request)
        rid = self.table.register(request, arrived)
        pages = self.admission.pages_needed(len(request.prompt), self.adapter.read_tokens(request))
        self.scheduler.enqueue(Pending(rid, request, next(self._arrivals), pages))
        return rid

    @_on_step_stream
    def abort(self, request_id: str) -> bool:
        """End a request wherever it is (waiting, mid-prefill, decoding, its token in flight, offloaded) with
        FinishReason.ABORT and the tokens it has so far; its result comes in the next step's output. Its pages,
        recurrent slot and handle come back at once; its planner slot cools until the commit of the last step that
        read it, and a token of it still in flight is dropped when that step lands. False when the id runs nothing
        (never submitted, or finished)."""
        if request_id not in self.table.rids:
            return False
        self._land_pass(wait=True)  # its pages and slot may be the pass's, and go back now
        pend = self.scheduler.drop_waiting(request_id)
        if pend is not None:
            self.stats.add(Events(finished=1))
            self.table.hand_over(self.table.abort_waiting(pend))
            return True
        h = self.table.handle_of(request_id)
        if h is not None:  # (else the landed pass finished it)
            self._finish(h, FinishReason.ABORT)
        return h is not None

    def step(self) -> StepOutput:
        """Run one step and hand over the tokens and results it gave (and any an abort gave since the last step)."""
        return self.table.take_output(self._step())

    def has_work(self) -> bool:
        """A step has something to run, or results wait to be handed over by the next step (an abort's)."""
        return self._runs() or self.table.has_output()

    def _runs(self) -> bool:
        """Requests wait or run, or a launched step or pass is still to land (its rows may all have ended meanwhile)."""
        return self.scheduler.has_work() or self.launcher.inflight is not None or self.prefill.in_flight is not None

    def run(self, requests: Iterable[Request], on_step: Callable[[StepOutput], None] | None = None):
        """Submit every request and step until all have finished: a Result per request, or the InvalidRequest that
        refused it (the others run on). ``on_step`` is called with every step's output."""
        ids: list[str | InvalidRequest] = []
        for r in requests:
            try:
                ids.append(self.submit(r))
            except InvalidRequest as e:
                ids.append(e)
        done: dict[str, Result] = {}
        while self.has_work():
            out = self.step()
            done.update((r.request_id, r) for r in out.finished)
            if on_step is not None:
                on_step(out)
        return [done.pop(i) if isinstance(i, str) else i for i in ids]

    # -- one step --------------------------------------------------------------------------------------------------
    @_on_step_stream
    def _step(self) -> bool:
        if not self._runs():
            return False
        t0 = time.perf_counter_ns()
        self._land_pass(wait=False)
        self._reload()
        admitted, landed_ns = self._admit_step()
        if admitted is None:  # landing the step (or pass) in flight finished the last requests
            self.stats.add(StepTime(decode_ns=time.perf_counter_ns() - t0))
            return True
        batch, chunks = admitted
        early = self.early.take_early()
        if chunks and self.config.prefill.beside:  # the pass goes on its stream (after the work queued so far: pages
            launched = self.prefill.launch_beside(chunks, self.table.requests(_handles(chunks)))  # given back may
            self.admission.prefilled(launched.chunks, launched.contexts)  # still be written by their last step)
            if not batch.rows.size:
                self.stats.add(StepKind(prefill_steps=1))
            batch = batch.decode_only()
        if batch.has_prefill:
            self._prefill_step(batch, chunks)
        elif batch.rows.size:
            self._decode_step(batch, early)
        self._land_pass(wait=False)
        if self.config.prepare_early:
            self.early = self._prepare_next()
        took = time.perf_counter_ns() - t0
        if batch.rows.size and not batch.has_prefill:  # the whole iteration: what it prepared early saves a later one
            self.stats.add(StepTime(steps=1, decode_ns=took))
        else:  # the wait for a decode step landed before this one belongs to that decode step
            mixed = took - landed_ns if batch.rows.size else 0
            self.stats.add(StepTime(steps=1, decode_ns=landed_ns, mixed_ns=mixed))
        return True

    def _admit_step(self) -> tuple[tuple[Batch, tuple[Chunk, ...]] | None, int]:
        """Compose and admit the step, landing a step or pass in flight it may not run beside (or waits for),
        offloading under KV pressure and composing again after a refused admit. Returns (batch, its chunks with the
        admitted requests' first ones), or None when landing left no work; and the nanoseconds spent landing."""
        landed_ns = 0
        while True:
            batch = self._compose()
            drain, wait_pass = self._must_land(batch), batch.empty and self.prefill.in_flight is not None
            if drain or wait_pass:  # (an offload below can make room for an admission: composed again, it lands)
                t = time.perf_counter_ns()
                self._drain() if drain else self._land_pass(wait=True)
                landed_ns += time.perf_counter_ns() - t
                if not self._runs():
                    return None, landed_ns
                continue
            if batch.empty:
                raise RuntimeError(f"engine stalled: {self.scheduler.describe()}, free pages {self.admission.free()}")
            if not self.admission.crossings_fit(batch.rows):
                self._offload(self.scheduler.victim(batch))
                continue
            admitted = self.admission.admit(batch.rows, batch.admits, self.early.take_txn())
            if admitted.refused is not None:  # rolled back whole: the retry admits those ahead of the refused one
                self._pages_given(admitted.given)
                self.scheduler.refused(admitted.ahead)
                self.stats.add(Events(refused_admits=1))
                continue
            chunks = list(batch.chunks)
            for h, (pend, n) in zip(admitted.handles, batch.admits, strict=True):
                self.table.admit(h, pend, self.adapter.eos_token_ids)
                self.launcher.forget(h)
                self.scheduler.admit(h, pend)
                chunks.append(Chunk(h, 0, n, n == len(pend.request.prompt)))
            return (batch, tuple(chunks)), landed_ns

    def _decode_step(self, batch: Batch, early) -> None:
        """Prepare, launch, advance the host's lengths, commit; land now, or (overlap) land the step before and
        leave this one in flight."""
        rows, b = batch.rows, batch.bucket
        seq, prepared = self.arm.prepare(rows, b, early)
        self.stats.add(prepared)
        f = self._launch(self.graphs.decode(b, self.table.greedy(rows)), b, rows, self.arm.device_ids,
                         decode=True)  # fmt: skip
        self.admission.advance(rows)
        self.stats.add_check(self.arm.ran(rows, b, seq))
        self.scheduler.ran(rows, seq)
        beside = int(self.prefill.in_flight is not None)
        if not self.config.overlap:
            self.stats.add(StepKind(decode_steps=1, decode_rows=rows.size, decode_beside_pass=beside))
            self._land(f)
            return
        last = self.table.last_in_flight(rows)
        if last.any():
            self.scheduler.retire(rows[last])
        prev = self.launcher.hold(f)
        self.stats.add(StepKind(1, rows.size, beside, overlapped=int(prev is not None)))
        if prev is not None:
            self._land(prev)

    def _prefill_step(self, batch: Batch, chunks: tuple[Chunk, ...]) -> None:
        """Prefill chunks in the step, and its decode rows beside them (a mixed step): from a host fill in a decode
        graph launched before the pass, or (``IN_PASS``) in the pass itself, each row its last token at its stream's
        end (the step before has landed: those tokens are the host's), its next id then the host's."""
        seq = next(self.seqs)
        rows, b = batch.rows, batch.bucket
        in_pass = self.config.prefill is PrefillPlacement.IN_PASS and bool(chunks)
        pass_rows = rows if in_pass else rows[:0]
        f = None
        if rows.size and not in_pass:
            self.fills.fill(self.streams, rows, b)
            f = self._launch(self.graphs.host(b, self.table.greedy(rows)), b, rows, self.config.overlap,
                             decode=False)  # fmt: skip
            self.admission.advance(rows)
            self.scheduler.ran(rows, seq)
        launched, prefilled = self.prefill.run(chunks, self.table.requests(_handles(chunks)), pass_rows,
                                               self.table.last_token[pass_rows])  # fmt: skip
        self.admission.prefilled(launched.chunks, launched.contexts)
        if pass_rows.size:
            self.table.launched(pass_rows)
            self.admission.advance(pass_rows)
            self.scheduler.ran(pass_rows, seq)
            self.launcher.forget(pass_rows)
            self.stats.add(Events(pass_rows=pass_rows.size, rows_decoded=pass_rows.size))
        self._prefilled(prefilled, seq, touched=rows)
        self.stats.add(StepKind(mixed_steps=1) if rows.size else StepKind(prefill_steps=1))
        if f is not None:
            self._land(f)
        if pass_rows.size:
            self._emit(pass_rows, prefilled.decoded)
        if prefilled.ended.size:
            self._emit(prefilled.ended, prefilled.first_tokens)

    def _prepare_next(self) -> EarlyStep:
        """The next step prepared now, while this one's device work runs: its decode rows' crossing pages and the
        arm's early plan (the resident plan, or under overlap the host arm's fill and fa2 schedule)."""
        batch = self._compose()
        if self._must_land(batch):  # its rows may finish: prepare the step that follows with what they leave
            self._drain()
            batch = self._compose()
        if not self._runs():
            return EarlyStep()
        early = EarlyStep.prepare(batch, self.admission, self.arm, not batch.has_prefill or self.config.prefill.beside)
        self.stats.add(EarlySteps(int(early.early is not None)))
        return early

    # -- passes --------------------------------------------------------------------------------------------------
    def _land_pass(self, wait: bool) -> None:
        """Land the pass beside the decode steps if it has finished (``wait``: in any case)."""
        prefilled = self.prefill.land_beside(wait)
        if prefilled is not None:
            self._prefilled(prefilled, next(self.seqs))
            if prefilled.ended.size:
                self._emit(prefilled.ended, prefilled.first_tokens)

    def _prefilled(self, prefilled: Prefilled, seq: int, touched: np.ndarray | None = None) -> None:
        """A pass landed (at step ``seq``): the scheduler counts its chunks, the prompts it ended have issued their
        first token, and the rows it (and a mixed step's host fill, ``touched``) wrote are stale in the store."""
        self.stats.add(prefilled.counts)
        self.scheduler.prefilled_chunks(prefilled.chunks, seq)
        self.table.started(prefilled.ended)
        handles = _handles(prefilled.chunks)
        self.arm.prefilled(handles if touched is None else np.concatenate([touched, handles]), seq)

    # -- admission -----------------------------------------------------------------------------------------------
    def _compose(self) -> Batch:
        """The next step as the scheduler composes it: no prefill work while a pass is in flight."""
        return self.scheduler.compose(self.admission.free(), prefill=self.prefill.in_flight is None)

    def _must_land(self, batch: Batch) -> bool:
        """A step is in flight and ``batch`` may not run beside it: it has no decode rows, or prefill work in the
        step, or a request waits for the handle or pages a retiring one gives back when it lands."""
        if self.launcher.inflight is None:
            return False
        in_step = batch.has_prefill and not self.config.prefill.beside
        return batch.rows.size == 0 or in_step or self.scheduler.waits_on_retiring()

    def _pages_given(self, pages: np.ndarray) -> None:
        """Pages went back to a pool: an early plan whose program names one is void (else a retried step with the
        same rows would reuse it and write its token into a page the row no longer holds)."""
        if self.early.given_back(pages):
            self.stats.add(Events(early_drops=1))

    def _offload(self, h: int) -> None:
        """Copy the request's KV pages to the host, give them back, and give its slot up."""
        self._land_pass(wait=True)  # the pass may be writing them
        self._pages_given(self.admission.offload(h))
        self.arm.release(h)
        self.scheduler.offload(h)
        self.stats.add(Events(offloads=1))

    def _reload(self) -> None:
        """Bring offloaded requests back, oldest offload first, while their pages fit beside a watermark."""
        while (h := self.scheduler.next_reload()) is not None:
            if not self.admission.reload_fits(h, self.scheduler.reload_watermark()):
                return
            self.admission.reload(h)
            self.scheduler.reload(h)
            self.stats.add(Events(reloads=1))

    # -- launch, land, emit, finish ----------------------------------------------------------------------------------
    def _launch(self, graph, b: int, rows: np.ndarray, device_ids: bool, decode: bool) -> InFlight:
        f, launched = self.launcher.launch(graph, b, rows, self.table.serial[rows], self.table.last_token, device_ids,
                                           decode)  # fmt: skip
        self.table.launched(rows)
        self.stats.add(launched)
        return f

    def _land(self, f: InFlight) -> None:
        """Wait for a launched step's tokens and emit them (the launcher drops rows whose request ended meanwhile)."""
        rows, tokens, landed = self.launcher.land(f, self.table.serial)
        self.stats.add(landed)
        if rows.size:
            self._emit(rows, tokens)

    def _drain(self) -> None:
        """Land the step in flight, if any."""
        f = self.launcher.take_inflight()
        if f is not None:
            self._land(f)

    def _emit(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Record each row's token; finish rows that sampled a stop token or ran out of tokens or context."""
        emitted = self.table.emit(rows, tokens, self.config.timing)
        self.stats.add(Tokens(emitted.n))
        if emitted.itl is not None:
            self.stats.sample_itl(emitted.itl)
        for i in np.flatnonzero(emitted.done).tolist():
            self._finish(int(rows[i]), FinishReason.STOP if emitted.stopped[i] else FinishReason.LENGTH)

    def _finish(self, h: int, reason: FinishReason) -> None:
        """Handle h's request ends: every part lets it go, and its result goes to the outbox."""
        result = self.table.finish(h, reason)
        self.arm.release(h)
        self._pages_given(self.admission.release(h))
        self.scheduler.finish(h)
        self.launcher.forget(h)
        self.stats.add(Events(finished=1))
        self.table.hand_over(result)
