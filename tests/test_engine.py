"""The engine's two planning arms on the same prompts: identical tokens, and every resident decode step's rows match
the host streams (``resplan.row_check``, 0 mismatches). Tiny Qwen3.5 (random weights) at c=1 and c=8, under TURNS
with few slots, under KV pressure, with chunked prefill, with seeded sampling; tiny Whisper (self + cross pools)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from kernels.choices import KernelChoices
from kernels.runtime import interpreted
from models.engine import EngineConfig, Order, Planning, build_adapter
from models.engine.compare import check_pools, random_requests, run_arms
from models.layers.decode_attention import Backend
from resplan import KernelImpl

R, H = Planning.RESIDENT, Planning.HOST
QWEN = build_adapter("qwen3_5-tiny", seed=0)
BASE = EngineConfig(page_size=4, max_seq_len=32, row_check=True)
PROMPTS = random_requests(QWEN, 32, prompt_len=(3, 12), gen_len=(3, 10), seed=1)


def _pool_check(arm, engine):
    """Check every engine's page bookkeeping after each of its steps."""
    return lambda out: check_pools(engine)


def assert_same(runs, requests) -> None:
    """Identical tokens in both arms, the same schedule, every resident decode step row-checked with 0 mismatches."""
    res, host = runs[R], runs[H]
    assert all(t is not None for t in res.tokens), "a request was refused"
    assert res.tokens == host.tokens
    assert [len(t) for t in res.tokens] == [r.sampling.max_tokens for r in requests]
    s, hs = res.engine.stats, host.engine.stats
    assert (s.steps, s.decode_steps, s.mixed_steps, s.prefill_steps) == (
        hs.steps, hs.decode_steps, hs.mixed_steps, hs.prefill_steps)
    assert s.decode_steps > 0
    assert s.row_checks == s.decode_steps
    assert s.mismatches == 0, s.first_mismatches


CASES = {
    "c1": dict(max_running=1),
    "c8": dict(max_running=8),
    # (the one case whose resident arm runs the executor's Triton row ops, interpreted: a displacement nearly every
    # step writes rows whole; every other engine test on the CPU runs their torch references, KernelChoices.row_kernels)
    "turns-c8-bucket2": dict(max_running=8, max_bucket=2, order=Order.TURNS,
                             kernels=KernelChoices(row_kernels=True if interpreted() else None)),
    "kv-pressure-c8": dict(max_running=8, num_pages=14),
    "chunked-prefill-c4": dict(max_running=4, token_budget=5),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_resident_matches_host_greedy(case):
    cfg = attrs.evolve(BASE, **CASES[case])
    runs = run_arms(QWEN, cfg, PROMPTS, make_on_step=_pool_check)
    assert_same(runs, PROMPTS)
    s = runs[R].engine.stats
    assert s.early_hits > 0
    if case == "c8":
        assert s.mixed_steps > 0  # requests of different lengths: prefills land beside running decodes
        assert s.crossings > 0 and s.empty_flushes > 0
    if case == "turns-c8-bucket2":  # 8 requests take turns in 2 rows over 5 slots: displaced on nearly every step
        assert runs[R].engine.buckets == (1, 2)
        assert s.displacements > 0
        assert s.displacements >= s.decode_steps // 2
        assert runs[R].engine.executor.impl is (KernelImpl.TRITON if interpreted() else KernelImpl.REFERENCE)
    if case == "kv-pressure-c8":
        assert s.offloads > 0 and s.reloads == s.offloads
        assert runs[H].engine.stats.offloads == s.offloads
    if case == "chunked-prefill-c4":
        assert s.prefill_chunks > len(PROMPTS)
        assert s.mixed_steps > 0


@pytest.mark.skipif(not interpreted(), reason="this CPU engine runs Triton kernels in the interpreter only")
def test_greedy_steps_drawn_by_the_triton_argmax_give_torchs_tokens():
    """kernels.argmax (interpreted on the CPU) in the greedy graphs of both arms: torch's argmax's tokens (the tiny
    vocabulary is one tile: the one-launch path; tests/test_argmax.py holds the two-launch one to numpy's)."""
    cfg = attrs.evolve(BASE, max_running=4)
    want = run_arms(QWEN, attrs.evolve(cfg, kernels=KernelChoices(argmax=False)), PROMPTS[:8])
    got = run_arms(QWEN, attrs.evolve(cfg, kernels=KernelChoices(argmax=True)), PROMPTS[:8])
    assert_same(got, PROMPTS[:8])
    assert got[R].tokens == want[R].tokens


@pytest.mark.skipif(not interpreted(), reason="this CPU engine runs Triton kernels in the interpreter only")
def test_sampled_steps_drawn_by_the_sample_kernel_give_torchs_tokens():
    """kernels.sample (interpreted on the CPU) drawing the prefills' first tokens and the resident arm's sampling
    graphs' (the host arm's take the same Sampler): the torch sampler's tokens (the tiny model's float32 logits hold
    no ties in a head), min_tokens bans included."""
    reqs = random_requests(QWEN, 6, (3, 12), (4, 8), seed=11, temperature=0.9, top_p=0.9, top_k=16)
    reqs = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, min_tokens=3, stop_token_ids=tuple(range(1, 12))))
            if i % 2 else r for i, r in enumerate(reqs)]  # fmt: skip
    cfg = attrs.evolve(BASE, max_running=4)
    want = run_arms(QWEN, attrs.evolve(cfg, kernels=KernelChoices(sampler=False)), reqs, arms=(R,))
    got = run_arms(QWEN, attrs.evolve(cfg, kernels=KernelChoices(sampler=True)), reqs, arms=(R,))
    assert got[R].tokens == want[R].tokens
    assert any(len(t) < r.sampling.max_tokens for t, r in zip(got[R].tokens, reqs, strict=True))  # a stop drawn


