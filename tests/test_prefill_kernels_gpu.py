"""The prefill pass on its CUDA kernels (fla-core's delta rule, FlashInfer's paged prefill, the Triton varlen conv)
against the same pass on the torch references, at the 0.8B shape in bf16: logits and every pool, fresh and continuing
chunks; and an engine on the kernels gives the torch path's greedy tokens."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from test_prefill_graphs import _pools, _randomize_cuda

from kernels.choices import KernelChoices
from models.engine import EngineConfig, Planning, PrefillPlacement, build_adapter
from models.engine.compare import random_requests, run_arms
from models.qwen3_5 import PrefillChunk

pytestmark = pytest.mark.gpu


def _adapter():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)


def _assert_close_to_scale(name: str, got: torch.Tensor, want: torch.Tensor, frac: float) -> None:
    """max |got - want| <= frac * max |want|, printed."""
    diff, scale = (got.float() - want.float()).abs().max().item(), want.float().abs().max().item()
    print(f"\n{name}: max |diff| {diff:.3g}, max |want| {scale:.3g}")
    assert diff <= frac * scale, f"{name}: max |diff| {diff:.3g} over {frac:g} of max |want| {scale:.3g}"


@pytest.mark.parametrize("starts", [None, [0, 300, 17, 0, 64]], ids=["fresh", "continuing"])
def test_the_kernels_pass_equals_the_torch_pass(starts):
    """Chunks of 700, 1, 130, 64, 255 tokens. Tolerances are fractions of each tensor's largest magnitude (bf16
    activations through 24 random layers give logits of ~900, where one bf16 step is 4; the torch delta rule runs in
    float32, fla's in bf16 with float32 states): logits 1%, pools 2%; argmax equal."""
    model = _adapter().model
    rng = np.random.default_rng(0)
    lens = [700, 1, 130, 64, 255]
    starts = starts or [0] * len(lens)
    ps, pages, slots = 16, 256, 8
    need = [-(-(s + n) // ps) for s, n in zip(starts, lens, strict=True)]
    perm = rng.permutation(np.arange(1, pages))[: sum(need)]
    chunks, at = [], 0
    for n, s, k, slot in zip(lens, starts, need, rng.permutation(np.arange(1, slots))[: len(lens)], strict=True):
        ids = rng.integers(0, model.cfg.vocab_size, n)
        chunks.append(PrefillChunk(ids, perm[at : at + k], s, int(slot), int(rng.integers(0, 3))))
        at += k
    states = [model.allocate_state(pages, ps, slots, "cuda", torch.bfloat16) for _ in range(2)]
    for st in states:
        _randomize_cuda(st, 2)
    kern, ref = states
    got = model.prefill_batch(kern, chunks)
    want = model.prefill_batch(ref, chunks, KernelChoices(prefill_kernels=False))
    _assert_close_to_scale("logits", got, want, 1e-2)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for i, (x, y) in enumerate(zip(_pools(kern), _pools(ref), strict=True)):
        _assert_close_to_scale(f"pool {i}", x[1:], y[1:], 2e-2)  # slot / page 0: the sink


def test_an_engine_on_the_prefill_kernels_gives_the_torch_paths_tokens():
    """Varied prompts (20-600 tokens), a token budget (so passes mix continuing and fresh chunks), XQA decode: the
    engine with prefill on the kernels and with prefill on the torch references give the same greedy first tokens
    for every request, and the same tokens for all but at most one."""
    adapter = _adapter()
    from models.layers.decode_attention import Backend

    reqs = random_requests(adapter, 16, prompt_len=(20, 600), gen_len=(4, 12), seed=7)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, attention=Backend.XQA, max_running=8, page_size=16,
                       max_seq_len=640, token_budget=512,
                       prefill=PrefillPlacement.IN_STEP)  # both batch alike  # fmt: skip
    kern = run_arms(adapter, cfg, reqs)
    ref = run_arms(adapter, attrs.evolve(cfg, kernels=KernelChoices(prefill_kernels=False)), reqs)
    for arm in kern:
        firsts = sum(a[0] == b[0] for a, b in zip(kern[arm].tokens, ref[arm].tokens, strict=True))
        same = sum(a == b for a, b in zip(kern[arm].tokens, ref[arm].tokens, strict=True))
        print(f"\n{arm}: first tokens equal {firsts}/16, all tokens {same}/16")
        assert firsts == 16 and same >= 15


def _against_passes_in_the_step(**change):
    """16 requests at the 0.8B shape in bf16 on the prefill kernels (prompts of 20-600 tokens under a budget of 512),
    XQA decode, prefill graphs, overlap and row checks: an engine with ``change`` against one that runs each pass in its
    step with a decode graph beside it. Per arm: (first tokens equal, whole requests equal, the changed engine's
    stats)."""
    from models.layers.decode_attention import Backend

    adapter = _adapter()
    reqs = random_requests(adapter, 16, prompt_len=(20, 600), gen_len=(4, 24), seed=9)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, attention=Backend.XQA, max_running=8, page_size=16,
                       max_seq_len=640, token_budget=512, prefill_graphs=4, prefill_graph_tokens=2048,
                       overlap=True, row_check=True, prefill=PrefillPlacement.IN_STEP)  # fmt: skip
    base = run_arms(adapter, cfg, reqs)
    other = run_arms(adapter, attrs.evolve(cfg, **change), reqs)
    out = {}
    for arm in other:
        firsts = sum(a[0] == b[0] for a, b in zip(other[arm].tokens, base[arm].tokens, strict=True))
        same = sum(a == b for a, b in zip(other[arm].tokens, base[arm].tokens, strict=True))
        out[arm] = (firsts, same, other[arm].engine.stats)
        print(f"\n{arm} {change}: first tokens equal {firsts}/16, all tokens {same}/16")
    return out


