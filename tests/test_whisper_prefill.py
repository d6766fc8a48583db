"""Whisper's batched decoder prefill (``WhisperModel.prefill_batch``): several requests' chunks in one flat pass give
what each chunk's own ``prefill`` gives, fresh and continuing, with and without a context, and leave the self pool
as the chunks alone would; the cross pool is only read."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from models.engine import build_adapter
from models.whisper import DecoderChunk

MODEL = build_adapter("whisper-test", seed=0).model
PS = {"self": 4, "cross": 8}
PAGES = {"self": 40, "cross": 16}


def _state_with_contexts(rng, n_requests: int):
    """A state whose cross pool holds every request's encoded context (random mel, 24-40 frames) on its own pages;
    returns it with each request's cross pages and context length."""
    state = MODEL.allocate_state(PAGES, PS)
    cross_pages, cross_lens = [], []
    free = list(rng.permutation(np.arange(1, PAGES["cross"])))
    for _ in range(n_requests):
        mel = torch.from_numpy(rng.standard_normal((MODEL.cfg.num_mel_bins, int(rng.integers(24, 41))))).float()
        pages = [int(free.pop()) for _ in range(3)]
        cross_lens.append(MODEL.encode(state, mel, pages))
        cross_pages.append(pages)
    return state, cross_pages, cross_lens


def _clone(state):
    return {k: tuple(t.clone() for t in v) for k, v in state.items()}


