"""The two planning arms of a decode step, behind one protocol (``DecodeArm``).

``ResidentArm``: rows live in the device store; a step is planned by ``resplan.plan``, its program flushed, and its
graph gathers the rows and commits their lengths. ``HostArm``: the baseline; a step's buffers are rebuilt from the
host streams (``HostFill``, one H2D) every step. Both build a host schedule for an attention that is not host-plan-free
(fa2), and both can prepare the next step early, while the device runs this one: the resident arm's ``PrePlan``, the
host arm's ``EarlyFill`` under overlap (what engines with asynchronous scheduling run). What an arm prepared early is a
value the engine passes back to ``prepare``; the arm uses it only while it is still what the step would make.
"""

from __future__ import annotations

import enum
import itertools
import time
from typing import Protocol

import attrs
import numpy as np

from models.engine.host_arm import HostFill
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
    offload,
    plan,
    release,
    row_check,
)


class Planning(enum.Enum):
    RESIDENT = "resident"  # decode steps planned through resplan: rows live in the device store
    HOST = "host"  # every decode step's buffers rebuilt from the streams on the host


@attrs.frozen(slots=True)
class Prepared:
    """What preparing a decode step did (counted in the stats); ``seq`` is the step's."""

    seq: int
    plan_ns: int  # plan + flush (resident) or fill + copy (host), wherever it ran
    attn_schedule_ns: int = 0
    preplan_hits: int = 0
    rows_whole: int = 0
    new_rows: int = 0
    crossings: int = 0
    displacements: int = 0
    h2d_copies: int = 0
    h2d_bytes: int = 0
    empty_flushes: int = 0


@attrs.frozen(slots=True)
class Checked:
    """A row check of the rows a resident step read (``EngineConfig.row_check``)."""

    row_checks: int
    mismatches: int
    first: list[Mismatch]  # the first few


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
    flight runs. Valid while its rows, bucket and their streams' lengths, page counts and last pages are what it was
    made from."""

    key: bytes  # rows.tobytes()
    bucket: int
    seen: np.ndarray  # what the fill read of the rows' streams (HostArm.seen)
    seq: int
    filled: Prepared


Early = PrePlan | EarlyFill


class HostTables:
    """Each bucket's host fill, and its attention's host schedule where the bucket is not host-plan-free (fa2 builds
    it on the host from the block table and lengths the fill built)."""

    def __init__(self, layout: RowLayout, executor: Executor, plans: dict[int, BucketPlan], attn: dict) -> None:
        # the engine takes a page exactly when a token opens it, so no stream holds a page past its used columns
        self.fills = {b: HostFill(layout, executor.buffers[b], exact_pages=True) for b in plans}
        self.plans = plans
        self.attn = attn
        self.key = layout.append_pools[0].key if layout.append_pools else None  # the attention's pool

    def fill(self, streams: HostStreams, rows: np.ndarray, b: int, seq: int) -> Prepared:
        """Fill bucket b's buffers for ``rows`` (one H2D) and schedule its attention."""
        t0 = time.perf_counter_ns()
        self.fills[b].fill(streams, rows)
        t1 = time.perf_counter_ns()
        self._schedule(b)
        t2 = time.perf_counter_ns()
        return Prepared(seq, t1 - t0, t2 - t1, h2d_copies=1, h2d_bytes=self.fills[b].nbytes)

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


class DecodeArm(Protocol):
    """How decode steps are planned. The engine calls, per decode step: ``prepare`` (with what ``prepare_early``
    returned, or None), the launch, then ``ran``; and ``prefilled`` after a host-planned step, ``offload`` and
    ``release`` when a request leaves the device."""

    device_ids: bool  # its decode graphs take their input ids from the device

    def prepare(self, rows: np.ndarray, b: int, early: Early | None) -> Prepared: ...

    def prepare_early(self, rows: np.ndarray, b: int) -> Early | None: ...

    def ran(self, rows: np.ndarray, b: int, seq: int) -> Checked | None: ...

    def prefilled(self, touched: np.ndarray, seq: int) -> None: ...

    def offload(self, h: int) -> None: ...

    def release(self, h: int) -> None: ...

    def names(self, early: Early, pages: np.ndarray) -> bool: ...


