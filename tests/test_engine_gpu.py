"""The decode loop on the GPU (run on the H200: pytest -m gpu): real CUDA graphs, FlashInfer attention.

Tests that compare two engines token for token run each pass in its step (``prefill=IN_STEP``): a pass beside the
decode steps lands when the GPU has run it, so two engines would batch their rows differently, and in bf16 a GEMM over
other row counts may break a near-tie the other way (``test_prefill_kernels_gpu.py`` compares the two modes). The
5000-step row check runs the default, passes beside the decode steps."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from kernels.choices import KernelChoices
from models.engine import Engine, EngineConfig, Planning, PrefillPlacement, build_adapter
from models.engine.compare import random_requests, run_arms
from models.layers.decode_attention import Backend

IN_STEP = PrefillPlacement.IN_STEP  # two engines compared token for token batch alike

pytestmark = pytest.mark.gpu
R, H = Planning.RESIDENT, Planning.HOST


@pytest.fixture(scope="module", autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.parametrize("backend", [Backend.FA2, Backend.XQA, Backend.TRITON], ids=["fa2", "xqa", "triton"])
@pytest.mark.parametrize("concurrency", [1, 8], ids=["c1", "c8"])
def test_resident_matches_host_on_32_prompts_at_0_8b_shape(backend, concurrency):
    """0.8B-shaped random weights, bf16: same attention kernel in both arms, so greedy tokens must be identical;
    every resident step row-checked."""
    adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    reqs = random_requests(adapter, 32, prompt_len=(16, 96), gen_len=(8, 24), seed=5)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, attention=backend, max_running=concurrency, page_size=16,
                       max_seq_len=256, row_check=True, prefill=IN_STEP)
    runs = run_arms(adapter, cfg, reqs)
    assert runs[R].tokens == runs[H].tokens
    st = runs[R].engine.stats
    assert st.mismatches == 0 and st.row_checks > 0
    assert runs[R].engine.arm.state.cfg.buckets[0].host_plan_free is (backend is not Backend.FA2)


def test_overlapped_resident_matches_host_with_stop_tokens():
    """Real asynchrony (CUDA graphs, pinned readback, events): each decode step launched before the last one's tokens
    are read (no row check, which would sync), a third of the requests stopping on a token they first sample in a
    decode step. The tiny model (float32, torch attention): the 0.8B shape's random weights repeat one token from the
    start, so no request of it could stop mid-run."""
    adapter = build_adapter("qwen3_5-tiny", seed=0, device="cuda", dtype=torch.float32)
    reqs = random_requests(adapter, 32, prompt_len=(4, 40), gen_len=(8, 40), seed=7)
    cfg = EngineConfig(device="cuda", max_running=8, page_size=4, max_seq_len=96, prefill=IN_STEP)
    free = run_arms(adapter, cfg, reqs, arms=(H,))[H].tokens

    def stop_for(t: tuple[int, ...]) -> int | None:
        """A token the request first samples in a decode step (index >= 1: not the prefill's), if any."""
        return next((t[i] for i in range(1, len(t)) if t[i] not in t[:i]), None)

    stops = [stop_for(t) if i % 3 == 0 else None for i, t in enumerate(free)]
    assert sum(s is not None for s in stops) >= 4
    reqs = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, stop_token_ids=(s,))) if s is not None else r
            for r, s in zip(reqs, stops, strict=True)]  # fmt: skip
    runs = run_arms(adapter, cfg, reqs, per_arm={R: dict(overlap=True)})
    assert runs[R].tokens == runs[H].tokens
    st = runs[R].engine.stats
    print(f"\n{st.decode_steps} decode steps, {st.overlapped} overlapped, {st.discarded} rows dropped")
    assert st.overlapped > 0.5 * st.decode_steps and st.discarded > 0


@pytest.mark.parametrize("backend", [Backend.TORCH, Backend.TRITON], ids=["torch", "triton"])
def test_k_tokens_a_launch_give_one_token_launches_tokens_on_gpu_graphs(backend):
    """Captured graphs of 4 sub-steps (``tokens_per_launch``), overlapped, a third of the requests stopping on a
    token inside a launch: every request's tokens and finish reason equal the one-token engine's (the tiny model,
    float32: near-ties do not move with the batches, which admissions every 4 tokens change)."""
    adapter = build_adapter("qwen3_5-tiny", seed=0, device="cuda", dtype=torch.float32)
    reqs = random_requests(adapter, 32, prompt_len=(4, 40), gen_len=(8, 40), seed=7)
    cfg = EngineConfig(device="cuda", max_running=8, page_size=4, max_seq_len=96, prefill=IN_STEP, overlap=True,
                       attention=backend)  # fmt: skip
    free = run_arms(adapter, cfg, reqs, arms=(R,))[R].tokens
    reqs = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, stop_token_ids=(t[2 + i % 5],)))
            if i % 3 == 0 and len(t) > 7 else r for i, (r, t) in enumerate(zip(reqs, free, strict=True))]  # fmt: skip
    one = run_arms(adapter, cfg, reqs, arms=(R,))[R]
    k4 = run_arms(adapter, attrs.evolve(cfg, tokens_per_launch=4), reqs, arms=(R,))[R]
    assert [(r.tokens, r.finish_reason) for r in k4.results] == [(r.tokens, r.finish_reason) for r in one.results]
    st = k4.engine.stats
    print(f"\n{st.decode_steps} launches ({st.multi_token_steps} of 4 tokens) against {one.engine.stats.decode_steps}")
    assert st.multi_token_steps > 0 and st.decode_steps < one.engine.stats.decode_steps