@pytest.mark.parametrize("seed", range(3))
def test_a_batched_prefill_equals_each_chunk_alone(seed):
    """Four requests: a fresh prompt, a chunk continuing a stream of 6 tokens, one token with no context (cross
    length 0), and a chunk continuing across a page. Logits of each chunk's last token within 1e-5 of its own
    prefill's (float32), and both self pools equal after; the cross pool unchanged."""
    rng = np.random.default_rng(seed)
    state, cross_pages, cross_lens = _state_with_contexts(rng, 4)
    cross_lens[2] = 0  # a request with no context: its cross-attention adds only its output bias
    lens, starts = [5, 3, 1, 4], [0, 6, 0, 3]
    free = list(rng.permutation(np.arange(1, PAGES["self"])))
    need = [-(-(s + n) // PS["self"]) for s, n in zip(starts, lens, strict=True)]
    self_pages = [[int(free.pop()) for _ in range(k)] for k in need]
    V = MODEL.cfg.vocab_size
    for r, s in enumerate(starts):  # the streams' earlier tokens, prefilled alone
        if s:
            MODEL.prefill(state, torch.from_numpy(rng.integers(0, V, s)), self_pages[r], 0, cross_pages[r],
                          cross_lens[r])  # fmt: skip
    chunks = [DecoderChunk(rng.integers(0, V, n), self_pages[r], starts[r], cross_pages[r], cross_lens[r],
                           pos_offset=int(rng.integers(0, 3)))
              for r, n in enumerate(lens)]  # fmt: skip
    alone, batched = _clone(state), _clone(state)
    want = torch.stack([MODEL.prefill(alone, torch.from_numpy(c.token_ids), c.self_pages, c.start, c.cross_pages,
                                      c.cross_len, c.pos_offset)[-1] for c in chunks])  # fmt: skip
    got = MODEL.prefill_batch(batched, chunks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(alone["self"], batched["self"], strict=True):
        torch.testing.assert_close(a[1:], b[1:], atol=1e-6, rtol=1e-6)  # page 0: the sink
    for a, b in zip(state["cross"], batched["cross"], strict=True):
        assert torch.equal(a, b)


def test_a_batched_prefill_refuses_a_chunk_its_pages_cannot_hold():
    state = MODEL.allocate_state(PAGES, PS)
    ok = DecoderChunk(np.arange(3), [1], 0, [], 0)
    short = DecoderChunk(np.arange(6), [2], 0, [], 0)  # 6 tokens on one 4-token page
    with pytest.raises(ValueError, match="self pages"):
        MODEL.prefill_batch(state, [ok, short])


# -- on the GPU: FlashInfer's paged prefill, and captured passes ----------------------------------------------------


def _tiny_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return build_adapter("whisper-tiny", seed=0, device="cuda", dtype=torch.bfloat16)


def _cuda_chunks(model, state, rng, lens, starts, cross_lens_zero=()):
    """Chunks on distinct self pages of a whisper-tiny state whose cross pool holds a context for each (random mel,
    100-400 frames); the streams' earlier tokens prefilled first, on the same kernels."""
    ps, ps_c = state["self"][0].shape[2], state["cross"][0].shape[2]
    free = list(rng.permutation(np.arange(1, state["self"][0].shape[0])))
    free_c = list(rng.permutation(np.arange(1, state["cross"][0].shape[0])))
    V = model.cfg.vocab_size
    chunks = []
    for r, (n, s) in enumerate(zip(lens, starts, strict=True)):
        mel = torch.from_numpy(rng.standard_normal((model.cfg.num_mel_bins, int(rng.integers(100, 401))))).float()
        cross = [int(free_c.pop()) for _ in range(-(-200 // ps_c))]
        n_ctx = 0 if r in cross_lens_zero else model.encode(state, mel, cross)
        pages = [int(free.pop()) for _ in range(-(-(s + n) // ps))]
        if s:
            model.prefill(state, torch.from_numpy(rng.integers(0, V, s)), pages, 0, cross, n_ctx)
        chunks.append(DecoderChunk(rng.integers(0, V, n), pages, s, cross, n_ctx, int(rng.integers(0, 3))))
    return chunks


def _close_and_same_argmax(got, want, frac=0.02):
    """Within ``frac`` of the logits' scale; argmax equal wherever the reference's top two are further apart than that
    tolerance (a nearer pair may swap on one bf16 rounding)."""
    got, want = got.float(), want.float()
    atol = frac * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * atol
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


@pytest.mark.gpu
def test_flashinfers_prefill_pass_equals_the_torch_pass_on_cuda():
    """whisper-tiny in bf16: a fresh prompt, a chunk continuing 37 tokens, one with no context, one crossing pages;
    FlashInfer's pass (causal self, full cross) against the torch references on a copy of the same state: logits
    within 2% of their scale (argmax equal where not near a tie), self pools within 2%, the cross pool untouched."""
    model = _tiny_on_cuda().model
    rng = np.random.default_rng(7)
    state = model.allocate_state({"self": 64, "cross": 64}, {"self": 16, "cross": 16})
    assert state.prefill_attention is not None
    chunks = _cuda_chunks(model, state, rng, [40, 9, 1, 30], [0, 37, 0, 10], cross_lens_zero=(2,))
    ref = type(state)({k: tuple(t.clone() for t in v) for k, v in state.items()})  # no FlashInfer: the references
    cross_before = [t.clone() for t in state["cross"]]
    got = model.prefill_batch(state, chunks)
    want = model.prefill_batch(ref, chunks)
    _close_and_same_argmax(got, want)
    for a, b in zip(state["self"], ref["self"], strict=True):
        torch.testing.assert_close(a[1:].float(), b[1:].float(), atol=0.02 * b.abs().max().item(), rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(state["cross"], cross_before, strict=True))


@pytest.mark.gpu
def test_a_replayed_whisper_bucket_pass_equals_the_eager_pass_on_cuda():
    """One token bucket (128 tokens, up to 4 chunks), three compositions: A's pass captured, B's and C's replayed over
    a copy of their inputs; logits equal eager exact-shape passes on FlashInfer (bf16 tolerance: the
    graph's plan may split the KV where the exact one does not)."""
    from models.engine.prefill_graphs import PrefillGraphs
    from models.layers.flat import bucket_shape

    model = _tiny_on_cuda().model
    rng = np.random.default_rng(8)
    pages = {"self": 96, "cross": 96}
    graphed, eager = (model.allocate_state(pages, {"self": 16, "cross": 16}) for _ in range(2))
    shape = bucket_shape(128, 4, pages["self"], 16)
    graphs = PrefillGraphs(lambda batch: model.prefill_forward(graphed, batch), "cuda")
    for i, (lens, starts) in enumerate((([30, 5, 60], [0, 0, 0]), ([1, 40, 7, 50], [0, 12, 3, 0]), ([127], [0]))):
        seed = int(rng.integers(0, 2**31))
        c_g = _cuda_chunks(model, graphed, np.random.default_rng(seed), lens, starts)
        c_e = _cuda_chunks(model, eager, np.random.default_rng(seed), lens, starts)
        batch = model.prefill_inputs(graphed, c_g, shape, graphed=True)
        got = (graphs.capture(batch) if i == 0 else graphs.run(batch))[: len(c_g)].clone()
        want = model.prefill_batch(eager, c_e)
        assert graphs.stats.replays == i
        _close_and_same_argmax(got, want)


@pytest.mark.gpu
def test_a_whisper_engine_on_cuda_prefill_graphs_gives_the_eager_engines_tokens():
    """whisper-tiny in bf16: prompts chunked by a token budget of 24, served from captured token-bucket passes (8 ...
    64 tokens) and eagerly; both arms' greedy tokens equal."""
    from models.engine import EngineConfig, PrefillPlacement
    from models.engine.compare import random_requests, run_arms

    adapter = _tiny_on_cuda()
    reqs = random_requests(adapter, 12, prompt_len=(4, 40), gen_len=(3, 10), seed=9)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, max_running=4, page_size=16, max_seq_len=128,
                       token_budget=24, prefill=PrefillPlacement.IN_STEP)  # both batch alike: passes in the step
    eager = run_arms(adapter, cfg, reqs)
    graphed = run_arms(adapter, attrs.evolve(cfg, prefill_graphs=4, prefill_graph_tokens=64), reqs)
    for arm in eager:
        assert graphed[arm].tokens == eager[arm].tokens
        assert graphed[arm].engine.prefill.graphs.stats.replays > 0