class ResidentArm:
    """Decode rows kept in the device store, planned by resplan's pure planner; owns the planner state."""

    device_ids = True

    def __init__(self, layout: RowLayout, plans: dict[int, BucketPlan], capacity: int, executor: Executor,
                 tables: HostTables, streams: HostStreams, seqs: itertools.count,
                 check_rows: bool) -> None:  # fmt: skip
        self.state: PlannerState = build_planner(layout, list(plans.values()), capacity)
        self.executor = executor
        self.tables = tables
        self.streams = streams
        self.seqs = seqs
        self.check_rows = check_rows

    def prepare(self, rows: np.ndarray, b: int, early: Early | None) -> Prepared:
        """Plan the step (or take the pre-plan made for these rows from this state) and flush its program."""
        t0 = time.perf_counter_ns()
        hit = (isinstance(early, PrePlan) and early.bucket == b and early.base is self.state
               and early.key == rows.tobytes())  # fmt: skip
        if hit:
            state, program, seq = early.state, early.program, early.seq
            t0 -= early.plan_ns  # planned early; it counts all the same
        else:
            seq = next(self.seqs)
            state, program = plan(self.state, Step(rows, b, seq), self.streams)
        self.state = state
        self.executor.flush(program)
        plan_ns = time.perf_counter_ns() - t0
        attn_ns = self.tables.schedule(self.streams, rows, b)
        return Prepared(seq, plan_ns, attn_ns, int(hit), program.rows_whole, program.new_rows, program.crossings,
                        program.displaced.size, program.h2d_copies, program.h2d_bytes, int(program.empty))  # fmt: skip

    def prepare_early(self, rows: np.ndarray, b: int) -> PrePlan:
        seq = next(self.seqs)
        t0 = time.perf_counter_ns()
        state, program = plan(self.state, Step(rows, b, seq), self.streams)
        return PrePlan(rows.tobytes(), b, self.state, state, program, seq, time.perf_counter_ns() - t0)

    def ran(self, rows: np.ndarray, b: int, seq: int) -> Checked | None:
        """The step was launched: commit its seq, and check the rows it read when asked to."""
        self.state = commit(self.state, seq)
        if not self.check_rows:
            return None
        bad = row_check(self.executor.store_numpy(), self.state, rows, self.streams, self.executor.buffers[b])
        return Checked(1, len(bad), bad[:10])

    def prefilled(self, touched: np.ndarray, seq: int) -> None:
        """A host-planned step wrote ``touched``'s rows outside the store: they are stale."""
        self.state = commit(mark_stale(self.state, touched), seq)

    def offload(self, h: int) -> None:
        self.state = offload(self.state, h)

    def release(self, h: int) -> None:
        self.state = release(self.state, h)

    def names(self, early: Early, pages: np.ndarray) -> bool:
        """Pages went back to a pool: a pre-plan whose program names one of them is stale. (Its cells are crossing
        pages and whole-row runs; a narrow cell that happens to equal a page id only costs a re-plan.)"""
        if not isinstance(early, PrePlan) or pages.size == 0:
            return False
        return bool(np.isin(pages, np.concatenate([early.program.staged_val, early.program.run_cells])).any())


class HostArm:
    """Every decode step's buffers rebuilt from the host streams. Under overlap its graphs take their input ids from
    the device and it fills the next step early (``EarlyFill``)."""

    def __init__(self, tables: HostTables, streams: HostStreams, n_pages: dict[str, np.ndarray],
                 append_keys: tuple[str, ...], seqs: itertools.count, overlap: bool) -> None:  # fmt: skip
        self.tables = tables
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

    def prepare(self, rows: np.ndarray, b: int, early: Early | None) -> Prepared:
        """Fill the step's buffers, or take the early fill made for these rows while they still read the same."""
        if (isinstance(early, EarlyFill) and early.bucket == b and early.key == rows.tobytes()
                and np.array_equal(early.seen, self.seen(rows))):  # fmt: skip
            return attrs.evolve(early.filled, preplan_hits=1)  # filled, copied and scheduled while the step before ran
        return self.tables.fill(self.streams, rows, b, next(self.seqs))

    def prepare_early(self, rows: np.ndarray, b: int) -> EarlyFill | None:
        if not self.device_ids:  # the buffers a launch reads its ids from are the host's: nothing runs meanwhile
            return None
        seq = next(self.seqs)
        return EarlyFill(rows.tobytes(), b, self.seen(rows), seq, self.tables.fill(self.streams, rows, b, seq))

    def ran(self, rows: np.ndarray, b: int, seq: int) -> None:
        return None

    def prefilled(self, touched: np.ndarray, seq: int) -> None:
        return None

    def offload(self, h: int) -> None:
        return None

    def release(self, h: int) -> None:
        return None

    def names(self, early: Early, pages: np.ndarray) -> bool:
        return False  # an early fill checks its rows' streams where it is used
