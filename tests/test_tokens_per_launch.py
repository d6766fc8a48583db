"""Decode launches of k tokens a row (``EngineConfig.tokens_per_launch``): each graph runs k sub-steps that gather the
rows, draw and commit, and the host plans, launches and reads back once per k tokens. Against the same engine at one
token a launch: the same tokens and finish reasons (greedy, seeded sampling, stop tokens inside a launch, lengths no
multiple of k, KV pressure with offloads, rows displaced from the store, chunked prompts, passes beside the steps,
overlap on and off), every resident step's rows equal to the host streams (row check), the pools whole after every
step; launches of k tokens did run, and a step falls back to one token where a row asks for logprobs or would write
past its context."""

from __future__ import annotations

import attrs
import pytest
from test_engine import BASE, QWEN

from models.engine import Engine, EngineConfig, FinishReason, Order, Planning, PrefillPlacement, build_adapter
from models.engine.compare import check_pools, random_requests
from models.engine.requests import Request, SamplingParams
from models.layers.decode_attention import Backend

K = 4  # tokens a launch (page size 4: a row opens at most one page in a launch)
REQS = random_requests(QWEN, 24, prompt_len=(3, 12), gen_len=(2, 13), seed=7)
CASES = {
    "c1": dict(max_running=1),
    "c4-overlap": dict(max_running=4, overlap=True),
    "c8-beside": dict(max_running=8, prefill=PrefillPlacement.BESIDE),  # (k-token steps beside passes)
    "kv-pressure-c8-overlap": dict(max_running=8, num_pages=14, overlap=True),
    "chunked-c4": dict(max_running=4, token_budget=5),
    "turns-c8-bucket2": dict(max_running=8, max_bucket=2, order=Order.TURNS),  # (rows displaced nearly every step)
}


def _serve(cfg, reqs):
    """``reqs`` served by one engine of ``cfg``, its pools checked after every step, and each request's tokens as
    the step outputs streamed them equal to its result's; (engine, results)."""
    e, streamed = Engine(QWEN, cfg), {}

    def on_step(out):
        check_pools(e)
        for rid, t in zip(out.request_ids.tolist(), out.tokens.tolist(), strict=True):
            streamed.setdefault(rid, []).append(t)

    results = e.run(reqs, on_step=on_step)
    assert all(streamed.get(r.request_id, []) == list(r.tokens) for r in results)
    return e, results


def _outcome(results):
    return [(r.tokens, r.finish_reason) for r in results]


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_k_tokens_a_launch_give_one_token_launches_results(case):
    cfg = attrs.evolve(BASE, **CASES[case])
    one, want = _serve(cfg, REQS)
    e, got = _serve(attrs.evolve(cfg, tokens_per_launch=K), REQS)
    assert _outcome(got) == _outcome(want)
    s = e.stats
    assert s.multi_token_steps > 0 and s.decode_steps < one.stats.decode_steps
    assert s.tokens == one.stats.tokens and s.decode_rows >= one.stats.decode_rows  # (drawn past an end: dropped)
    assert s.row_checks == s.decode_steps and s.mismatches == 0, s.first_mismatches
    if case.startswith("kv-pressure"):
        assert s.offloads > 0 and s.reloads == s.offloads
    if case.startswith("turns"):
        assert s.displacements > 0


def test_stop_tokens_inside_a_launch_end_the_request_there():
    """Each request's stop token is its own greedy continuation's 3rd, 6th, ... token: it stops on it, inside a
    launch, with the tokens after it dropped."""
    cfg = attrs.evolve(BASE, max_running=4, overlap=True)
    free = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, max_tokens=14, ignore_eos=True)) for r in REQS[:8]]
    _, runs = _serve(cfg, free)
    stopped = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, stop_token_ids=(res.tokens[2 + 3 * (i % 4)],)))
               for i, (r, res) in enumerate(zip(free, runs, strict=True))]  # fmt: skip
    _, want = _serve(cfg, stopped)
    e, got = _serve(attrs.evolve(cfg, tokens_per_launch=K), stopped)
    assert _outcome(got) == _outcome(want)
    assert all(r.finish_reason is FinishReason.STOP for r in got)
    assert e.stats.multi_token_steps > 0


