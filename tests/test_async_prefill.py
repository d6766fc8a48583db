"""Prefill passes beside decode steps (``PrefillPlacement.BESIDE``): a step's pass is launched on a stream of its own
and the decode rows go on as decode steps; the pass's requests join them once it lands. The engine gives the tokens
of an engine that runs each pass inside its step, for both models and both planning arms, synchronous and overlapped,
with offloads under KV pressure, prefill graphs, refused admits and aborts, and with passes that stay in flight for
several steps (on a CPU a pass runs at launch; ``_late`` holds it back for a number of polls)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from models.engine import Engine, EngineConfig, Planning, PrefillPlacement, build_adapter
from models.engine.compare import random_requests
from models.engine.prefill import PassInFlight

IN_STEP, BESIDE = PrefillPlacement.IN_STEP, PrefillPlacement.BESIDE


@attrs.frozen(eq=False)
class _LatePass(PassInFlight):
    """A pass the engine sees as still running for ``late`` polls; ``polls[0]`` counts the polls it saw."""

    late: int = 0
    polls: list = attrs.field(factory=lambda: [0])

    def ready(self) -> bool:
        self.polls[0] += 1
        return self.polls[0] > self.late


def _late(engine: Engine, late: int) -> list[list[int]]:
    """Make each pass of ``engine`` land only after ``late`` polls that found it running (a wait lands it at once);
    returns each pass's poll count, as a one-element list, in launch order."""
    real, polls = engine.prefill.launch, []

    def launch(*args, **kwargs):
        p = real(*args, **kwargs)
        polls.append([0])
        return _LatePass(**{f.name: getattr(p, f.name) for f in attrs.fields(PassInFlight)}, late=late,
                         polls=polls[-1])  # fmt: skip

    engine.prefill.launch = launch
    return polls


@pytest.mark.parametrize(
    "model,planning,overlap,num_pages,prefill_graphs,polls",
    [
        ("qwen3_5-tiny", Planning.RESIDENT, True, None, 0, 0),
        ("qwen3_5-tiny", Planning.RESIDENT, True, None, 0, 3),  # passes in flight for three steps
        ("qwen3_5-tiny", Planning.RESIDENT, False, 20, 0, 2),  # offloads under KV pressure
        ("qwen3_5-tiny", Planning.HOST, True, 20, 0, 2),
        ("qwen3_5-tiny", Planning.RESIDENT, True, None, 3, 1),  # passes padded to token buckets
        ("whisper-test", Planning.RESIDENT, True, 20, 0, 2),
        ("whisper-test", Planning.HOST, False, None, 0, 1),
    ],
)
def test_passes_beside_decode_steps_give_the_tokens_of_passes_in_the_step(model, planning, overlap, num_pages,
                                                                         prefill_graphs, polls):  # fmt: skip
    from test_decode_in_pass import _requests  # 12 greedy and 6 sampled requests, varied prompts and outputs

    adapter = build_adapter(model, seed=0)
    reqs = _requests(adapter)
    base = EngineConfig(page_size=4, max_seq_len=64, max_running=4, token_budget=12, planning=planning,
                        overlap=overlap, num_pages=num_pages, prefill_graphs=prefill_graphs,
                        prefill_graph_tokens=16, row_check=planning is Planning.RESIDENT, prefill=IN_STEP)
    in_step = [r.tokens for r in Engine(adapter, base).run(reqs)]
    engine = Engine(adapter, attrs.evolve(base, prefill=BESIDE))
    seen = _late(engine, polls)
    beside = [r.tokens for r in engine.run(reqs)]
    assert beside == in_step
    st = engine.stats
    assert st.mixed_steps == 0 and st.decode_beside_pass > 0 and st.mismatches == 0
    assert st.prefill_passes == len(seen) and max(n for n, in seen) > polls  # a pass was seen running `polls` times
    assert num_pages is None or st.offloads > 0
    assert engine.prefill.in_flight is None and not engine.has_work()


@pytest.mark.parametrize("seed", [0, 6, 7, 9, 19])  # refused admits, pre-plans dropped, offloads (6, 9)
def test_passes_beside_decode_steps_with_requests_arriving_between_steps(seed):
    """test_engine_admit's arrivals (refused admits, pre-plans dropped, pools checked after every step): the resident
    arm overlapped, its passes beside its decode steps and two polls late, gives the host arm's results."""
    from test_engine_admit import QWEN, _arrivals, _serve

    cfg, reqs, arrive = _arrivals(seed)
    _, host = _serve(attrs.evolve(cfg, planning=Planning.HOST), reqs, arrive)
    real_init = Engine.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        _late(self, 2)

    Engine.__init__ = init
    try:
        res, results = _serve(attrs.evolve(cfg, planning=Planning.RESIDENT, prefill=BESIDE, overlap=True), reqs, arrive)
    finally:
        Engine.__init__ = real_init
    assert res.adapter is QWEN
    assert [results[r.request_id] for r in reqs] == [host[r.request_id] for r in reqs]
    assert res.stats.decode_beside_pass > 0 and res.stats.mismatches == 0, res.stats.first_mismatches


