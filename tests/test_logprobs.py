"""OpenAI-style logprobs (``SamplingParams.logprobs``): each token's log-probability and the k most likely tokens' at
its position, log_softmax of the raw logits in float32. Checked against transformers' logits on the same weights and
tokens, for greedy and sampled rows asking for k = 0, 2 and 5 beside rows asking for none, in both planning arms,
synchronous and overlapped, with passes in the step, beside the decode steps and with the decode rows in the pass:
every way gives the same tokens and logprobs, the first token's (drawn by a pass) included. Only steps with a row that
asks replay the LOGPROBS graph; an engine nobody asks of hands out no logprobs arrays."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from test_engine import QWEN

from kernels.choices import KernelChoices
from kernels.runtime import interpreted
from models.engine import (
    Engine,
    EngineConfig,
    FinishReason,
    InvalidRequest,
    Limits,
    Planning,
    PrefillPlacement,
    Request,
    validate,
)
from models.engine import SamplingParams as SP
from models.engine.compare import random_requests
from models.engine.requests import MAX_LOGPROBS, TokenLogprobs
from models.engine.sampler import Sampler, SamplingMode, logprobs
from models.engine.scheduler import Pending
from models.engine.table import RequestTable
from resplan import SamplerCell, float_bits

R, H = Planning.RESIDENT, Planning.HOST
K = MAX_LOGPROBS
# Four requests asking for none run first (greedy and sampled: SAMPLE steps), then greedy and sampled ones asking for
# k = 0, 2 and 5 (LOGPROBS steps), and a long greedy one asking for none that ends alone (GREEDY steps).
LPS = (None, None, None, None, 0, 5, 5, 2, 2, 0, None)
TEMPS = (0.0, 0.9, 0.0, 1.0, 0.0, 0.9, 0.0, 1.0, 0.0, 0.9, 0.0)
MAX_TOKENS = (5, 3, 4, 2, 5, 6, 4, 6, 5, 3, 14)
REQS = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, logprobs=k, temperature=t, top_k=20 if t else 0,
                                              max_tokens=n))
        for r, k, t, n in zip(random_requests(QWEN, 11, (3, 14), (1, 1), seed=11), LPS, TEMPS, MAX_TOKENS,
                              strict=True)]  # fmt: skip
BASE = EngineConfig(page_size=4, max_seq_len=32, max_running=4, token_budget=12, row_check=True)
WAYS = {  # (planning, overlap, where passes run): each arm with overlap and without
    "resident": (R, False, PrefillPlacement.IN_STEP),
    "host-overlap": (H, True, PrefillPlacement.IN_STEP),
    "in-pass-resident-overlap": (R, True, PrefillPlacement.IN_PASS),  # decode rows drawn in the pass
    "beside-host": (H, False, PrefillPlacement.BESIDE),  # passes on their own (first tokens beside the steps)
}


def _cells(temps) -> torch.Tensor:
    c = np.zeros((len(temps), len(SamplerCell)), np.int32)
    c[:, SamplerCell.TEMPERATURE], c[:, SamplerCell.TOP_P] = [float_bits(t) for t in temps], float_bits(1.0)
    return torch.from_numpy(c)


# -- the parts ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprobs_must_be_none_or_an_integer_up_to_five(field):
    """A token's logprobs and a prompt's (``test_prompt_logprobs.py``) take the same values."""
    limits = Limits(QWEN.name, QWEN.vocab_size, 32, scores_prompts=True)
    for k in (None, 0, 3, K, np.int64(2)):
        validate(Request((1, 2), SP(**{field: k})), limits)
    for k in (-1, K + 1, 1.0, True, "2"):
        with pytest.raises(InvalidRequest, match=f"{field}: must be None or an integer in") as e:
            validate(Request((1, 2), SP(**{field: k})), limits)
        assert e.value.field == field


def test_logprobs_are_log_softmax_of_the_raw_logits_and_temperature_0_draws_the_argmax():
    """``sampler.logprobs`` is log_softmax in float32 (bf16 logits too), its largest the head of the sampler's
    candidates whatever the rows' temperatures; the sampler's temperature-0 rows take exactly the argmax the greedy
    graph takes, ties included (first index)."""
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(6, 50, generator=g) * 3).to(dtype)
        logits[2, [7, 30]] = logits[2].max() + 1  # a tie for the first place
        cells = _cells([0.0] * 3 + [1.0, 0.3, 2.5])
        tokens, candidates = Sampler(50, "cpu").draw(logits, cells, torch.arange(6))
        assert torch.equal(tokens, Sampler(50, "cpu")(logits, cells, torch.arange(6)))
        assert torch.equal(tokens[:3], logits[:3].argmax(-1)) and tokens[2] == 7
        lp, ids, top = logprobs(logits, tokens, candidates)
        want = torch.log_softmax(logits.float(), -1)
        assert lp.dtype == top.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (6, K)
        assert torch.equal(lp, want.gather(1, tokens[:, None])[:, 0])
        assert torch.equal(top, want.topk(K, -1).values) and torch.equal(want.gather(1, ids), top)


@pytest.mark.skipif(not interpreted(), reason="the kernel on CPU tensors runs in Triton's interpreter only")
def test_logprobs_drawn_by_the_kernel_are_log_softmax_up_to_rounding():
    """``Sampler.draw_logprobs`` with ``kernels.sample`` (its rows' log-sum-exp summed by tiles, a logprob a logit
    less it) against the torch ops' full log_softmax: the same tokens, logprobs within float32 rounding, and (where
    no two logits tie: float32) the same top ids; in bf16, whose ties the two order apart, each top id's logprob is
    log_softmax's."""
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(6, 3000, generator=g) * 3).to(dtype)
        cells = _cells([0.0] * 3 + [1.0, 0.3, 2.5])
        tokens, (lp, ids, top) = Sampler(3000, "cpu", KernelChoices(sampler=True)).draw_logprobs(
            logits, cells, torch.arange(6))  # fmt: skip
        want_tokens, (want_lp, want_ids, want_top) = Sampler(3000, "cpu").draw_logprobs(logits, cells, torch.arange(6))
        assert torch.equal(tokens, want_tokens) and (dtype == torch.bfloat16 or torch.equal(ids, want_ids))
        assert torch.allclose(lp, want_lp, atol=1e-5) and torch.allclose(top, want_top, atol=1e-5)
        assert torch.allclose(torch.log_softmax(logits.float(), -1).gather(1, ids), top, atol=1e-5)
        assert not torch.equal(lp, logits.float().gather(1, tokens[:, None])[:, 0])  # (not the raw logits)