def test_seeded_sampling_matches_across_arms():
    reqs = random_requests(QWEN, 16, (3, 12), (4, 10), seed=2, temperature=0.9, top_p=0.9, top_k=32)
    runs = run_arms(QWEN, attrs.evolve(BASE, max_running=4), reqs)
    assert_same(runs, reqs)
    greedy = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, temperature=0.0)) for r in reqs]
    g = run_arms(QWEN, attrs.evolve(BASE, max_running=4), greedy, arms=(R,))
    assert g[R].tokens != runs[R].tokens  # sampling took effect
    again = run_arms(QWEN, attrs.evolve(BASE, max_running=2), reqs, arms=(R,))  # other batches, same draws
    assert sum(a == b for a, b in zip(again[R].tokens, runs[R].tokens, strict=True)) >= len(reqs) // 2


def test_greedy_rows_beside_sampled_rows():
    """A batch with a sampled row replays the sampling graph and one of all-greedy rows the argmax graph: greedy
    requests get the same tokens either way, and the sampled ones really sample (the sampling graph ran)."""
    reqs = random_requests(QWEN, 8, (3, 12), (6, 6), seed=4)  # one output length: the same batches in both runs
    mixed = [r if i % 2 == 0 else attrs.evolve(r, sampling=attrs.evolve(r.sampling, temperature=1.0, seed=i))
             for i, r in enumerate(reqs)]  # fmt: skip
    cfg = attrs.evolve(BASE, max_running=4)
    greedy = run_arms(QWEN, cfg, reqs, arms=(R,))[R].tokens
    runs = run_arms(QWEN, cfg, mixed)
    assert_same(runs, mixed)
    got = runs[R].tokens
    assert [got[i] for i in range(0, 8, 2)] == [greedy[i] for i in range(0, 8, 2)]
    # the sampled requests' decode tokens are not the argmax continuation of their own prefix (prefill samples the
    # first token eagerly, so compare from the second on)
    conts = [attrs.evolve(mixed[i], prompt=tuple(mixed[i].prompt) + (got[i][0],),
                          sampling=attrs.evolve(mixed[i].sampling, temperature=0.0, max_tokens=len(got[i]) - 1))
             for i in range(1, 8, 2)]  # fmt: skip
    argmax = run_arms(QWEN, cfg, conts, arms=(R,))[R].tokens
    assert any(a != tuple(got[i][1:]) for a, i in zip(argmax, range(1, 8, 2), strict=True))


def test_whisper_resident_matches_host():
    whisper = build_adapter("whisper-test", seed=0)
    reqs = random_requests(whisper, 8, prompt_len=(2, 6), gen_len=(3, 8), seed=3)
    runs = run_arms(whisper, EngineConfig(page_size=4, max_seq_len=64, max_running=3, row_check=True), reqs,
                    make_on_step=_pool_check)
    assert_same(runs, reqs)
    e = runs[R].engine
    assert {p.key: p.mode.value for p in e.layout.pools} == {"self": "append", "cross": "read"}
    assert np.all(e.streams.kv["cross"].lengths == 0)  # every request finished and gave its context back


