"""The two planning arms of a decode step, with one interface: ``prepare`` a step (given what was prepared early, or
None), ``prepare_early`` the next one, ``ran``, ``prefilled``, ``release``.

``ResidentArm``: rows live in the device store; a step is planned by ``resplan.plan``, its program flushed, and its
graph gathers the rows and commits their lengths. ``HostArm``: the baseline; a step's buffers are rebuilt from the
host streams (``HostFill``, one H2D) every step. Both build a host schedule for an attention that is not host-plan-free
(fa2), and both can prepare the next step early, while the device runs this one: the resident arm's ``EarlyPlan``, the
host arm's ``EarlyFill`` under overlap (what engines with asynchronous scheduling run). What an arm prepared early is a
value the engine passes back to ``prepare``; the arm uses it only while it is still what the step would make.

``EarlyStep`` is the next step prepared early, as the driver holds it: the batch composed for it, its decode rows'
crossing pages (an admit transaction the step's admit continues) and the arm's early preparation; pages given back
meanwhile that the preparation names void it, and the batch is reused only while the scheduler is at the version it
was composed at (every scheduler transition, such as an arrival, an abort, a pass landing or a reload, moves it).
"""

from __future__ import annotations

import itertools
import time

import attrs
import numpy as np

from models.engine.admission import Admission
from models.engine.host_arm import HostFill
from models.engine.pools import AdmitTxn
from models.engine.scheduler import Batch
from models.engine.stats import Counts, Events
from resplan import (
    BucketPlan,
    Executor,
    FlushProgram,
    HostStreams,
    Mismatch,
    PlannerState,
    RowLayout,
    Step,
    build_planner,
    commit,
    mark_stale,
    plan,
    release,
    row_check,
)


@attrs.frozen(slots=False)
class Prepared(Counts):
    """What preparing a decode step did."""

    plan_ns: int = 0  # plan + flush (resident) or fill + copy (host), wherever it ran
    attn_schedule_ns: int = 0
    early_hits: int = 0
    rows_whole: int = 0
    new_rows: int = 0
    crossings: int = 0
    displacements: int = 0
    h2d_copies: int = 0
    h2d_bytes: int = 0
    empty_flushes: int = 0


@attrs.frozen(slots=True)
class Checked(Counts):
    """A row check of the rows a resident step read (``EngineConfig.row_check``)."""

    row_checks: int = 0
    mismatches: int = 0


@attrs.frozen(eq=False, slots=False)
class EarlyPlan:
    """The next resident decode step, planned early. Valid while rows, bucket and planner state are what it was made
    for, and while no page its program names was given back."""

    key: bytes  # rows.tobytes()
    bucket: int
    base: PlannerState  # the state it was planned from
    state: PlannerState
    program: FlushProgram
    seq: int
    plan_ns: int
    tokens: int = 1  # tokens a row it was planned for

    def names(self, pages: np.ndarray) -> bool:
        """Whether the program names one of ``pages`` (its cells are crossing pages and whole-row runs; a narrow cell
        that happens to equal a page id only costs a re-plan)."""
        return bool(pages.size) and bool(np.isin(pages, np.concatenate([self.program.staged_val,
                                                                         self.program.run_cells])).any())


@attrs.frozen(eq=False)
class EarlyFill:
    """The next host-planned decode step, filled (buffers copied) and its attention scheduled early, while the step in
    flight runs. Valid while its rows, bucket and their streams' lengths, page counts and last pages are what it was
    made from."""

    key: bytes  # rows.tobytes()
    bucket: int
    seen: np.ndarray  # what the fill read of the rows' streams (HostArm.seen)
    seq: int
    filled: Prepared

    def names(self, pages: np.ndarray) -> bool:
        return False  # an early fill checks its rows' streams where it is used (HostArm.prepare)


Early = EarlyPlan | EarlyFill
_KEPT, _DROPPED = Events(), Events(early_drops=1)


