"""Overlapped decode: step N+1 launched before step N's tokens are read. Either arm with overlap (the resident arm,
and the host arm filling and planning step N+1 while N runs: ``host-overlap``) gives the plain host arm's tokens and
schedule (no stop tokens: the same steps), drops the tokens of rows that had stopped on a token while the next step
ran, and never runs a request past its length. Input ids stay on the device: a steady step copies none."""

from __future__ import annotations

from unittest import mock

import attrs
import numpy as np
import pytest
from test_engine import BASE, PROMPTS, QWEN  # the engine tests' model, config and prompts
from test_engine import CASES as ENGINE_CASES

from models.bench.host_step import TorchCalls
from models.engine import Engine, Planning
from models.engine.compare import check_pools, run_arms
from models.engine.requests import Request, SamplingParams
from resplan.graph import Graph

R, H = Planning.RESIDENT, Planning.HOST
OVERLAP = {R: dict(overlap=True)}
CASES = {**ENGINE_CASES, "context-bound-c4": dict(max_running=4, max_seq_len=16)}  # rows end at the context


def _overlapped(arm: Planning, cfg, reqs, **kw):
    """``reqs`` served by ``arm`` with overlap, and by the plain host arm."""
    over = run_arms(QWEN, attrs.evolve(cfg, overlap=True), reqs, arms=(arm,), **kw)[arm]
    return over, run_arms(QWEN, cfg, reqs, arms=(H,), **kw)[H]


@pytest.mark.parametrize("arm", [R, H], ids=["resident", "host"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_overlapped_arm_matches_host(case, arm):
    cfg = attrs.evolve(BASE, **CASES[case])
    res, host = _overlapped(arm, cfg, PROMPTS, make_on_step=lambda arm, e: lambda out: check_pools(e))
    assert all(t is not None for t in res.tokens)
    assert res.tokens == host.tokens
    s, hs = res.engine.stats, host.engine.stats
    assert (s.steps, s.decode_steps, s.mixed_steps, s.prefill_steps) == (
        hs.steps, hs.decode_steps, hs.mixed_steps, hs.prefill_steps)  # fmt: skip
    assert s.overlapped > 0 and s.discarded == 0
    assert s.rows_decoded == hs.rows_decoded  # no request ran past its last token
    if arm is R:
        assert s.row_checks == s.decode_steps and s.mismatches == 0, s.first_mismatches
    else:  # the fill and plan made while the step before ran were used
        assert s.early_hits > 0 and s.early_steps > hs.early_steps == 0
    assert res.engine.launcher.inflight is None and res.engine.scheduler.admitted == 0


def test_rows_that_stopped_while_the_next_step_ran_are_dropped():
    """12 requests through 4 handles (reused), each stopping on its second free-running token: the step after the
    stop already ran the row; its token is dropped, and a handle's next request never sees it."""
    cfg = attrs.evolve(BASE, max_running=4)
    free = run_arms(QWEN, cfg, PROMPTS[:12], arms=(R,))[R].tokens
    stopping = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, stop_token_ids=(t[2],)))
                for r, t in zip(PROMPTS[:12], free, strict=True) if len(t) > 3]  # fmt: skip
    runs = run_arms(QWEN, cfg, stopping, per_arm=OVERLAP, make_on_step=lambda arm, e: lambda out: check_pools(e))
    host_over = run_arms(QWEN, attrs.evolve(cfg, overlap=True), stopping, arms=(H,))[H]
    assert runs[R].tokens == runs[H].tokens == host_over.tokens
    for r, out in zip(stopping, runs[R].results, strict=True):
        assert out.tokens[-1] == r.sampling.stop_token_ids[0] and out.finish_reason.value == "stop"
    for over in (runs[R], host_over):
        s = over.engine.stats
        assert s.discarded > 0 and s.overlapped > 0 and s.mismatches == 0
        assert s.tokens == runs[H].engine.stats.tokens