@pytest.mark.parametrize("backend", [Backend.XQA, Backend.TRITON], ids=["xqa", "triton"])
def test_overlapped_resident_matches_host_at_0_8b_shape(backend):
    """The plan-free GPU attentions with overlap: greedy tokens and decode steps identical to the same engine
    without overlap."""
    adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    reqs = random_requests(adapter, 32, prompt_len=(16, 96), gen_len=(8, 40), seed=7)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, attention=backend, max_running=8, page_size=16,
                       max_seq_len=256, prefill=IN_STEP)
    sync = run_arms(adapter, cfg, reqs, arms=(R,))[R]
    over = run_arms(adapter, cfg, reqs, arms=(R,), per_arm={R: dict(overlap=True)})[R]
    assert over.tokens == sync.tokens
    st = over.engine.stats
    assert st.overlapped > 0.5 * st.decode_steps and st.decode_steps == sync.engine.stats.decode_steps


@pytest.mark.parametrize("backend", [Backend.XQA, Backend.TRITON], ids=["xqa", "triton"])
def test_plan_free_attention_and_fa2_agree_on_most_greedy_tokens(backend):
    """Different kernels, bf16 rounding: report (and bound loosely) how often the two backends' tokens agree. The
    first tokens come from prefill passes, which the decode attention has no part in: all equal."""
    adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    reqs = random_requests(adapter, 16, prompt_len=(16, 64), gen_len=(16, 16), seed=6)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, max_running=8, page_size=16, max_seq_len=256,
                       prefill=IN_STEP)
    a = run_arms(adapter, attrs.evolve(cfg, attention=backend), reqs, arms=(R,))[R].tokens
    b = run_arms(adapter, attrs.evolve(cfg, attention=Backend.FA2), reqs, arms=(R,))[R].tokens
    same = sum(x == y for x, y in zip(a, b, strict=True))
    first = sum(x[0] == y[0] for x, y in zip(a, b, strict=True))
    print(f"\n{backend.value} vs fa2: {same}/16 requests identical, {first}/16 first tokens identical")
    assert first == 16


def test_sampled_requests_on_gpu_graphs_draw_with_the_sample_kernel_as_with_torch_ops():
    """Sampled requests (min_tokens over stop ids in half of them) on the tiny model's captured graphs in float32:
    both arms draw with kernels.sample (prefills' first tokens, and the sampling graphs up to its rows) the same
    tokens, and those of the torch-op sampler (no equal logits in a float32 head). Buckets of 8 and 32 rows."""
    adapter = build_adapter("qwen3_5-tiny", seed=0, device="cuda", dtype=torch.float32)
    reqs = random_requests(adapter, 40, prompt_len=(4, 24), gen_len=(6, 14), seed=11, temperature=0.9, top_p=0.9,
                           top_k=16)  # fmt: skip
    reqs = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, min_tokens=3, stop_token_ids=tuple(range(1, 12))))
            if i % 2 else r for i, r in enumerate(reqs)]  # fmt: skip
    for running in (8, 32):
        cfg = EngineConfig(device="cuda", max_running=running, page_size=4, max_seq_len=64, prefill=IN_STEP)
        got = run_arms(adapter, attrs.evolve(cfg, kernels=KernelChoices(sampler=True)), reqs)
        want = run_arms(adapter, attrs.evolve(cfg, kernels=KernelChoices(sampler=False)), reqs, arms=(R,))
        assert got[R].tokens == got[H].tokens == want[R].tokens, running


def test_tiny_model_on_gpu_graphs_matches_transformers():
    """Our tiny Qwen3.5 served through captured graphs (float32, torch attention) vs transformers' generate."""
    transformers = pytest.importorskip("transformers")
    torch.backends.cudnn.allow_tf32 = False  # transformers' conv fallback goes through cuDNN, TF32 by default
    adapter = build_adapter("qwen3_5-tiny", seed=0, device="cuda", dtype=torch.float32)
    hf = transformers.Qwen3_5ForCausalLM(adapter.model.cfg.to_hf()).to("cuda").eval()
    hf.load_state_dict(adapter.model.state_dict(), strict=True)
    reqs = random_requests(adapter, 32, prompt_len=(4, 24), gen_len=(12, 12), seed=7)
    cfg = EngineConfig(device="cuda", max_running=8, page_size=4, max_seq_len=64, row_check=True, prefill=IN_STEP)
    runs = run_arms(adapter, cfg, reqs)
    assert runs[R].tokens == runs[H].tokens
    near_ties = 0
    for req, toks in zip(reqs, runs[R].tokens, strict=True):
        ids = torch.tensor([req.prompt], device="cuda")
        # an explicit mask: without one, transformers masks every prompt token equal to pad_token_id
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
                          do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        ref = out.sequences[0, ids.shape[1] :].tolist()
        for t, (a, b) in enumerate(zip(toks, ref, strict=True)):
            if a != b:  # allowed only where transformers' own top two logits nearly tie (summation order)
                top2 = out.scores[t][0].float().topk(2).values
                assert float(top2[0] - top2[1]) < 1e-3, f"step {t}: {a} vs {b}, margin {float(top2[0] - top2[1])}"
                near_ties += 1
                break
    assert near_ties <= 2