def test_stop_tokens_end_requests_in_both_arms():
    free = run_arms(QWEN, attrs.evolve(BASE, max_running=4), PROMPTS[:8], arms=(R,))[R].tokens
    stopping = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, stop_token_ids=(t[1],)))
                for r, t in zip(PROMPTS[:8], free, strict=True) if len(t) > 2]
    runs = run_arms(QWEN, attrs.evolve(BASE, max_running=4), stopping)
    res = runs[R].results
    assert runs[R].tokens == runs[H].tokens
    for r, out in zip(stopping, res, strict=True):
        first = out.tokens.index(r.sampling.stop_token_ids[0])
        assert len(out.tokens) == first + 1 and out.finish_reason.value == "stop"  # the stop token ends the output
    assert runs[R].engine.stats.mismatches == 0


def test_min_tokens_bans_the_stop_tokens_below_its_count_in_both_arms():
    """A stop token drawn at output index k ends a request whose min_tokens is k, and is banned from index k (the
    next most likely drawn) when it is k + 1: both arms, chunked prefill and decode, against transformers' greedy
    ``generate`` with ``min_new_tokens`` (its processor masks the end tokens) and the same weights."""
    transformers = pytest.importorskip("transformers")

    cfg = attrs.evolve(BASE, max_running=4, token_budget=5)
    free = run_arms(QWEN, cfg, PROMPTS[:8], arms=(R,))[R].tokens
    reqs = []
    for r, t in zip(PROMPTS[:8], free, strict=True):
        k = next((i for i in range(1, len(t)) if t[i] not in t[:i]), None)  # (a token not drawn before it)
        for m in () if k is None else (k, k + 1):
            sp = attrs.evolve(r.sampling, stop_token_ids=(t[k],), min_tokens=m, ignore_eos=True)
            reqs.append(attrs.evolve(r, sampling=sp, request_id=f"{r.request_id}-{m}"))
    assert len(reqs) >= 8
    runs = run_arms(QWEN, cfg, reqs)
    assert runs[R].tokens == runs[H].tokens and runs[R].engine.stats.mismatches == 0
    hf = transformers.Qwen3_5ForCausalLM(QWEN.model.cfg.to_hf()).eval()
    hf.load_state_dict(QWEN.model.state_dict(), strict=True)
    for req, out in zip(reqs, runs[R].results, strict=True):
        sp, ids = req.sampling, torch.tensor([req.prompt])
        assert sp.stop_token_ids[0] not in out.tokens[: sp.min_tokens]
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=sp.max_tokens,
                              min_new_tokens=sp.min_tokens, eos_token_id=sp.stop_token_ids[0], do_sample=False,
                              pad_token_id=sp.stop_token_ids[0])[0, ids.shape[1] :].tolist()  # fmt: skip
        assert list(out.tokens) == ref[: len(out.tokens)] and len(ref) >= len(out.tokens), (req.request_id, sp)


def test_engine_matches_transformers_generate():
    """The whole loop on the CPU (several prompts prefilled in one batched pass, then decode steps in both arms)
    against transformers' greedy ``generate`` with the same weights; a divergence only at a near-tie of
    transformers' own top two logits (< 1e-4, float32 summation order)."""
    transformers = pytest.importorskip("transformers")

    hf = transformers.Qwen3_5ForCausalLM(QWEN.model.cfg.to_hf()).eval()
    hf.load_state_dict(QWEN.model.state_dict(), strict=True)
    reqs = random_requests(QWEN, 8, prompt_len=(3, 12), gen_len=(8, 8), seed=7)
    runs = run_arms(QWEN, attrs.evolve(BASE, max_running=8), reqs)
    assert_same(runs, reqs)
    st = runs[R].engine.stats
    assert st.prefill_chunks == 8 and st.prefill_steps + st.mixed_steps < 8  # chunks shared a pass
    near_ties = 0
    for req, toks in zip(reqs, runs[R].tokens, strict=True):
        ids = torch.tensor([req.prompt])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                              do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        ref = out.sequences[0, ids.shape[1] :].tolist()
        for t, (a, b) in enumerate(zip(toks, ref, strict=True)):
            if a != b:
                top2 = out.scores[t][0].float().topk(2).values
                assert float(top2[0] - top2[1]) < 1e-4, f"step {t}: {a} vs {b}"
                near_ties += 1
                break
    assert near_ties <= 1