def test_the_outbox_aligns_logprobs_with_tokens_and_hides_what_was_not_asked():
    """Two emits in one step's output, one with logprobs: NaN / -1 for the other's tokens, for the row that asked
    for none, and past k for the row that asked for 2; the result keeps k (id, logprob) pairs a token."""
    t = RequestTable(3, 16)
    for h, k in enumerate((None, 2, 0)):
        t.admit(h, Pending(f"r{h}", Request((1, 2), SP(logprobs=k)), h, (), ()))
    assert t.mode(np.array([0])) is SamplingMode.GREEDY and t.mode(np.array([0, 1])) is SamplingMode.LOGPROBS
    rows = np.arange(3)
    t.emit(rows[:1], np.array([5]), False)
    lp = TokenLogprobs(np.float32([-1, -2, -3]), np.arange(3 * K).reshape(3, K), -np.float32(np.ones((3, K))))
    t.emit(rows, np.array([6, 7, 8]), False, lp)
    out = t.take_output(True)
    assert out.tokens.tolist() == [5, 6, 7, 8]
    assert np.array_equal(out.logprob, [np.nan, np.nan, -2, -3], equal_nan=True)
    assert out.top_ids.tolist() == [[-1] * K, [-1] * K, [5, 6, -1, -1, -1], [-1] * K]
    assert np.isnan(out.top_logprobs[[0, 1, 3]]).all() and out.top_logprobs[2, :2].tolist() == [-1, -1]
    assert t.take_output(True).logprob is None
    r = t.finish(1, FinishReason.LENGTH)
    assert r.logprobs == (-2.0,) and r.top_logprobs == (((5, -1.0), (6, -1.0)),)
    assert t.finish(0, r.finish_reason).logprobs == () and t.asking == 1


# -- the engine --------------------------------------------------------------------------------------------------------
@attrs.frozen(eq=False)
class Served:
    """The requests served one way: the engine, its results, each request's logprobs as its step outputs streamed
    them (by id: per token (logprob, [5] ids, [5] logprobs), or None), each launch's (graph mode, logprobs read
    back, a row asks) and each step output's (has logprobs arrays, a token's request asks)."""

    engine: Engine
    results: list
    streamed: dict[str, list]
    launches: list[tuple[SamplingMode, bool, bool]]
    outputs: list[tuple[bool, bool]]


def _serve(way: str) -> Served:
    planning, overlap, prefill = WAYS[way]
    e = Engine(QWEN, attrs.evolve(BASE, planning=planning, overlap=overlap, prefill=prefill))
    g, launches, outputs, streamed, real = e.graphs, [], [], {}, e.launcher.launch
    mode_of = {id(v): k[1] for d in (g.host_graphs, g.decode_graphs) for k, v in d.items()}
    asking = {r.request_id for r in REQS if r.sampling.logprobs is not None}

    def launch(graphs, b, rows, serial, last_token, device_ids, decode, logprobs=False, tokens=1):
        launches.append((mode_of[id(graphs)], logprobs, e.table.asks_logprobs(rows)))
        return real(graphs, b, rows, serial, last_token, device_ids, decode, logprobs, tokens)

    def on_step(out):
        rids = out.request_ids.tolist()
        outputs.append((out.logprob is not None, bool(asking.intersection(rids))))
        for i, rid in enumerate(rids):
            streamed.setdefault(rid, []).append(None if out.logprob is None else
                                                (out.logprob[i], out.top_ids[i], out.top_logprobs[i]))  # fmt: skip

    e.launcher.launch = launch
    return Served(e, e.run(REQS, on_step=on_step), streamed, launches, outputs)