def test_logprobs_read_back_by_the_graph_pairs_match_transformers():
    """Greedy rows asking for 5 logprobs beside rows asking for none, through the resident arm's captured graph pairs
    with overlap (each graph reads its tokens and logprobs back into its own pinned entry): every token and its
    logprobs equal transformers' greedy tokens and the log_softmax of its logits (float32; within 1e-3, where its
    fla kernels and ours sum in other orders: a logprob read back from another row or step is off by far more)."""
    transformers = pytest.importorskip("transformers")
    torch.backends.cudnn.allow_tf32 = False
    adapter = build_adapter("qwen3_5-tiny", seed=0, device="cuda", dtype=torch.float32)
    hf = transformers.Qwen3_5ForCausalLM(adapter.model.cfg.to_hf()).to("cuda").eval()
    hf.load_state_dict(adapter.model.state_dict(), strict=True)
    reqs = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, logprobs=5 if i % 2 else None))
            for i, r in enumerate(random_requests(adapter, 12, prompt_len=(4, 24), gen_len=(10, 10), seed=5))]
    cfg = EngineConfig(device="cuda", max_running=4, page_size=4, max_seq_len=64, overlap=True, prefill=IN_STEP)
    results = Engine(adapter, cfg).run(reqs)
    checked = 0
    for req, res in zip(reqs, results, strict=True):
        ids = torch.tensor([req.prompt], device="cuda")
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, min_new_tokens=10,
                          do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        ref = out.sequences[0, ids.shape[1] :].tolist()
        assert len(res.logprobs) == (10 if req.sampling.logprobs else 0)
        for t, (a, b) in enumerate(zip(res.tokens, ref, strict=True)):
            want = torch.log_softmax(out.logits[t][0].float(), -1)
            if a != b:  # allowed only at a near-tie of transformers' top two logits; what follows differs
                top2 = out.logits[t][0].float().topk(2).values
                assert float(top2[0] - top2[1]) < 1e-3, f"step {t}: {a} vs {b}"
                break
            if req.sampling.logprobs:
                top = want.topk(5)
                assert abs(res.logprobs[t] - float(want[a])) < 1e-3
                got_ids, got_lp = zip(*res.top_logprobs[t], strict=True)
                assert np.allclose(got_lp, top.values.tolist(), atol=1e-3)
                assert np.allclose(want[list(got_ids)].tolist(), got_lp, atol=1e-3)  # (each id's own logprob)
                checked += 1
    assert checked >= 50


def test_row_check_holds_over_5000_resident_steps_with_displacement():
    """TURNS order over more requests than a small bucket holds: slots displaced nearly every step."""
    adapter = build_adapter("qwen3_5-tiny", seed=0, device="cuda", dtype=torch.float32)
    reqs = random_requests(adapter, 100, prompt_len=(4, 16), gen_len=(240, 260), seed=8)
    from models.engine import Order

    cfg = EngineConfig(device="cuda", max_running=12, max_bucket=4, order=Order.TURNS, page_size=4,
                       max_seq_len=320, row_check=True)
    st = run_arms(adapter, cfg, reqs, arms=(R,))[R].engine.stats
    print(f"\n{st.decode_steps} resident steps, {st.row_checks} row checks, {st.displacements} displacements, "
          f"{st.mismatches} mismatches")
    assert st.row_checks >= 5000 and st.mismatches == 0 and st.displacements > 1000
    assert np.isfinite(st.plan_ns)


def test_pdl_changes_no_token_and_no_logit():
    """Programmatic dependent launch (kernels/pdl.py) only moves kernel starts earlier: the 0.8B-shaped step gives
    the same tokens with it and without it (every kernel is deterministic, so a read before its producer finished
    shows as a difference), over steps where pages are crossed and rows finish."""
    import kernels.pdl as pdl

    if not pdl._supported():
        pytest.skip("this GPU or Triton cannot launch with PDL")
    adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    reqs = random_requests(adapter, 24, prompt_len=(16, 80), gen_len=(24, 40), seed=9)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, attention=Backend.TRITON, max_running=16, page_size=16,
                       max_seq_len=256, prefill=IN_STEP)
    tokens = {on: run_arms(adapter, attrs.evolve(cfg, kernels=KernelChoices(pdl=on)), reqs, arms=(R,))[R].tokens
              for on in (False, True)}  # fmt: skip
    assert tokens[True] == tokens[False]
