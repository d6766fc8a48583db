"""Hypothesis state machine: ~20 live requests over B=4 (9 slots), hundreds of steps each, with abandoned plans,
host-planned steps, releases, offloads and recycled handles. After every resident step the simulated device (the
executor running the kernels' references) matches the host streams for every row the step read."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sim import SimEngine, qwen_like, whisper_like

STEPS = {"resident": 0, "abandoned": 0, "host": 0, "displaced": 0, "whole": 0, "crossings": 0}


def _lru_prefix_ok(before, step_slots: np.ndarray, displaced: np.ndarray) -> bool:
    """Displaced handles are exactly the least recently run eligible holders (by last read, then take order)."""
    if displaced.size == 0:
        return True
    owner, read, taken = before.slot_owner, before.slot_read, before.ledger.slot_taken
    in_step = np.zeros(owner.size, bool)
    in_step[step_slots[step_slots > 0]] = True
    cand = np.flatnonzero((owner >= 0) & (read <= before.committed_seq) & ~in_step)
    order = cand[np.lexsort((taken[cand], read[cand]))]
    return owner[order[: displaced.size]].tolist() == displaced.tolist()


class PlannerMachine(RuleBasedStateMachine):
    layout_factory = staticmethod(qwen_like)

    @initialize(seed=st.integers(0, 2**16))
    def setup(self, seed):
        lay = self.layout_factory(page_size=4, pages=256, max_seq_len=32)
        self.e = SimEngine(lay, (1, 2, 3, 4), capacity=24, seed=seed)
        self.rng = np.random.default_rng(seed)

    def _pick(self, data_n: int, seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        roomy = [h for h in self.e.live if self.e.room(h)]
        if not roomy:
            return []
        n = max(1, min(data_n, len(roomy), 4))
        return rng.permutation(roomy)[:n].tolist()

    @precondition(lambda self: len(self.e.live) < 20 and self.e.free_handles)
    @rule(length=st.integers(1, 20), ctx=st.integers(1, 24))
    def admit(self, length, ctx):
        self.e.admit(length, ctx)

    @precondition(lambda self: self.e.live)
    @rule(n=st.integers(1, 4), seed=st.integers(0, 2**16), abandon=st.booleans(), abandon_p=st.integers(0, 9))
    def resident_step(self, n, seed, abandon, abandon_p):
        rows = self._pick(n, seed)
        if not rows:
            return
        if abandon and abandon_p < 2:  # ~10%: plan, then drop the plan (a refused admit, a pre-plan redone)
            self.e.plan_only(rows)
            STEPS["abandoned"] += 1
            return
        before, program = self.e.resident_step(rows)
        slots = self.e.state.slot_of[np.asarray(rows)]
        assert _lru_prefix_ok(before, before.slot_of[np.asarray(rows)], program.displaced)
        assert not set(program.displaced.tolist()) & set(rows), "a step displaced its own row"
        if before.last_seq > before.committed_seq:  # the uncommitted step's rows are untouchable
            untouchable = np.flatnonzero(before.slot_read > before.committed_seq)
            assert not set(before.slot_owner[untouchable].tolist()) & set(program.displaced.tolist())
        assert (slots > 0).all() and np.unique(slots).size == slots.size
        STEPS["resident"] += 1
        STEPS["displaced"] += program.displaced.size
        STEPS["whole"] += program.rows_whole
        STEPS["crossings"] += program.crossings

    @precondition(lambda self: self.e.live)
    @rule(n=st.integers(1, 4), seed=st.integers(0, 2**16))
    def resident_steady(self, n, seed):
        """Weights resident steps up: the same rows again (no abandon), the common case of a real decode loop."""
        self.resident_step(n, seed, False, 9)
        self.resident_step(n, seed, False, 9)

    @precondition(lambda self: self.e.live)
    @rule(n=st.integers(1, 3), seed=st.integers(0, 2**16), tokens=st.integers(0, 3), new_ctx=st.booleans())
    def host_step(self, n, seed, tokens, new_ctx):
        rows = [h for h in self._pick(n, seed) if self.e.room(h, tokens + 1)]
        if rows:
            self.e.host_step(rows, tokens, new_context=new_ctx)
            STEPS["host"] += 1

    @precondition(lambda self: self.e.live)
    @rule(i=st.integers(0, 19))
    def finish(self, i):
        self.e.finish(self.e.live[i % len(self.e.live)])

    @precondition(lambda self: any(not self.e.room(h) for h in self.e.live))
    @rule()
    def finish_full(self):
        for h in [h for h in self.e.live if not self.e.room(h)]:
            self.e.finish(h)

    @precondition(lambda self: self.e.live)
    @rule(i=st.integers(0, 19))
    def offload(self, i):
        self.e.offload(self.e.live[i % len(self.e.live)])

    @rule()
    def commit(self):
        self.e.commit_pending()

    @invariant()
    def ledger_partitions_the_slots(self):
        if hasattr(self, "e"):
            self.e.state.check()
            assert self.e.mismatches == 0


class WhisperMachine(PlannerMachine):
    layout_factory = staticmethod(whisper_like)


_settings = settings(  # 180 runs of up to 180 steps a layout (~15k steps in all; random anew every run)
    max_examples=180,
    stateful_step_count=180,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestQwenLikeSlotCache = PlannerMachine.TestCase
TestQwenLikeSlotCache.settings = _settings
TestWhisperLikeSlotCache = WhisperMachine.TestCase
TestWhisperLikeSlotCache.settings = _settings


def test_zz_the_machines_ran_enough_steps():
    """Runs after the machines (file order): the CI run covers at least 10,000 random steps in total."""
    total = STEPS["resident"] + STEPS["abandoned"] + STEPS["host"]
    print(f"\nplanner state machines: {STEPS}")
    assert total >= 10_000, STEPS
    assert STEPS["displaced"] > 0 and STEPS["whole"] > 0 and STEPS["crossings"] > 0
