"""Abort and bounded bookkeeping: ``Engine.abort`` ends a request wherever it is (waiting, mid-prefill, decoding,
its token in flight under overlap, offloaded; in either arm, and with 4 tokens a row a launch) with FinishReason.ABORT
and the tokens it had; everything it held comes back; no other request's tokens change; a finished request's result
is handed over once, in one step's output, and its id forgotten."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_engine import BASE, QWEN

from models.engine import Engine, FinishReason, InvalidRequest, Planning, Request, SamplingParams
from models.engine.compare import check_pools, random_requests
from models.engine.scheduler import Status
from resplan.state import FREE

R, H = Planning.RESIDENT, Planning.HOST
REQS = random_requests(QWEN, 10, prompt_len=(3, 14), gen_len=(4, 12), seed=21)


def assert_all_free(e: Engine) -> None:
    """Nothing is held: every page, handle, recurrent slot and planner slot is free, no step is in flight."""
    check_pools(e)
    assert not e.has_work() and e.launcher.inflight is None and not e.table.live
    assert all(p.free == p.capacity for p in e.admission.page_pools.values())
    assert e.admission.handles.free == e.admission.handles.size and e.admission.rec.free == e.admission.rec.size
    if e.resident:
        assert (e.arm.state.ledger.slot_owner[1:] == FREE).all() and not e.arm.state.ledger.slot_of.any()
    assert not e.scheduler.offloaded and not e.scheduler.prefilling and not e.scheduler.waiting


def _reference(cfg) -> dict[str, tuple[int, ...]]:
    return {r.request_id: r.tokens for r in Engine(QWEN, cfg).run(REQS)}


STAGES = {  # stage: (config changes, predicate on the engine telling the victim is there)
    "waiting": (dict(max_running=2), lambda e, rid: any(p.rid == rid for p in e.scheduler.waiting)),
    "mid-prefill": (dict(max_running=4, token_budget=4),
                    lambda e, rid: _status(e, rid) == Status.PREFILLING and e.scheduler.prefilled[_handle(e, rid)] > 0),
    "decoding": (dict(max_running=4), lambda e, rid: _status(e, rid) == Status.DECODING),
    "in-flight": (dict(max_running=4, overlap=True),
                  lambda e, rid: (f := e.launcher.inflight) is not None and _handle(e, rid) in f.rows.tolist()),
    "retiring": (dict(max_running=4, overlap=True), lambda e, rid: _status(e, rid) == Status.RETIRING),
    "offloaded": (dict(max_running=8, num_pages=14), lambda e, rid: _status(e, rid) == Status.OFFLOADED),
}  # fmt: skip


def _handle(e: Engine, rid: str) -> int | None:
    return e.table.handle_of(rid)


def _status(e: Engine, rid: str) -> int | None:
    h = _handle(e, rid)
    return None if h is None else int(e.scheduler.status[h])


ARMS = {"resident": dict(planning=R), "host": dict(planning=H),
        "resident-k4": dict(planning=R, tokens_per_launch=4)}  # (4 decode tokens a row a launch)


@pytest.mark.parametrize("arm", list(ARMS), ids=list(ARMS))
@pytest.mark.parametrize("stage", list(STAGES), ids=list(STAGES))
def test_an_abort_at_each_stage_frees_everything_and_changes_no_other_request(stage, arm):
    changes, there = STAGES[stage]
    cfg = attrs.evolve(BASE, **ARMS[arm], **changes)
    want = _reference(cfg)
    e = Engine(QWEN, cfg)
    for r in REQS:
        e.submit(r)
    results, victim = {}, None
    while e.has_work() and victim is None:
        victim = next((r.request_id for r in REQS if r.request_id not in results and there(e, r.request_id)), None)
        if victim is None:
            results.update((r.request_id, r) for r in e.step().finished)
    assert victim is not None, f"no request was ever {stage}"
    had = e.table.gen[_handle(e, victim)] if _handle(e, victim) is not None else 0
    assert e.abort(victim) is True
    assert e.abort(victim) is False  # ended: its result is in the next step's output
    while e.has_work():
        results.update((r.request_id, r) for r in e.step().finished)
        check_pools(e)
    assert_all_free(e)
    out = results[victim]
    assert out.finish_reason is FinishReason.ABORT and len(out.tokens) == had
    assert out.tokens == want[victim][: len(out.tokens)]
    got = {rid: results[rid].tokens for rid in want}
    assert {k: v for k, v in got.items() if k != victim} == {k: v for k, v in want.items() if k != victim}
    assert e.stats.mismatches == 0, e.stats.first_mismatches


def test_results_are_handed_over_once_and_their_ids_forgotten():
    e = Engine(QWEN, attrs.evolve(BASE, max_running=2))
    e.submit(Request((1, 2, 3), SamplingParams(max_tokens=2), request_id="x"))
    with pytest.raises(InvalidRequest, match="is in use"):  # not finished: its id is taken
        e.submit(Request((4, 5), request_id="x"))
    outs = []
    while e.has_work():
        outs.append(e.step())
    finished = [r for out in outs for r in out.finished]
    assert [r.request_id for r in finished] == ["x"] and finished[0].tokens  # handed over once
    assert tuple(t for out in outs for t in out.new_tokens().get("x", ())) == finished[0].tokens  # streamed in order
    assert not e.table.rids and not e.table.t_submit and not e.table.live  # nothing kept
    assert e.abort("x") is False  # forgotten
    assert not e.step().ran and not e.step().finished
    e.submit(Request((4, 5), SamplingParams(max_tokens=1), request_id="x"))  # the id is free again
    assert len(e.run(REQS[:3])) == 3 and not e.table.rids and not e.table.t_submit  # run() hands its results back


class AbortMachine(RuleBasedStateMachine):
    """Requests submitted and aborted at random between steps (overlap on or off, either arm, chunked prefill, few
    pages so requests get offloaded): every request not aborted gets the tokens it gets without any abort, an
    aborted one a prefix of them, and once drained nothing is held. (Counted once over the 40 examples: aborts of
    waiting, prefilling, decoding, in-flight and offloaded requests.)"""

    @initialize(arm=st.sampled_from([R, H]), overlap=st.booleans(), budget=st.sampled_from([None, 5]),
                pages=st.sampled_from([None, 10]))  # fmt: skip
    def setup(self, arm, overlap, budget, pages):
        self.cfg = attrs.evolve(BASE, planning=arm, overlap=overlap, max_running=4, token_budget=budget,
                                num_pages=pages)  # fmt: skip
        self.want = CACHE.setdefault((budget, pages), _reference(attrs.evolve(self.cfg, overlap=False,
                                                                              planning=H)))  # fmt: skip
        self.e = Engine(QWEN, self.cfg)
        self.todo = list(REQS)
        self.aborted: set[str] = set()
        self.results: dict = {}

    @precondition(lambda self: self.todo)
    @rule(n=st.integers(1, 3))
    def submit(self, n):
        for r in self.todo[:n]:
            self.e.submit(r)
        del self.todo[:n]

    @rule(k=st.integers(1, 3))
    def step(self, k):
        for _ in range(k):
            if self.e.has_work():
                self._collect(self.e.step())

    def _collect(self, out):
        for r in out.finished:
            assert r.request_id not in self.results, "a result handed over twice"
            self.results[r.request_id] = r

    @precondition(lambda self: self.e.table.rids)
    @rule(i=st.integers(0, 63))
    def abort(self, i):
        unfinished = sorted(self.e.table.rids)
        rid = unfinished[i % len(unfinished)]
        assert self.e.abort(rid)
        self.aborted.add(rid)

    @invariant()
    def pools_hold(self):
        check_pools(self.e)

    def teardown(self):
        for r in self.todo:
            self.e.submit(r)
        while self.e.has_work():
            self._collect(self.e.step())
        assert_all_free(self.e)
        for rid, want in self.want.items():
            got = self.results[rid].tokens
            assert got == want if rid not in self.aborted else got == want[: len(got)], rid
        assert all(self.results[rid].finish_reason is FinishReason.ABORT for rid in self.aborted)
        assert not self.e.table.rids and self.e.stats.mismatches == 0


CACHE: dict = {}
TestAbortMachine = AbortMachine.TestCase
TestAbortMachine.settings = settings(max_examples=24, stateful_step_count=30, deadline=None, derandomize=True,
                                     suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


def test_offloaded_victim_of_the_machine_is_reachable():
    """The machine's few-pages engines do offload (so aborts reach OFFLOADED requests)."""
    for budget in (None, 5):
        e = Engine(QWEN, attrs.evolve(BASE, max_running=4, num_pages=10, token_budget=budget))
        e.run(REQS)
        assert e.stats.offloads > 0