@pytest.mark.skipif(not (interpreted() or torch.cuda.is_available()), reason="Triton needs a GPU or TRITON_INTERPRET=1")
def test_triton_attention_in_both_arms_matches_torch_attention():
    """The plan-free Triton attention (here in Triton's interpreter on the CPU) in a resident bucket: both arms give
    the same tokens, every resident step row-checked, the bucket takes no host plan, and the tokens equal the
    plain-torch attention's (float32; the two differ by summation order only)."""
    cfg = attrs.evolve(BASE, max_running=8)
    runs = run_arms(QWEN, attrs.evolve(cfg, attention=Backend.TRITON), PROMPTS[:16])
    assert_same(runs, PROMPTS[:16])
    assert runs[R].engine.arm.state.cfg.buckets[0].host_plan_free
    assert runs[R].tokens == run_arms(QWEN, cfg, PROMPTS[:16], arms=(R,))[R].tokens


def test_a_decode_steps_wall_time_includes_the_pre_plan_it_makes(monkeypatch):
    """``decode_ns`` (the benchmark's decode tok/s) covers the whole loop iteration: the resident arm plans the next
    step at the end of this one (the pre-plan), and that time must count against decode steps as the host arm's fill
    does. Each plan is slowed to 0.1 s, longer than a step's forward here, so a pre-plan left outside the decode
    step's time shows: every pre-plan made in a decode step's iteration must be inside ``decode_ns``."""
    import time

    import models.engine.planning as planning

    plan = planning.plan

    def slow_plan(*args, **kwargs):
        time.sleep(0.1)
        return plan(*args, **kwargs)

    monkeypatch.setattr(planning, "plan", slow_plan)
    st = run_arms(QWEN, attrs.evolve(BASE, max_running=4, row_check=False), PROMPTS[:6], arms=(R,))[R].engine.stats
    made_in_decode_steps = st.early_steps - st.prefill_steps - st.mixed_steps  # at most one early plan a step
    assert st.early_hits > 0 and made_in_decode_steps >= 3
    assert st.decode_ns >= made_in_decode_steps * 0.1e9


@pytest.mark.parametrize("budget", [None, 4], ids=["whole-prompts", "chunks-of-4"])
def test_a_steady_step_is_a_decode_step_in_which_nothing_but_decoding_happened(budget):
    """``steady_steps`` counts the decode steps in which the scheduler's version did not move (no arrival, admission,
    landed pass, finish) and no pass was launched beside them (passes of whole prompts, and of 4 prompt tokens),
    each observed from outside here step by step; their host time (``steady_host_ns``) is their wall time less their
    wait for the GPU, and no other step adds to it."""
    from models.engine import Engine, PrefillPlacement

    eng = Engine(QWEN, attrs.evolve(BASE, max_running=4, row_check=False, token_budget=budget,
                                    prefill=PrefillPlacement.BESIDE))  # fmt: skip
    passes, launch_beside = [], eng.prefill.launch_beside
    eng.prefill.launch_beside = lambda *a, **k: (passes.append(1), launch_beside(*a, **k))[1]
    for r in PROMPTS[:6]:
        eng.submit(r)
    st, decode, steady = eng.stats, 0, 0
    while eng.has_work():
        version, launches = eng.scheduler.version, len(passes)
        before = (st.decode_steps, st.steady_steps, st.steady_host_ns, st.decode_ns, st.wait_ns)
        eng.step()
        launched = len(passes) > launches
        is_decode = st.decode_steps == before[0] + 1
        expect = is_decode and eng.scheduler.version == version and not launched
        assert st.steady_steps - before[1] == int(expect)
        host = (st.decode_ns - before[3]) - (st.wait_ns - before[4])
        assert st.steady_host_ns - before[2] == (host if expect else 0)
        decode, steady = decode + is_decode, steady + expect
    assert 0 < steady < decode


def test_a_bfloat16_recurrent_state_serves_both_arms_alike():
    """``EngineConfig(state_dtype=bfloat16)``: every SSM pool is bf16 (half the bytes a step moves for it), the resident
    and host arms give the same tokens (one state, rounded alike), overlap and offloads included, and the first token
    of each request (sampled from its prefill pass, before any state is stored) is the float32 state's."""
    cfg = attrs.evolve(BASE, **CASES["kv-pressure-c8"], state_dtype=torch.bfloat16)
    runs = run_arms(QWEN, cfg, PROMPTS, make_on_step=_pool_check, per_arm={R: dict(overlap=True)})
    assert_same(runs, PROMPTS)
    assert all(t.dtype == torch.bfloat16 for t in runs[R].engine.model_state.ssm)
    assert runs[R].engine.stats.offloads > 0
    f32 = run_arms(QWEN, attrs.evolve(cfg, state_dtype=torch.float32), PROMPTS, arms=(H,))[H]
    assert [r.tokens[0] for r in f32.results] == [r.tokens[0] for r in runs[H].results]
    with pytest.raises(ValueError, match="state_dtype"):
        EngineConfig(state_dtype=torch.float16)