@attrs.define(eq=False)
class EarlyStep:
    """The next step as prepared early: the batch composed for it at the scheduler's ``version`` (kept only when it
    admits nothing, so that fewer free pages later would compose the same), its decode rows' crossing pages (``txn``,
    which the step's admit continues) and the arm's preparation (``early``). Each is taken once."""

    txn: AdmitTxn | None = None
    early: Early | None = None
    batch: Batch | None = None
    version: int = -1  # the scheduler's version the batch was composed at

    tokens: int = 1  # tokens a row the step runs (its crossings taken for them)

    @classmethod
    def prepare(cls, batch: Batch, version: int, admission: Admission, arm: ResidentArm | HostArm,
                plan: bool, tokens: int = 1) -> EarlyStep:  # fmt: skip
        """Prepare ``batch`` (the next step as composed now, at the scheduler's ``version``, running ``tokens`` tokens
        a row): take its decode rows' crossing pages and (``plan``) let the arm prepare it early. Nothing when it has
        no decode rows or their crossings do not fit (the step itself then offloads)."""
        rows = batch.rows
        if rows.size == 0:
            return cls()
        found = admission.crossings(rows, tokens)
        if not admission.crossings_fit(found):
            return cls()
        txn = AdmitTxn()
        admission.take_crossings(found, txn)
        return cls(txn, arm.prepare_early(rows, batch.bucket, tokens) if plan else None,
                   None if batch.admits else batch, version, tokens)  # fmt: skip

    def take_batch(self, version: int) -> Batch | None:
        """The batch composed early, if the scheduler is still at its version (no transition since: an arrival, an
        abort, a landed pass, a reload would each compose another); its crossings are taken (``txn``)."""
        batch, self.batch = self.batch, None
        return batch if version == self.version else None

    def take_txn(self) -> AdmitTxn:
        txn, self.txn = self.txn or AdmitTxn(), None
        return txn

    def take_early(self) -> Early | None:
        early, self.early = self.early, None
        return early

    def given_back(self, pages: np.ndarray) -> Events:
        """Pages went back to a pool: the early preparation is void if it names one (else a retried step with the same
        rows would write its token into a page the row no longer holds). Returns whether it was dropped."""
        if self.early is None or not self.early.names(pages):
            return _KEPT
        self.early = None
        return _DROPPED


class HostFills:
    """Each bucket's host fill, and its attention's host schedule where the bucket is not host-plan-free (fa2 builds
    it on the host from the block table and lengths the fill built)."""

    def __init__(self, layout: RowLayout, executor: Executor, plans: dict[int, BucketPlan], attn: dict) -> None:
        # the engine takes a page exactly when a token opens it, so no stream holds a page past its used columns
        self.fills = {b: HostFill(layout, executor.buffers[b], exact_pages=True) for b in plans}
        self.plans = plans
        self.attn = attn
        self.key = layout.append_pools[0].key if layout.append_pools else None  # the attention's pool

    def fill(self, streams: HostStreams, rows: np.ndarray, b: int) -> Prepared:
        """Fill bucket b's buffers for ``rows`` (one H2D) and schedule its attention."""
        t0 = time.perf_counter_ns()
        self.fills[b].fill(streams, rows)
        t1 = time.perf_counter_ns()
        self._schedule(b)
        t2 = time.perf_counter_ns()
        return Prepared(t1 - t0, t2 - t1, h2d_copies=1, h2d_bytes=self.fills[b].nbytes)

    def schedule(self, streams: HostStreams, rows: np.ndarray, b: int) -> int:
        """A resident step keeps its tables on the device; an attention that is not host-plan-free still wants host
        ones: build them (no copy) and schedule. Returns the nanoseconds spent, 0 for a host-plan-free bucket."""
        if self.plans[b].host_plan_free:
            return 0
        t0 = time.perf_counter_ns()
        self.fills[b].build(streams, rows)
        self._schedule(b)
        return time.perf_counter_ns() - t0

    def _schedule(self, b: int) -> None:
        if not self.plans[b].host_plan_free:
            bt, sl = self.fills[b].tables(self.key)
            self.attn[b].schedule(bt, sl)