def test_decode_rows_in_the_pass_give_nearly_the_tokens_of_a_decode_graph_beside_it():
    """Decode rows riding in the prefill pass run other kernels (fla's chunked rule and FlashInfer's prefill instead
    of the decode step's), so bf16 near-ties may break the other way: at least 15/16 first tokens and 12/16 whole
    requests equal; every row checked in the resident arms."""
    for firsts, same, st in _against_passes_in_the_step(prefill=PrefillPlacement.IN_PASS).values():
        assert st.pass_rows > 0 and st.mismatches == 0
        assert firsts >= 15 and same >= 12


@pytest.mark.parametrize("placement", [PrefillPlacement.BESIDE, PrefillPlacement.BESIDE_PRIORITY])
def test_passes_beside_decode_steps_give_nearly_the_tokens_of_passes_in_the_step(placement):
    """Passes on their own stream beside the decode steps (``BESIDE``; the decode steps on a stream of higher
    priority with ``BESIDE_PRIORITY``) group other chunks, and the decode steps other rows (their GEMMs see other row
    counts), so bf16 near-ties may break the other way: at least 15/16 first tokens and 12/16 whole requests equal;
    every row checked in the resident arm, and some decode steps ran while a pass was in flight."""
    for firsts, same, st in _against_passes_in_the_step(prefill=placement).values():
        print(f"decode steps beside a pass: {st.decode_beside_pass} of {st.decode_steps}")
        assert st.decode_beside_pass > 0 and st.mixed_steps == 0 and st.mismatches == 0
        assert firsts >= 15 and same >= 12


def test_prompt_logprobs_on_the_prefill_kernels_are_the_torch_paths():
    """Scored prompts (``SamplingParams.prompt_logprobs``) of 20-600 tokens under a budget of 512, with prefill graphs
    (a pass holding one runs eagerly, at its exact shape, on the kernels) against the engine on the torch references:
    every scored token's logprob within 2% of the largest magnitude (bf16 logits of ~900, as above), the most likely
    token at each position the same at >= 99% of them, and the same greedy first tokens."""
    from models.layers.decode_attention import Backend

    adapter = _adapter()
    reqs = [attrs.evolve(r, sampling=attrs.evolve(r.sampling, prompt_logprobs=1 if i % 4 else None))
            for i, r in enumerate(random_requests(adapter, 12, prompt_len=(20, 600), gen_len=(2, 2), seed=3))]
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, attention=Backend.XQA, max_running=8, page_size=16,
                       max_seq_len=640, token_budget=512, prefill_graphs=4, prefill_graph_tokens=2048,
                       prefix_cache=True, prefill=PrefillPlacement.IN_STEP)  # fmt: skip
    kern = run_arms(adapter, cfg, reqs, arms=(Planning.RESIDENT,))[Planning.RESIDENT]
    # (the torch references read lengths back to the host: their passes cannot be captured, so they run eagerly)
    ref = run_arms(adapter, attrs.evolve(cfg, kernels=KernelChoices(prefill_kernels=False), prefill_graphs=0), reqs,
                   arms=(Planning.RESIDENT,))[Planning.RESIDENT]  # fmt: skip
    got, want, top_same, n = [], [], 0, 0
    for req, a, b in zip(reqs, kern.results, ref.results, strict=True):
        assert a.tokens[0] == b.tokens[0]
        if req.sampling.prompt_logprobs is None:
            assert a.prompt_logprobs == ()
            continue
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs) == len(req.prompt) - 1
        got += a.prompt_logprobs
        want += b.prompt_logprobs
        top_same += sum(x[0][0] == y[0][0] for x, y in zip(a.prompt_top_logprobs, b.prompt_top_logprobs, strict=True))
        n += len(a.prompt_top_logprobs)
    _assert_close_to_scale("prompt logprobs", torch.tensor(got), torch.tensor(want), 2e-2)
    assert top_same >= 0.99 * n, f"{top_same} of {n} positions' most likely token equal"