def test_an_abort_lands_the_pass_in_flight_first():
    """Aborting a request whose chunk is in the pass in flight lands the pass, then gives its pages and slot back:
    the other requests' tokens are those of an engine that never saw it."""
    adapter = build_adapter("qwen3_5-tiny", seed=0)
    reqs = random_requests(adapter, 6, prompt_len=(10, 30), gen_len=(4, 10), seed=9)
    cfg = EngineConfig(page_size=4, max_seq_len=64, max_running=3, token_budget=8, row_check=True, overlap=True)
    alone = {r.request_id: r.tokens for r in Engine(adapter, cfg).run(reqs[1:])}
    engine = Engine(adapter, attrs.evolve(cfg, prefill=BESIDE))
    _late(engine, 5)
    for r in reqs:
        engine.submit(r)
    results = {r.request_id: r for r in engine.step().finished}  # launches the first pass: reqs[0]'s chunk is in it
    assert engine.prefill.in_flight is not None and 0 in [c.handle for c in engine.prefill.in_flight.chunks]
    assert engine.abort(reqs[0].request_id)
    assert engine.prefill.in_flight is None
    while engine.has_work():
        results.update((r.request_id, r) for r in engine.step().finished)
    assert results[reqs[0].request_id].finish_reason.value == "abort"
    assert {r.request_id: results[r.request_id].tokens for r in reqs[1:]} == alone
    assert engine.stats.mismatches == 0


def test_the_placement_is_beside_by_default_on_cuda_only():
    adapter = build_adapter("qwen3_5-tiny", seed=0)
    cfg = EngineConfig(page_size=4, max_seq_len=64, max_running=4, token_budget=12)
    assert cfg.prefill is IN_STEP and Engine(adapter, cfg).prefill.pass_stream is None  # a CPU: passes in the step
    assert EngineConfig(device="cuda").prefill is BESIDE
    assert Engine(adapter, attrs.evolve(cfg, prefill=BESIDE)).prefill.in_flight is None  # (a CPU pass lands at once)


def test_a_higher_priority_for_the_decode_steps_needs_cuda():
    with pytest.raises(ValueError, match="BESIDE_PRIORITY ranks the steps' CUDA stream above the passes'; device cpu "
                                         "has no streams"):  # fmt: skip
        EngineConfig(page_size=4, max_seq_len=64, max_running=4, prefill=PrefillPlacement.BESIDE_PRIORITY)


def test_the_default_token_budget_follows_where_the_passes_run():
    from models.engine import BESIDE_TOKEN_BUDGET, IN_STEP_TOKEN_BUDGET

    assert EngineConfig().token_budget == IN_STEP_TOKEN_BUDGET  # a CPU: passes in the step
    assert EngineConfig(device="cuda").token_budget == BESIDE_TOKEN_BUDGET
    assert EngineConfig(device="cuda", prefill=IN_STEP).token_budget == IN_STEP_TOKEN_BUDGET
    assert EngineConfig(device="cuda", prefill=PrefillPlacement.IN_PASS).token_budget == IN_STEP_TOKEN_BUDGET
    assert EngineConfig(prefill=BESIDE).token_budget == BESIDE_TOKEN_BUDGET
    assert EngineConfig(device="cuda", token_budget=512).token_budget == 512
    assert EngineConfig(token_budget=None).token_budget is None
    for bad in (0, -3, "big", 2.5, "auto", True):
        with pytest.raises(ValueError, match="token_budget must be > 0 or None"):
            EngineConfig(token_budget=bad)
    adapter = build_adapter("qwen3_5-tiny", seed=0)
    engine = Engine(adapter, EngineConfig(page_size=4, max_seq_len=64, max_running=4, prefill=BESIDE))
    assert engine.scheduler.token_budget == BESIDE_TOKEN_BUDGET


def test_no_prefill_work_is_composed_while_a_pass_is_in_flight():
    adapter = build_adapter("qwen3_5-tiny", seed=0)
    engine = Engine(adapter, EngineConfig(page_size=4, max_seq_len=64, max_running=4, token_budget=12,
                                          prefill=BESIDE))  # fmt: skip
    for r in random_requests(adapter, 4, prompt_len=(20, 30), gen_len=(2, 4), seed=1):
        engine.submit(r)
    assert engine.scheduler.compose(engine.admission.free).has_prefill
    batch = engine.scheduler.compose(engine.admission.free, prefill=False)
    assert not batch.has_prefill and np.array_equal(batch.rows, engine.scheduler.decode_rows())
