"""A prompt's logprobs (``SamplingParams.prompt_logprobs``: what an eval harness scores a text by, OpenAI's ``echo``
with ``logprobs``): each prompt token after the first, given those before it, with the k most likely tokens there.
Checked against transformers' log_softmax over the prompt on the same weights, for prompts of one token to several
chunks, in both planning arms with passes in the step, beside the decode steps and with the decode rows in the pass,
with the prefix cache on (a scored request restores nothing, so every position is computed); the tokens drawn are
those of the same requests not asking. The step outputs hand each prompt's logprobs over once, in the step of its
first token."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from test_engine import QWEN

from models.engine import Engine, EngineConfig, InvalidRequest, Limits, Planning, PrefillPlacement, Request, validate
from models.engine import SamplingParams as SP
from models.engine.requests import MAX_LOGPROBS

K = MAX_LOGPROBS
BASE = EngineConfig(page_size=4, max_seq_len=48, max_running=3, token_budget=10, prefix_cache=True, row_check=True)
WAYS = {
    "resident": (Planning.RESIDENT, False, PrefillPlacement.IN_STEP),
    "host-overlap-beside": (Planning.HOST, True, PrefillPlacement.BESIDE),
    "resident-overlap-in-pass": (Planning.RESIDENT, True, PrefillPlacement.IN_PASS),
}
_rng = np.random.default_rng(7)
SHARED = tuple(_rng.integers(1, QWEN.vocab_size, 22).tolist())  # the first prompt, which stays in the cache
PROMPTS = [SHARED, (9,), (3, 4), tuple(_rng.integers(1, QWEN.vocab_size, 27).tolist()), SHARED + (7,),
           tuple(_rng.integers(1, QWEN.vocab_size, 13).tolist()), SHARED + (5, 6)]  # fmt: skip
ASKS = (None, 2, 0, 5, 1, None, 3)  # the first runs alone: the fifth and the last extend its prompt
TEMPS = (0.0, 0.0, 0.8, 0.0, 0.0, 0.7, 0.0)


def _requests(scored: bool) -> list[Request]:
    return [Request(p, SP(max_tokens=4, temperature=t, seed=i, top_k=20 if t else 0,
                          prompt_logprobs=k if scored else None), request_id=f"r{i}")
            for i, (p, k, t) in enumerate(zip(PROMPTS, ASKS, TEMPS, strict=True))]  # fmt: skip


@attrs.frozen(eq=False)
class Served:
    engine: Engine
    results: list
    streamed: dict  # request id -> (its prompt logprobs as a step output gave them, that output's tokens' request ids)


def _serve(way: str, scored: bool = True) -> Served:
    planning, overlap, prefill = WAYS[way]
    e = Engine(QWEN, attrs.evolve(BASE, planning=planning, overlap=overlap, prefill=prefill))
    streamed = {}

    def on_step(out):
        for rid, lp in out.prompt_logprobs:
            assert rid not in streamed, "a prompt's logprobs handed over twice"
            streamed[rid] = (lp, out.request_ids.tolist())

    reqs = _requests(scored)
    first = e.run(reqs[:1], on_step=on_step)  # (its prompt's pages and checkpoints stay in the cache)
    return Served(e, first + e.run(reqs[1:], on_step=on_step), streamed)


@pytest.fixture(scope="module")
def served() -> dict[str, Served]:
    return {way: _serve(way) for way in WAYS}


def test_a_model_that_does_not_score_prompts_refuses_prompt_logprobs():
    """(Their values are checked as a token's logprobs are: ``test_logprobs.py``.)"""
    with pytest.raises(InvalidRequest, match="prompt_logprobs: whisper-x does not score prompts"):
        validate(Request((1, 2), SP(prompt_logprobs=1)), Limits("whisper-x", QWEN.vocab_size, 32))


def test_prompt_logprobs_equal_transformers_log_softmax(served):
    """Every way: prompt token i's logprob is log_softmax(logits at i - 1)[token i] and its k alternatives the k
    largest, in order, at the ids given (a prompt of one token has none); the scored requests restored nothing from
    the cache although their prefix was there (the unscored one did)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3_5ForCausalLM(QWEN.model.cfg.to_hf()).eval()
    hf.load_state_dict(QWEN.model.state_dict(), strict=True)
    want = {}
    for p in set(PROMPTS):
        with torch.no_grad():
            want[p] = torch.log_softmax(hf(torch.tensor([p])).logits[0].float(), -1).numpy()  # [P, V]
    for way, s in served.items():
        assert s.engine.stats.mismatches == 0 and s.engine.stats.prefix_hits == 0, way
        for r, p, k in zip(s.results, PROMPTS, ASKS, strict=True):
            if k is None:
                assert r.prompt_logprobs == () and r.prompt_top_logprobs == ()
                continue
            w = want[p][:-1]  # [P - 1, V]: position i - 1 predicts token i
            lp = np.array(r.prompt_logprobs)
            assert lp.shape == (len(p) - 1,) and all(len(t) == k for t in r.prompt_top_logprobs), way
            np.testing.assert_allclose(lp, w[np.arange(len(p) - 1), list(p[1:])], atol=1e-5)
            if k and len(p) > 1:
                ids = np.array([[i for i, _ in t] for t in r.prompt_top_logprobs])
                top = np.array([[v for _, v in t] for t in r.prompt_top_logprobs])
                np.testing.assert_allclose(top, -np.sort(-w, -1)[:, :k], atol=1e-5)
                np.testing.assert_allclose(w[np.arange(len(p) - 1)[:, None], ids], top, atol=1e-5)
    plain = _serve("resident", scored=False)
    assert plain.engine.stats.prefix_hits > 0  # (the unscored requests of the same prompts do restore)
    for s in served.values():
        assert [r.tokens for r in s.results] == [r.tokens for r in plain.results]


@pytest.mark.parametrize("way", list(WAYS))
def test_a_prompts_logprobs_come_once_in_the_step_of_its_first_token(served, way):
    """Each scored request's step output holds its prompt's logprobs once, with its first token in the same output,
    equal to its result's, -1 / NaN past the k it asked for."""
    s = served[way]
    assert set(s.streamed) == {f"r{i}" for i, k in enumerate(ASKS) if k is not None}
    for r, k in zip(s.results, ASKS, strict=True):
        if k is None:
            continue
        lp, rids = s.streamed[r.request_id]
        assert r.request_id in rids
        assert lp.logprob.tolist() == list(r.prompt_logprobs)
        got = [tuple(zip(i[:k].tolist(), v[:k].tolist(), strict=True)) for i, v in zip(lp.top_ids, lp.top_logprobs,
                                                                                      strict=True)]  # fmt: skip
        assert got == list(r.prompt_top_logprobs)
        assert (lp.top_ids[:, k:] == -1).all() and np.isnan(lp.top_logprobs[:, k:]).all()
