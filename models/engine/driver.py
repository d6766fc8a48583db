"""The engine core (``core.EngineCore``): the interface a client drives, and the step loop that composes the parts.

Each part is the only writer of its state (models/engine/README.md says what each owns). A step asks them in order:
(1) land the pass beside the decode steps if it has finished, reload offloaded requests that fit; (2) compose the
step, offloading while its rows' crossings find no pages, and admit it as one transaction (a refusal rolls it back
whole and admits only the requests ahead of the refused one); (3) a decode step is prepared by the arm (resident
plan and flush, or host fill), replayed, advanced and committed; (4) prefill work goes beside the decode steps on its
own stream, launched after the step's decode graph and waiting only for the work queued before it, or runs in the
step (``PrefillPlacement``), and the rows a pass wrote are stale in the store; (5) tokens are read back and emitted,
and finished requests let go by every part; (6) the next step is prepared early.

With overlap step N+1 is launched before N's tokens are read (its input ids are on the device): a request whose
last token is in flight RETIRES, and a request that stopped at N has N+1's token dropped (rows carry their admission
serial). A step with no decode rows, or prefill work in the step, lands the step in flight first."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable
from functools import partial

import numpy as np
import torch

from models.engine.adapters import Adapter
from models.engine.admission import Admission, Admitted, PrefixSettings
from models.engine.config import DECODE_STREAM_PRIORITY, EngineConfig, Planning, PrefillPlacement, fit
from models.engine.core import run_requests
from models.engine.graphs import build_graphs, engine_streams, priority_stream
from models.engine.launcher import InFlight, Launcher
from models.engine.planning import EarlyStep, HostFills, decode_arm
from models.engine.pools import pool_layout
from models.engine.prefill import Prefill, Prefilled
from models.engine.requests import (
    EngineLoad,
    FinishReason,
    InvalidRequest,
    Limits,
    Request,
    Result,
    StepOutput,
    TokenLogprobs,
    stop_set,
    validate,
)
from models.engine.sampler import Sampler, SamplingMode
from models.engine.scheduler import Batch, Chunk, Pending, Scheduler, Status, decode_buckets, handles_of
from models.engine.stats import EARLY_STEP, NO_EARLY_STEP, EngineStats, Events, StepCounts, Tokens
from models.engine.table import RequestTable
from models.layers.flashinfer_attention import Workspaces
from resplan import Executor, KernelImpl


class Engine:
    """Serves requests on one adapter (module doc). ``stats`` sums what every part did."""

    def __init__(self, adapter: Adapter, config: EngineConfig | None = None) -> None:
        cfg = self.config = fit(config or EngineConfig(), adapter)
        self.adapter, self.device = adapter, torch.device(cfg.device)
        H, ps, dtype = cfg.max_running, cfg.page_size, next(adapter.model.parameters()).dtype
        self.layout, counts = pool_layout(adapter.pools, ps, H, cfg.max_seq_len, cfg.num_pages, adapter.positions_pool,
                                          adapter.recurrent)  # fmt: skip
        self.buckets = decode_buckets(cfg.widest_bucket)
        self.scheduler = Scheduler(H, self.buckets, cfg.order, cfg.token_budget, self.layout.append_keys,
                                   rows_in_budget=cfg.prefill is PrefillPlacement.IN_PASS)  # fmt: skip
        rec_slots = cfg.rec_slots if cfg.rec_slots is not None else H + 1
        kernels, workspaces = cfg.kernels.resolved(), Workspaces(self.device)  # (the environment read once, here)
        self.model_state = adapter.allocate(counts, ps, rec_slots + cfg.checkpoints, self.device, dtype, workspaces,
                                            saving=cfg.prefix_cache,  # (no save work in a pass without the cache)
                                            state_dtype=cfg.state_dtype)  # fmt: skip
        prefix = PrefixSettings.of(cfg, adapter, self.model_state, self.layout, rec_slots) if cfg.prefix_cache else None
        self.admission = Admission(self.layout, counts, H, rec_slots if adapter.recurrent else None,
                                   partial(adapter.kv_caches, self.model_state), self.device, prefix)  # fmt: skip
        self.streams = self.admission.streams  # (admission writes them; the arms and the passes read them)
        self.table = RequestTable(H, cfg.max_seq_len)
        self.executor = Executor(self.layout, self.buckets, self.device,
                                 KernelImpl.TRITON if kernels.runs_row_kernels(self.device.type == "cuda")
                                 else KernelImpl.REFERENCE)  # fmt: skip
        self.sampler = Sampler(adapter.vocab_size, self.device, kernels)
        self.launcher = Launcher(self.buckets, H, self.device, cfg.timing, cfg.tokens_per_launch)
        decode_capture, prefill_capture, pass_stream = engine_streams(self.device)
        self.graphs = build_graphs(adapter, self.model_state, self.layout, self.buckets, cfg.attention,
                                   cfg.planning is Planning.RESIDENT, self.executor, self.launcher, self.sampler,
                                   kernels, cfg.overlap, dtype, ps, workspaces, decode_capture,
                                   mixed_steps=cfg.prefill is PrefillPlacement.IN_STEP,
                                   tokens=cfg.tokens_per_launch)  # fmt: skip
        self.resident = self.graphs.resident
        self.most_tokens = cfg.tokens_per_launch if self.resident else 1  # a decode launch's tokens a row, at most
        self.fills = HostFills(self.layout, self.executor, self.graphs.plans, self.graphs.attn)
        self.seqs = itertools.count(1)  # step serials (resplan's seq), one a step and one a plan made early
        self.arm = decode_arm(self.resident, self.graphs.plans, self.executor, self.fills, self.admission, self.seqs,
                              cfg.row_check, cfg.overlap)  # fmt: skip
        self.prefill = Prefill(adapter, self.model_state, self.sampler, self.layout, self.streams,
                               self.admission.n_pages, ps, cfg.prefill_graphs, cfg.prefill_graph_tokens, H, self.device,
                               cfg.timing, kernels, prefill_capture,
                               pass_stream if cfg.prefill.beside else None, cfg.largest_pass)  # fmt: skip
        self.limits = Limits(adapter.name, adapter.vocab_size, cfg.max_seq_len, tuple(adapter.eos_token_ids),
                             adapter.scores_prompts)  # fmt: skip
        self.stats, self.early, self._arrivals = EngineStats(), EarlyStep(), itertools.count()
        step_stream = (priority_stream(self.device, DECODE_STREAM_PRIORITY)
                       if cfg.prefill is PrefillPlacement.BESIDE_PRIORITY else None)  # fmt: skip
        # steps and aborts run on the engine's own stream where it has one; else in no stream context at all
        self._on_stream = contextlib.nullcontext if step_stream is None else partial(torch.cuda.stream, step_stream)

    @classmethod
    def build(cls, model: str, config: EngineConfig | None = None, seed: int = 0) -> Engine:
        """An engine serving the named model (random weights from ``seed``, in ``config.dtype`` or float32)."""
        from models.engine.adapters import build_adapter

        cfg = config or EngineConfig()
        return cls(build_adapter(model, seed, cfg.device, cfg.dtype or torch.float32), cfg)

    @classmethod
    def from_pretrained(cls, path, config: EngineConfig | None = None) -> Engine:
        """An engine serving a Hugging Face model directory (``models.engine.checkpoint``) in ``config.dtype`` or the
        checkpoint's own; its EOS tokens stop every request that does not ignore them. Text: ``text.Tokenizer``."""
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
        stops = stop_set(request.sampling, self.limits.eos_token_ids)
        page_size = self.config.page_size if self.config.prefix_cache else 0  # (its chain keys: hashed when needed)
        self.scheduler.enqueue(Pending(rid, request, next(self._arrivals), pages, stops, page_size))
        return rid

    def abort(self, request_id: str) -> bool:
        """End a request wherever it is with FinishReason.ABORT and its tokens so far; its result comes in the next
        step's output, its pages, slot and handle come back now. False when the id runs nothing."""
        if not self.table.knows(request_id):
            return False
        with self._on_stream():
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
        with self._on_stream():
            return self.table.take_output(self._step())

    def has_work(self) -> bool:
        """A step has something to run, or results wait to be handed over by the next step (an abort's)."""
        return self._runs() or self.table.has_output()

    def load(self) -> EngineLoad:
        """Requests waiting and running, KV pages in use (a server's metrics)."""
        return EngineLoad(*self.scheduler.load(), *self.admission.pages_in_use())

    def run(self, requests: Iterable[Request], on_step: Callable[[StepOutput], None] | None = None,
            ) -> list[Result | InvalidRequest]:  # fmt: skip
        """``core.run_requests`` on this engine: a Result per request, or the InvalidRequest that refused it."""
        return run_requests(self, requests, on_step)

    def _runs(self) -> bool:
        """Requests wait or run, or a launched step or pass is still to land (its rows may all have ended meanwhile)."""
        return self.scheduler.has_work() or self.launcher.inflight is not None or self.prefill.in_flight is not None

    # -- one step --------------------------------------------------------------------------------------------------
    def _step(self) -> bool:
        if not self._runs():
            return False
        t0, version, waited = time.perf_counter_ns(), self.scheduler.version, self.stats.wait_ns
        self._land_pass(wait=False)
        self._reload()
        batch, chunks, landed_ns, tokens = self._admit_step()
        if batch is None:  # landing the step (or pass) in flight finished the last requests
            self.stats.add(StepCounts(decode_ns=time.perf_counter_ns() - t0))
            return True
        early = self.early.take_early()
        beside_chunks = chunks if chunks and self.config.prefill.beside else ()
        if beside_chunks:  # the pass waits for the work queued so far (pages given back may still be written by
            after = self.prefill.mark()  # their last decode step), not for this step's decode graph
            batch = batch.decode_only()
        decode = batch.rows.size > 0 and not batch.has_prefill
        if batch.has_prefill:
            self._prefill_step(batch, chunks)
        elif decode:
            f = self._decode_launch(batch, early, tokens)
        if beside_chunks:  # launched after the decode graph: its host time (1-2 ms) no longer delays the decode step
            reqs = self.table.requests(handles_of(beside_chunks))
            launched = self.prefill.launch_beside(beside_chunks, reqs, self.admission.saves(beside_chunks, reqs), after)
            self.admission.prefilled(launched.chunks, launched.contexts)
        if decode:
            beside, overlapped = self._decode_land(f)
        self._land_pass(wait=False)
        if self.config.prepare_early:
            self.early = self._prepare_next()
        for counts in self.admission.take_counts():  # (the prefix cache's, if any)
            self.stats.add(counts)
        took = time.perf_counter_ns() - t0
        if decode:  # the whole iteration: what it prepared early saves a later one
            steady = int(self.scheduler.version == version and not beside_chunks)
            self.stats.add(StepCounts(1, 1, batch.rows.size * tokens, beside, overlapped, decode_ns=took,
                                      multi_token_steps=int(tokens > 1), steady_steps=steady,
                                      steady_host_ns=(took - (self.stats.wait_ns - waited)) * steady))  # fmt: skip
        else:  # a mixed or prefill step; the wait for the decode step it landed belongs to that decode step
            mixed = int(batch.rows.size > 0)
            self.stats.add(StepCounts(1, mixed_steps=mixed, prefill_steps=1 - mixed, decode_ns=landed_ns,
                                      mixed_ns=(took - landed_ns) * mixed))  # fmt: skip
        return True

    def _admit_step(self) -> tuple[Batch | None, tuple[Chunk, ...], int, int]:
        """Compose and admit the step (module doc, 2), first landing a step or pass it may not run beside or waits
        for. Returns the batch (None: landing left no work), its chunks with the admitted requests' first ones, the
        nanoseconds spent landing, and the tokens a row its decode step runs (``_tokens``)."""
        early_tokens = self.early.tokens
        landed_ns, early = 0, self.early.take_batch(self.scheduler.version)  # crossings taken: nothing to check
        while True:
            batch = early if early is not None else self._compose()
            drain, wait_pass = self._must_land(batch), batch.empty and self.prefill.in_flight is not None
            if drain or wait_pass:  # (an offload below can make room for an admission: composed again, it lands)
                t = time.perf_counter_ns()
                self._drain() if drain else self._land_pass(wait=True)
                landed_ns += time.perf_counter_ns() - t
                if not self._runs():
                    return None, (), landed_ns, 1
            elif batch.empty:  # (composed again once an offload came back)
                if not self._unstall():
                    raise RuntimeError(f"engine stalled: {self.scheduler.describe()}, free pages "
                                       f"{self.admission.free()}")  # fmt: skip
            elif early is None and not self.admission.crossings_fit(self.admission.crossings(batch.rows)):
                self._offload(self.scheduler.victim(batch))
            elif early is not None:  # (no admits: early keeps only such a batch)
                self.early.take_txn()
                return batch, batch.chunks, landed_ns, early_tokens
            else:
                tokens = self._tokens(batch) if self.most_tokens > 1 else 1
                admitted = self.admission.admit(batch.rows, batch.admits, self.early.take_txn(), tokens)
                if admitted.refused is None:
                    return batch, batch.chunks + self._admitted(admitted, batch.admits), landed_ns, tokens
                self.stats.add(self.early.given_back(admitted.given))  # rolled back whole: the retry admits those ahead
                self.scheduler.refused(admitted.ahead)  # (of the refused one)
                self.stats.add(Events(refused_admits=1))
            early = None

    def _admitted(self, admitted: Admitted, admits: tuple[tuple[Pending, int], ...]) -> tuple[Chunk, ...]:
        """Admitted requests join the table and the scheduler; returns their first chunks (from a restored
        checkpoint's position, within the tokens the step composed for them)."""
        chunks = []
        for h, start, (pend, n) in zip(admitted.handles, admitted.starts, admits, strict=True):
            self.table.admit(h, pend)
            self.launcher.forget(h)
            self.scheduler.admit(h, pend, start)
            n = min(n, len(pend.request.prompt) - start)
            chunks.append(Chunk(h, start, n, start + n == len(pend.request.prompt)))
        return tuple(chunks)

    def _tokens(self, batch: Batch) -> int:
        """The tokens a row ``batch``'s decode step runs: ``tokens_per_launch`` where its rows run as a decode step
        (no prefill in the step), none asks for logprobs and admission has room for them (``Admission.room_for``);
        else one. A row with fewer tokens left ends inside the launch (the tokens after it dropped, as after a stop
        token)."""
        k, rows = self.most_tokens, batch.rows
        if rows.size == 0 or (batch.has_prefill and not self.config.prefill.beside) or self.table.asks_logprobs(rows):
            return 1
        return k if self.admission.room_for(rows, k) else 1

    def _decode_launch(self, batch: Batch, early, tokens: int = 1) -> InFlight:
        """Prepare, launch, advance, commit: the step (``tokens`` tokens a row) is in flight."""
        rows, b = batch.rows, batch.bucket
        seq, prepared = self.arm.prepare(rows, b, early, tokens)
        self.stats.add(prepared)
        mode = self.table.mode(rows)
        f, last = self._launch(self.graphs.decode(b, mode, tokens), b, rows, self.arm.device_ids, decode=True,
                               mode=mode, tokens=tokens)  # fmt: skip
        self._ran(rows, seq, tokens)
        self.stats.add_check(self.arm.ran(rows, b, seq))
        if self.config.overlap and np.count_nonzero(last):
            self.scheduler.retire(rows[last])
        return f

    def _decode_land(self, f: InFlight) -> tuple[int, int]:
        """Land the launched step now, or (overlap) land the step before and hold this one. Returns whether a pass
        was in flight beside it, and whether it overlapped a step."""
        beside = int(self.prefill.in_flight is not None)
        if not self.config.overlap:
            self._land(f)
            return beside, 0
        prev = self.launcher.hold(f)
        if prev is not None:
            self._land(prev)
        return beside, int(prev is not None)

    def _prefill_step(self, batch: Batch, chunks: tuple[Chunk, ...]) -> None:
        """Prefill chunks in the step, its decode rows from a host fill in a decode graph launched before the pass, or
        (``IN_PASS``) in the pass at their streams' ends (the step before has landed: their last tokens are known)."""
        seq, rows, b = next(self.seqs), batch.rows, batch.bucket
        in_pass = self.config.prefill is PrefillPlacement.IN_PASS and bool(chunks)
        pass_rows, f = (rows if in_pass else rows[:0]), None
        if rows.size and not in_pass:
            self.fills.fill(self.streams, rows, b)
            mode = self.table.mode(rows)
            f, _ = self._launch(self.graphs.host(b, mode), b, rows, self.config.overlap, decode=False, mode=mode)
            self._ran(rows, seq)
        reqs = self.table.requests(handles_of(chunks))
        launched, prefilled = self.prefill.run(chunks, reqs, pass_rows, self.table.last_tokens(pass_rows),
                                               self.table.asks_logprobs(pass_rows),
                                               self.admission.saves(chunks, reqs))  # fmt: skip
        self.admission.prefilled(launched.chunks, launched.contexts)
        if pass_rows.size:
            self.table.launched(pass_rows)
            self._ran(pass_rows, seq)
            self.launcher.forget(pass_rows)
            self.stats.add(Events(pass_rows=pass_rows.size, rows_decoded=pass_rows.size))
        self._prefilled(prefilled, seq, touched=rows)
        if f is not None:
            self._land(f)
        if pass_rows.size:
            self._emit(pass_rows, prefilled.decoded, prefilled.decoded_lp)
        if prefilled.ended.size:
            self._emit(prefilled.ended, prefilled.first_tokens, prefilled.first_lp)

    def _ran(self, rows: np.ndarray, seq: int, tokens: int = 1) -> None:
        """The rows ran ``tokens`` decode tokens at step ``seq``: their lengths + that (the rule the resident commit
        follows, +1 a sub-step)."""
        self.admission.advance(rows, tokens)
        self.scheduler.ran(rows, seq)

    def _prepare_next(self) -> EarlyStep:
        """The next step prepared while this one's device work runs: its rows' crossing pages and the arm's plan."""
        batch = self._compose()
        if self._must_land(batch):  # its rows may finish: prepare the step that follows with what they leave
            self._drain()
            batch = self._compose()
        if not self._runs():
            return EarlyStep()
        early = EarlyStep.prepare(batch, self.scheduler.version, self.admission, self.arm,
                                  not batch.has_prefill or self.config.prefill.beside,
                                  self._tokens(batch) if self.most_tokens > 1 else 1)  # fmt: skip
        self.stats.add(EARLY_STEP if early.early is not None else NO_EARLY_STEP)
        return early

    # -- passes --------------------------------------------------------------------------------------------------
    def _land_pass(self, wait: bool) -> None:
        """Land the pass beside the decode steps if it has finished (``wait``: in any case)."""
        prefilled = self.prefill.land_beside(wait)
        if prefilled is not None:
            self._prefilled(prefilled, next(self.seqs))
            if prefilled.ended.size:
                self._emit(prefilled.ended, prefilled.first_tokens, prefilled.first_lp)

    def _prefilled(self, prefilled: Prefilled, seq: int, touched: np.ndarray | None = None) -> None:
        """A pass landed at step ``seq``: the scheduler counts its chunks, the prompt tokens it scored are recorded,
        the prompts it ended have issued their first token, and the rows it (and a mixed step's host fill,
        ``touched``) wrote are stale in the store."""
        self.stats.add(prefilled.counts)
        self.admission.landed(prefilled.chunks)
        self.scheduler.prefilled_chunks(prefilled.chunks, seq)
        self.table.prefilled(prefilled.ended, prefilled.scored)
        handles = handles_of(prefilled.chunks)
        self.arm.prefilled(handles if touched is None else np.concatenate([touched, handles]), seq)

    # -- admission -----------------------------------------------------------------------------------------------
    def _compose(self) -> Batch:
        """The next step as the scheduler composes it: no prefill work while a pass is in flight."""
        return self.scheduler.compose(self.admission.free, prefill=self.prefill.in_flight is None,
                                      cached=self.admission.cached if self.config.prefix_cache else None)  # fmt: skip

    def _must_land(self, batch: Batch) -> bool:
        """A step is in flight and ``batch`` may not run beside it: it has no decode rows, or prefill work in the
        step, or a request waits for the handle or pages a retiring one gives back when it lands."""
        if self.launcher.inflight is None:
            return False
        in_step = batch.has_prefill and not self.config.prefill.beside
        return batch.rows.size == 0 or in_step or self.scheduler.waits_on_retiring()

    def _offload(self, h: int) -> None:
        """Copy the request's KV pages to the host, give them back, and give its slot up."""
        self._land_pass(wait=True)  # the pass may be writing them
        self.stats.add(self.early.given_back(self.admission.offload(h)))
        self.arm.release(h)
        self.scheduler.offload(h)
        self.stats.add(Events(offloads=1))

    def _unstall(self) -> bool:
        """Nothing runs, and what waits does not fit beside the cached pages offloaded requests keep: the oldest
        offload comes back, as many offloaded requests as it takes first spilling their kept pages to the host
        (oldest first). False where none is offloaded."""
        h = self.scheduler.next_reload()
        if h is None:
            return False
        spills, pages = self.admission.spill_until_fits(h, self.scheduler.offloaded, self.scheduler.reload_watermark())
        self.stats.add(Events(spills=spills, pages_spilled=pages))
        self._reload()
        return self.scheduler.next_reload() != h

    def _reload(self) -> None:
        """Bring offloaded requests back, oldest offload first, while their pages fit beside a watermark."""
        while (h := self.scheduler.next_reload()) is not None:
            if not self.admission.reload_fits(h, self.scheduler.reload_watermark()):
                return
            self.admission.reload(h)
            self.scheduler.reload(h)
            self.stats.add(Events(reloads=1))

    # -- launch, land, emit, finish ----------------------------------------------------------------------------------
    def _launch(self, graphs, b: int, rows: np.ndarray, device_ids: bool, decode: bool, mode: SamplingMode,
                tokens: int = 1) -> tuple[InFlight, np.ndarray]:  # fmt: skip
        """Launch one of ``graphs`` (bucket b's pair, drawing as ``mode`` says, ``tokens`` tokens a row) on ``rows``;
        the step is in flight. Returns it, and [n] bool: the row's last token is in it (``RequestTable.launched``)."""
        f, launched = self.launcher.launch(graphs, b, rows, self.table.serials(rows), self.table.last_token,
                                           device_ids, decode, mode is SamplingMode.LOGPROBS, tokens)  # fmt: skip
        last = self.table.launched(rows, tokens)
        self.stats.add(launched)
        return f, last

    def _land(self, f: InFlight) -> None:
        """Wait for a launched step's tokens and emit them, a row's in order (the launcher drops rows whose request
        ended meanwhile; a row that ends on one of its tokens drops the ones after it)."""
        rows, tokens, lp, landed = self.launcher.land(f, self.table.serial)
        self.stats.add(landed)
        if rows.size:
            self._emit(rows, tokens[0] if tokens.shape[0] == 1 else tokens, lp)

    def _drain(self) -> None:
        """Land the step in flight, if any."""
        f = self.launcher.take_inflight()
        if f is not None:
            self._land(f)

    def _emit(self, rows: np.ndarray, tokens: np.ndarray, lp: TokenLogprobs | None = None) -> None:
        """Record each row's token ([n]; and its logprobs, drawn where a row asked for them), or a launch's tokens a
        row ([k, n], ``RequestTable.emit_block``); finish rows that drew a stop token or ran out of tokens or
        context."""
        emitted = (self.table.emit(rows, tokens, self.config.timing, lp) if tokens.ndim == 1
                   else self.table.emit_block(rows, tokens, self.config.timing))  # fmt: skip
        self.stats.add(Tokens(emitted.n))
        if emitted.itl is not None:
            self.stats.sample_itl(emitted.itl)
        if emitted.n_done:
            for i in np.flatnonzero(emitted.done).tolist():
                self._finish(int(rows[i]), FinishReason.STOP if emitted.stopped[i] else FinishReason.LENGTH)

    def _finish(self, h: int, reason: FinishReason) -> None:
        """Handle h's request ends: every part lets it go (a prefilled stream's pages and state kept in the prefix
        cache), and its result goes to the outbox."""
        prompt = self.table.requests((h,))[0].prompt
        result = self.table.finish(h, reason)
        if self.config.prefix_cache and self.scheduler.status[h] in (Status.DECODING, Status.RETIRING):
            self.admission.keep(h, np.concatenate([np.asarray(prompt, np.int64), np.asarray(result.tokens, np.int64)]))
        self.arm.release(h)
        self.stats.add(self.early.given_back(self.admission.release(h)))
        self.scheduler.finish(h)
        self.launcher.forget(h)
        self.stats.add(Events(finished=1))
        self.table.hand_over(result)