@pytest.fixture(scope="module")
def served() -> dict[str, Served]:
    return {way: _serve(way) for way in WAYS}


def test_logprobs_equal_transformers_log_softmax(served):
    """The resident arm's logprobs against transformers' log_softmax over the prompt and the tokens drawn (the first,
    a pass's, included): the drawn token's, and the k largest in order at the ids given; a greedy row that asks
    still draws the argmax."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3_5ForCausalLM(QWEN.model.cfg.to_hf()).eval()
    hf.load_state_dict(QWEN.model.state_dict(), strict=True)
    s = served["resident"]
    assert s.engine.stats.decode_steps > 0 and s.engine.stats.mixed_steps > 0 and s.engine.stats.mismatches == 0
    for req, r in zip(REQS, s.results, strict=True):
        k = req.sampling.logprobs
        if k is None:
            assert r.logprobs == () and r.top_logprobs == ()
            continue
        with torch.no_grad():
            logits = hf(torch.tensor([req.prompt + r.tokens[:-1]])).logits[0, len(req.prompt) - 1 :]
        want = torch.log_softmax(logits.float(), -1).numpy()  # [n, V]
        n = len(r.tokens)
        lp = np.array(r.logprobs)
        assert lp.shape == (n,) and all(len(t) == k for t in r.top_logprobs)
        np.testing.assert_allclose(lp, want[np.arange(n), list(r.tokens)], atol=1e-4)
        if k:
            top_ids = np.array([[i for i, _ in t] for t in r.top_logprobs])  # [n, k]
            top = np.array([[v for _, v in t] for t in r.top_logprobs])
            np.testing.assert_allclose(top, -np.sort(-want, -1)[:, :k], atol=1e-4)  # the k largest, in order
            np.testing.assert_allclose(want[np.arange(n)[:, None], top_ids], top, atol=1e-4)  # at these ids
        if req.sampling.temperature == 0:
            assert list(r.tokens) == want.argmax(-1).tolist()
            if k:
                assert np.array_equal(lp, top[:, 0])


@pytest.mark.parametrize("way", [w for w in WAYS if w != "resident"])
def test_every_way_gives_the_resident_arms_tokens_and_logprobs(served, way):
    s, base = served[way], served["resident"]
    assert [r.tokens for r in s.results] == [r.tokens for r in base.results]
    assert s.engine.stats.mismatches == 0
    if WAYS[way][2] is PrefillPlacement.IN_PASS:
        assert s.engine.stats.pass_rows > 0
    for a, b in zip(s.results, base.results, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert [[i for i, _ in t] for t in a.top_logprobs] == [[i for i, _ in t] for t in b.top_logprobs]


@pytest.mark.parametrize("way", list(WAYS))
def test_step_outputs_stream_each_results_logprobs(served, way):
    """Each request's logprobs as its step outputs streamed them are its result's, NaN / -1 where it asked for
    fewer; a step output holds logprobs arrays exactly when a token in it is an asking request's."""
    s = served[way]
    for r, req in zip(s.results, REQS, strict=True):
        k, got = req.sampling.logprobs, s.streamed[r.request_id]
        assert len(got) == len(r.tokens)
        if k is None:
            assert all(x is None or (np.isnan(x[0]) and (x[1] == -1).all()) for x in got)
            continue
        assert [float(x[0]) for x in got] == list(r.logprobs)
        assert [tuple(zip(x[1][:k].tolist(), x[2][:k].tolist(), strict=True)) for x in got] == list(r.top_logprobs)
        assert all((x[1][k:] == -1).all() and np.isnan(x[2][k:]).all() for x in got)
    assert all(has == asks for has, asks in s.outputs)
    assert (False, False) in s.outputs  # steps nobody asked in handed out no logprobs arrays


@pytest.mark.parametrize("way", ["resident", "host-overlap"])
def test_only_steps_with_a_row_that_asks_replay_the_logprobs_graph(served, way):
    """A step replays the LOGPROBS graph (and reads its logprobs back) exactly when one of its rows asks; the others
    replay the greedy or sampling graph; a bucket has one graph a mode."""
    s = served[way]
    assert {m for m, _, _ in s.launches} == set(SamplingMode)
    assert all((m is SamplingMode.LOGPROBS) == read == asks for m, read, asks in s.launches)
    g = s.engine.graphs
    assert set(g.decode_graphs) == set(g.host_graphs) == {(g.plans[b], m) for b in g.plans for m in SamplingMode}