class ResidentArm:
    """Decode rows kept in the device store, planned by resplan's pure planner; owns the planner state."""

    device_ids = True  # its decode graphs take their input ids from the device

    def __init__(self, layout: RowLayout, plans: dict[int, BucketPlan], capacity: int, executor: Executor,
                 fills: HostFills, streams: HostStreams, seqs: itertools.count,
                 check_rows: bool) -> None:  # fmt: skip
        self.state: PlannerState = build_planner(layout, list(plans.values()), capacity)
        self.executor = executor
        self.fills = fills
        self.streams = streams
        self.seqs = seqs
        self.check_rows = check_rows

    def prepare(self, rows: np.ndarray, b: int, early: Early | None, tokens: int = 1) -> tuple[int, Prepared]:
        """Plan the step of ``tokens`` tokens a row (or take the plan made early for these rows and tokens from this
        state) and flush its program. Returns the step's seq and what it did."""
        t0 = time.perf_counter_ns()
        hit = (isinstance(early, EarlyPlan) and early.bucket == b and early.base is self.state
               and early.tokens == tokens and early.key == rows.tobytes())  # fmt: skip
        if hit:
            state, program, seq = early.state, early.program, early.seq
            t0 -= early.plan_ns  # planned early; it counts all the same
        else:
            seq = next(self.seqs)
            state, program = plan(self.state, Step.trusted(rows, b, seq, tokens), self.streams)
        self.state = state
        self.executor.flush(program)
        plan_ns = time.perf_counter_ns() - t0
        attn_ns = self.fills.schedule(self.streams, rows, b)
        if program.empty:  # (most steady steps: no copy, nothing staged)
            return seq, Prepared(plan_ns, attn_ns, int(hit), empty_flushes=1)
        return seq, Prepared(plan_ns, attn_ns, int(hit), program.rows_whole, program.new_rows, program.crossings,
                             program.displaced.size, program.h2d_copies, program.h2d_bytes)  # fmt: skip

    def prepare_early(self, rows: np.ndarray, b: int, tokens: int = 1) -> EarlyPlan:
        seq = next(self.seqs)
        t0 = time.perf_counter_ns()
        state, program = plan(self.state, Step.trusted(rows, b, seq, tokens), self.streams)
        return EarlyPlan(rows.tobytes(), b, self.state, state, program, seq, time.perf_counter_ns() - t0, tokens)

    def ran(self, rows: np.ndarray, b: int, seq: int) -> tuple[Checked, list[Mismatch]] | None:
        """The step was launched: commit its seq, and check the rows it read when asked to (the check and its
        first mismatches)."""
        self.state = commit(self.state, seq)
        if not self.check_rows:
            return None
        bad = row_check(self.executor.store_numpy(), self.state, rows, self.streams, self.executor.buffers[b])
        return Checked(1, len(bad)), bad[:10]

    def prefilled(self, touched: np.ndarray, seq: int) -> None:
        """A step outside the store (a prefill pass, a mixed step's host fill) wrote ``touched``'s rows: they are
        stale."""
        self.state = commit(mark_stale(self.state, touched), seq)

    def release(self, h: int) -> None:
        """Handle h's request left the device (finished, aborted or offloaded): its slot cools, then is free."""
        self.state = release(self.state, h)


class HostArm:
    """Every decode step's buffers rebuilt from the host streams. Under overlap its graphs take their input ids from
    the device and it fills the next step early (``EarlyFill``)."""

    def __init__(self, fills: HostFills, streams: HostStreams, n_pages: dict[str, np.ndarray],
                 append_keys: tuple[str, ...], seqs: itertools.count, overlap: bool) -> None:  # fmt: skip
        self.fills = fills
        self.streams = streams
        self.n_pages = n_pages  # pages each handle holds, by pool (admission's)
        self.append_keys = append_keys
        self.seqs = seqs
        self.device_ids = overlap

    def seen(self, rows: np.ndarray) -> np.ndarray:
        """Each APPEND pool's lengths, page counts and last page of ``rows``: a refused admit's rollback, the only
        thing that changes them between an early fill and its step without changing the rows, moves one of these."""
        parts = []
        for k in self.append_keys:
            s, held = self.streams.kv[k], self.n_pages[k][rows]
            parts += [s.lengths[rows], held, s.pages[rows, np.maximum(held - 1, 0)]]
        return np.concatenate(parts)

    def prepare(self, rows: np.ndarray, b: int, early: Early | None, tokens: int = 1) -> tuple[int, Prepared]:
        """Fill the step's buffers, or take the early fill made for these rows while they still read the same (one
        token a row: ``tokens`` is 1)."""
        if (isinstance(early, EarlyFill) and early.bucket == b and early.key == rows.tobytes()
                and np.array_equal(early.seen, self.seen(rows))):  # fmt: skip
            return early.seq, attrs.evolve(early.filled, early_hits=1)  # filled while the step before ran
        return next(self.seqs), self.fills.fill(self.streams, rows, b)

    def prepare_early(self, rows: np.ndarray, b: int, tokens: int = 1) -> EarlyFill | None:
        if not self.device_ids:  # the buffers a launch reads its ids from are the host's: nothing runs meanwhile
            return None
        seq = next(self.seqs)
        return EarlyFill(rows.tobytes(), b, self.seen(rows), seq, self.fills.fill(self.streams, rows, b))

    def ran(self, rows: np.ndarray, b: int, seq: int) -> None:
        return None

    def prefilled(self, touched: np.ndarray, seq: int) -> None:
        return None

    def release(self, h: int) -> None:
        return None


def decode_arm(resident: bool, plans: dict[int, BucketPlan], executor: Executor, fills: HostFills,
               admission: Admission, seqs: itertools.count, check_rows: bool,
               overlap: bool) -> ResidentArm | HostArm:  # fmt: skip
    """The engine's decode arm: resident (its rows in ``executor``'s store, planned by resplan), or host-planned; each
    reads admission's streams and page counts, and takes its step serials from ``seqs``."""
    layout, streams = admission.layout, admission.streams
    if resident:
        return ResidentArm(layout, plans, streams.capacity, executor, fills, streams, seqs, check_rows)
    return HostArm(fills, streams, admission.n_pages, layout.append_keys, seqs, overlap)