def test_the_next_step_launches_before_the_last_ones_tokens_are_read(monkeypatch):
    log = []
    launch, land = Engine._launch, Engine._land

    def logged_launch(self, *a, **k):
        f, last = launch(self, *a, **k)
        log.append(("launch", id(f)))
        return f, last

    def logged_land(self, f):
        log.append(("land", id(f)))
        return land(self, f)

    monkeypatch.setattr(Engine, "_launch", logged_launch)
    monkeypatch.setattr(Engine, "_land", logged_land)
    reqs = [Request(tuple(range(1, 6)), SamplingParams(max_tokens=6)) for _ in range(2)]
    for arm, overlap in ((R, False), (R, True), (H, False), (H, True)):
        log.clear()
        e = Engine(QWEN, attrs.evolve(BASE, max_running=2, planning=arm, overlap=overlap))
        e.run(reqs)
        kinds = [k for k, _ in log]
        assert kinds.count("launch") == kinds.count("land") == e.stats.decode_steps == 5
        if overlap:  # launch 1, launch 2, land 1, launch 3, land 2, ...: each land comes after the next launch
            assert kinds == ["launch", "launch"] + ["land", "launch"] * 3 + ["land", "land"]
            landed = [i for k, i in log if k == "land"]
            assert landed == [i for k, i in log if k == "launch"]  # in launch order
        else:
            assert kinds == ["launch", "land"] * 5


@pytest.mark.parametrize("arm, overlap", [(R, False), (R, True), (H, True)], ids=["resident", "resident-overlap",
                                                                               "host-overlap"])  # fmt: skip
def test_a_steady_step_copies_no_input_ids(arm, overlap):
    """Four requests prefilled together, then 9 decode steps of the same rows: the first copies host ids (after a
    prefill), the second the sources (every row's token is on the device), and the 7 steady ones nothing. The plain
    host arm copies its ids every step."""
    reqs = [Request(tuple(range(i + 1, i + 7)), SamplingParams(max_tokens=10)) for i in range(4)]
    e = Engine(QWEN, attrs.evolve(BASE, max_running=4, planning=arm, overlap=overlap))
    got = e.run(reqs)
    s = e.stats
    assert (s.prefill_steps, s.decode_steps) == (1, 9)
    assert s.ids_copies == 2
    host = Engine(QWEN, attrs.evolve(BASE, max_running=4, planning=H))
    assert [r.tokens for r in host.run(reqs)] == [r.tokens for r in got]
    assert host.stats.ids_copies == 0 and host.stats.h2d_copies == 2 * 9  # fill and ids, every step

@pytest.mark.parametrize("seed", range(12))  # (1-3 s a seed)
def test_requests_arriving_between_steps_with_stop_tokens(seed):
    """Random small engines (few slots and pages, TURNS or ARRIVAL, chunked prefill, refused admits) and requests
    arriving over steps, a third of them with a stop token: both arms with overlap give the host arm's outputs."""
    from test_engine_admit import _arrivals, _serve

    cfg, reqs, arrive = _arrivals(seed)
    rng = np.random.default_rng(seed)
    reqs = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, stop_token_ids=(int(rng.integers(0, 8)),)))
            if rng.random() < 0.33 else r for r in reqs]  # fmt: skip
    _, host = _serve(attrs.evolve(cfg, planning=H), reqs, arrive)
    want = [host[r.request_id] for r in reqs]
    for arm in (R, H):
        over, results = _serve(attrs.evolve(cfg, planning=arm, overlap=True), reqs, arrive)
        assert [results[r.request_id] for r in reqs] == want
        assert over.launcher.inflight is None
        s = over.stats
        assert arm is H or (s.row_checks == s.decode_steps and s.mismatches == 0), s.first_mismatches


@pytest.mark.parametrize("arm", [R, H], ids=["resident", "host"])
def test_a_steady_decode_steps_only_torch_calls_are_its_counted_h2d_copies(arm):
    """Around its graph replay an overlapped decode step calls torch only for the H2D copies it counts (the resident
    arm's crossing cells, the host arm's refill): the graph reads its own tokens back (``graphs.Pair``), and the ids
    stay on the device."""
    e = Engine(QWEN, attrs.evolve(BASE, planning=arm, overlap=True, max_running=4, max_seq_len=64, row_check=False))
    for r in PROMPTS[:4]:
        e.submit(Request(r.prompt, SamplingParams(max_tokens=40, ignore_eos=True)))
    with mock.patch.object(Graph, "replay", lambda self: None):  # (the step's own torch calls are the graph's)
        for _ in range(4):
            e.step()
        steps, h2d = e.stats.decode_steps, e.stats.h2d_copies
        with TorchCalls() as calls:
            for _ in range(16):
                e.step()
    steps, h2d = e.stats.decode_steps - steps, e.stats.h2d_copies - h2d
    assert steps == 16 and calls.n == h2d
    assert h2d < steps if arm is R else h2d == steps  # resident: only steps whose rows opened a page copy