def test_seeded_sampling_draws_the_same_tokens():
    reqs = random_requests(QWEN, 12, (3, 12), (4, 12), seed=2, temperature=0.9, top_p=0.9, top_k=32)
    cfg = attrs.evolve(BASE, max_running=4, overlap=True)
    _, want = _serve(cfg, reqs)
    _, got = _serve(attrs.evolve(cfg, tokens_per_launch=K), reqs)
    assert _outcome(got) == _outcome(want)


def test_a_step_runs_one_token_where_a_row_asks_for_logprobs_or_its_context_ends_within_k():
    cfg = attrs.evolve(BASE, max_running=2, tokens_per_launch=K)  # (context 32)
    e = Engine(QWEN, cfg)
    e.run([Request((1, 2, 3), SamplingParams(max_tokens=10, logprobs=2, ignore_eos=True))])
    assert e.stats.decode_rows == e.stats.decode_steps == 9  # (the first token is the pass's)
    e = Engine(QWEN, cfg)
    r = e.run([Request((1, 2, 3), SamplingParams(max_tokens=8, ignore_eos=True))])[0]
    assert len(r.tokens) == 8 and (e.stats.decode_steps, e.stats.decode_rows) == (2, 8)  # 4 + 4, the last dropped
    e = Engine(QWEN, cfg)
    r = e.run([Request(tuple(range(1, 26)), SamplingParams(max_tokens=8, ignore_eos=True))])[0]
    assert len(r.tokens) == 7 and r.finish_reason is FinishReason.LENGTH  # (the context's 32 tokens end it)
    assert e.stats.multi_token_steps == 1 and e.stats.decode_steps == 3  # KV 25 + 4 + 1 + 1: 33 would pass the end


@pytest.mark.parametrize("change, match", [
    (dict(planning=Planning.HOST), "needs resident planning"),
    (dict(page_size=2), "more than page_size 2"),
], ids=["host", "over-a-page"])  # fmt: skip
def test_k_tokens_a_launch_refuse_what_they_cannot_serve(change, match):
    with pytest.raises(ValueError, match=match):
        attrs.evolve(BASE, tokens_per_launch=K, **change)


def test_fa2_attention_is_refused_for_k_tokens_a_launch():
    with pytest.raises(ValueError, match="needs an attention without a host plan"):
        attrs.evolve(BASE, device="cuda", attention=Backend.FA2, tokens_per_launch=K)


def test_a_stream_that_ran_past_its_last_token_is_cached_without_a_checkpoint():
    """With the prefix cache, a reply whose last launch ran past its last token (7 tokens: the pass's, 4, then 4 with
    2 dropped) leaves its full pages cached and no checkpoint of its state, which is 2 tokens past; its next turn
    restores the prompt's end instead and gets the tokens it gets without the cache. At one token a launch the reply's
    end is checkpointed."""
    cache = dict(prefix_cache=True, checkpoints=4, checkpoint_interval=64, max_running=1, max_seq_len=64)
    first = Request(tuple(range(1, 11)), SamplingParams(max_tokens=7, ignore_eos=True))
    taken = {}
    for k in (1, K):
        e = Engine(QWEN, attrs.evolve(BASE, tokens_per_launch=k, **cache))
        reply = e.run([first])[0].tokens
        taken[k] = e.stats.checkpoints_taken
        nxt = Request(first.prompt + reply + (5, 6), SamplingParams(max_tokens=6, ignore_eos=True))
        got = e.run([nxt])[0].tokens
        assert got == Engine(QWEN, attrs.evolve(BASE, tokens_per_launch=k, max_seq_len=64)).run([nxt])[0].tokens
        assert e.stats.prefix_hits == 1
    assert taken == {1: 2, K: 1}  # (the prompt's end; and at one token a launch the reply's end)


def test_whisper_reads_its_context_pool_beside_k_token_launches():
    """Whisper's decoder (an APPEND self-attention pool and a READ cross-attention pool): the same tokens at 4 tokens
    a launch, the row check at 0."""
    whisper = build_adapter("whisper-test", seed=0)
    reqs = random_requests(whisper, 8, prompt_len=(2, 6), gen_len=(3, 12), seed=3)
    cfg = EngineConfig(page_size=4, max_seq_len=64, max_running=3, row_check=True)
    want = Engine(whisper, cfg).run(reqs)
    e = Engine(whisper, attrs.evolve(cfg, tokens_per_launch=K))
    assert _outcome(e.run(reqs)) == _outcome(want)
    assert e.stats.multi_token_steps > 0 and e.stats.mismatches == 0
