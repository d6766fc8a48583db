"""Captured prefill passes (models/engine/prefill_graphs.py): a pass replayed over a copy of new inputs gives what the
eager pass gives (logits, K/V and recurrent state), a key not captured runs eagerly, and an engine serving
its prefills from them gives the eager engine's tokens. On the CPU a replay re-runs the captured callable over the
copied inputs, so these tests hold the copy-in path (every input copied, nothing read from the first batch); the
GPU tests (test_engine_gpu.py) run real CUDA graphs."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from test_engine import BASE, QWEN

from kernels.choices import KernelChoices
from models.engine import Engine, EngineConfig, PrefillPlacement, build_adapter
from models.engine.compare import random_requests, run_arms
from models.engine.prefill_graphs import PrefillGraphs
from models.layers.flat import bucket_shape
from models.qwen3_5 import PrefillChunk

MODEL = QWEN.model
PS, PAGES, SLOTS = 4, 64, 8


def _state():
    return MODEL.allocate_state(PAGES, PS, SLOTS, "cpu", torch.float32)


def _chunks(rng, lens, starts=None) -> list[PrefillChunk]:
    """Chunks of random tokens on distinct random pages and distinct slots (1..): chunk r covers starts[r] + lens[r]."""
    starts = starts or [0] * len(lens)
    need = [-(-(s + n) // PS) for s, n in zip(starts, lens, strict=True)]
    pages = rng.permutation(np.arange(1, PAGES))[: sum(need)]
    slots = rng.permutation(np.arange(1, SLOTS))[: len(lens)]
    out, at = [], 0
    for n, s, k, slot in zip(lens, starts, need, slots, strict=True):
        ids = torch.from_numpy(rng.integers(0, MODEL.cfg.vocab_size, n))
        out.append(PrefillChunk(ids, torch.from_numpy(pages[at : at + k]), s, int(slot), int(rng.integers(0, 3))))
        at += k
    return out


def _randomize(state, seed):
    """Fill the state's pools with random values (what earlier chunks would have left)."""
    g = torch.Generator().manual_seed(seed)
    for t in (*state.kv, *state.conv, *state.ssm):
        t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))


def _pools(state):
    return [t.clone() for t in (*state.kv, *state.conv, *state.ssm)]


@pytest.mark.parametrize("starts", [None, "mixed"], ids=["fresh", "continuing"])
def test_a_replayed_bucket_pass_equals_the_eager_pass_for_any_composition(starts):
    """Batches A, B and C of one token bucket (32 tokens, up to 4 chunks) but of different compositions (chunk count,
    lengths, starts, pages, slots, offsets): A runs eagerly and its key is captured, B and C replay A's capture.
    Logits and every pool equal eager passes of A, B and C at their exact shapes from the same starting state (padding
    tokens touch only the sink page and slot, which are not compared)."""
    rng = np.random.default_rng(0)
    compositions = ([6, 3, 6], [1, 20, 2, 9], [31])
    abc = [_chunks(rng, lens, None if starts is None else rng.integers(0, 9, len(lens)).tolist())
           for lens in compositions]  # fmt: skip
    graphed, eager = _state(), _state()
    _randomize(graphed, 1)
    _randomize(eager, 1)
    shape = bucket_shape(32, 4, PAGES, PS)
    graphs = PrefillGraphs(lambda batch: MODEL.prefill_forward(graphed, batch), "cpu")
    batches = [MODEL.prefill_inputs(graphed, c, shape, graphed=True) for c in abc]
    assert len({b.key for b in batches}) == 1
    for i, (batch, chunks) in enumerate(zip(batches, abc, strict=True)):
        got = (graphs.capture(batch) if i == 0 else graphs.run(batch))[: len(chunks)]
        torch.testing.assert_close(got, MODEL.prefill_batch(eager, chunks), rtol=1e-5, atol=1e-5)
        assert (graphs.stats.captures, graphs.stats.replays) == ((1, 0), (1, 1), (1, 2))[i]
    for x, y in zip(_pools(graphed), _pools(eager), strict=True):
        torch.testing.assert_close(x[1:], y[1:], rtol=1e-5, atol=1e-5)  # the sink page / slot apart


def test_only_captured_keys_replay_and_a_key_is_captured_once():
    rng = np.random.default_rng(1)
    state = _state()
    graphs = PrefillGraphs(lambda batch: MODEL.prefill_forward(state, batch), "cpu")
    graphs.capture(MODEL.prefill_inputs(state, _chunks(rng, [4])))
    for lens in ([4], [5], [4], [13]):  # the captured key replays; the others run eagerly at their exact shapes
        graphs.run(MODEL.prefill_inputs(state, _chunks(rng, lens)))
    graphs.capture(MODEL.prefill_inputs(state, _chunks(rng, [4])))  # captured already: an eager pass, no capture
    s = graphs.stats
    assert (s.captures, s.replays, s.eager, len(graphs.graphs)) == (1, 2, 4, 1)


EQUAL = random_requests(QWEN, 24, prompt_len=(7, 7), gen_len=(2, 6), seed=4)  # one prompt length: keys repeat


@pytest.mark.parametrize("case", [dict(max_running=1), dict(max_running=3), dict(max_running=4, token_budget=5)],
                         ids=["c1", "c3", "chunked-c4"])  # fmt: skip
def test_an_engine_on_prefill_graphs_gives_the_eager_engines_tokens(case):
    cfg = attrs.evolve(BASE, **case)
    eager = run_arms(QWEN, cfg, EQUAL)
    graphed = run_arms(QWEN, attrs.evolve(cfg, prefill_graphs=3, prefill_graph_tokens=64), EQUAL)
    for arm in eager:
        assert graphed[arm].tokens == eager[arm].tokens
        assert graphed[arm].engine.prefill.graphs.stats.replays > 0
        assert graphed[arm].engine.stats.mismatches == 0


def test_a_whisper_engine_on_prefill_graphs_gives_the_eager_engines_tokens():
    """Whisper's decoder pass is capturable too (its cross pages padded to the pool's count): chunked prompts, some of
    them continuing, on two token buckets; every arm's tokens equal the eager engine's."""
    whisper = build_adapter("whisper-test", seed=0)
    reqs = random_requests(whisper, 8, prompt_len=(2, 9), gen_len=(2, 6), seed=5)
    cfg = EngineConfig(page_size=4, max_seq_len=64, max_running=3, token_budget=6)
    eager = run_arms(whisper, cfg, reqs)
    graphed = run_arms(whisper, attrs.evolve(cfg, prefill_graphs=2, prefill_graph_tokens=8), reqs)
    for arm in eager:
        assert graphed[arm].tokens == eager[arm].tokens
        assert graphed[arm].engine.prefill.graphs.stats.replays > 0


def test_the_prefill_kernels_are_refused_in_float32_and_off_by_default_on_the_cpu():
    """FlashInfer's paged prefill has bf16/fp16 kernels only: a float32 model asked for them is refused by name (on
    CUDA its default is the torch references), and a CPU model defaults to the references."""
    model = build_adapter("qwen3_5-tiny", seed=0).model
    assert not model.uses_prefill_kernels()
    with pytest.raises(ValueError, match="bf16 or fp16"):
        model.uses_prefill_kernels(KernelChoices(prefill_kernels=True))


def test_head_shapes_without_prefill_kernels_prefill_on_the_references_and_an_explicit_ask_is_refused():
    """The tiny model's key heads (16) have no GDN state pass: by default (even in bf16 on CUDA) it prefills on the
    torch references, and asking for the kernels names why; the served shapes have kernels."""
    from models.engine.adapters import MODEL_CONFIGS
    from models.qwen3_5.model import prefill_kernel_refusal

    assert prefill_kernel_refusal(MODEL_CONFIGS["qwen3_5-0.8b"]) is None
    assert prefill_kernel_refusal(MODEL_CONFIGS["qwen3_5-2b"]) is None
    model = build_adapter("qwen3_5-tiny", seed=0, dtype=torch.bfloat16).model
    assert model.prefill_kernel_refusal() == "the GDN state pass takes key heads of 64 or 128, not 16"
    with pytest.raises(ValueError, match="prefill_kernels: the GDN state pass takes key heads of 64 or 128"):
        model.uses_prefill_kernels(KernelChoices(prefill_kernels=True))


# -- on the GPU: real CUDA graphs ------------------------------------------------------------------------------------


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
def test_a_float32_engine_on_cuda_refuses_prefill_graphs():
    """In float32 a CUDA model prefills on the torch references, which read lengths back to the host: no capture."""
    _cuda()
    adapter = build_adapter("qwen3_5-tiny", seed=0, device="cuda")
    with pytest.raises(ValueError, match="torch references on CUDA"):
        Engine(adapter, EngineConfig(device="cuda", page_size=4, max_seq_len=64, prefill_graphs=2))


@pytest.mark.gpu
def test_a_whisper_engine_on_cuda_refuses_prefill_graphs_where_flashinfer_has_no_kernels():
    """Whisper's test shape has heads of 16 (FlashInfer's prefill serves 64, 128, 256) and float32 has none: its
    attention then runs the torch references, and prefill graphs are refused by name."""
    _cuda()
    whisper = build_adapter("whisper-test", seed=0, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="torch references on CUDA"):
        Engine(whisper, EngineConfig(device="cuda", page_size=4, max_seq_len=64, prefill_graphs=2))


@pytest.mark.gpu
@pytest.mark.parametrize("starts", [None, "mixed"], ids=["fresh", "continuing"])
def test_a_replayed_cuda_graph_bucket_pass_equals_the_eager_pass_at_0_8b_shape(starts):
    """The 0.8B shape in bf16 on the prefill kernels (fla, FlashInfer, the Triton conv), one token bucket (256 tokens,
    up to 4 chunks) and three compositions: A's pass captured, B's and C's replayed over a copy of their inputs.
    Logits and pools equal eager passes of A, B and C at their exact shapes (bf16 tolerance: the graphs' FlashInfer
    plan always splits the KV, the exact one need not; argmax equal)."""
    _cuda()
    adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    model = adapter.model
    rng = np.random.default_rng(3)
    ps, pages, slots = 16, 96, 8

    def chunks(lens):
        starts_ = [0] * len(lens) if starts is None else rng.integers(0, 60, len(lens)).tolist()
        need = [-(-(s + n) // ps) for s, n in zip(starts_, lens, strict=True)]
        perm = rng.permutation(np.arange(1, pages))[: sum(need)]
        out, at = [], 0
        for n, s, k, slot in zip(lens, starts_, need, rng.permutation(np.arange(1, slots))[: len(lens)], strict=True):
            ids = torch.from_numpy(rng.integers(0, model.cfg.vocab_size, n))
            out.append(PrefillChunk(ids, torch.from_numpy(perm[at : at + k]), s, int(slot), int(rng.integers(0, 3))))
            at += k
        return out

    states = [model.allocate_state(pages, ps, slots, "cuda", torch.bfloat16) for _ in range(2)]
    for st in states:
        _randomize_cuda(st, 1)
    graphed, eager = states
    shape = bucket_shape(256, 4, pages, ps)
    graphs = PrefillGraphs(lambda batch: model.prefill_forward(graphed, batch), "cuda")
    for i, lens in enumerate(([96, 33, 70], [200, 1, 40, 7], [255])):
        c = chunks(lens)
        batch = model.prefill_inputs(graphed, c, shape, graphed=True)
        got = (graphs.capture(batch) if i == 0 else graphs.run(batch))[: len(c)].clone()
        want = model.prefill_batch(eager, c)
        assert graphs.stats.replays == i
        print(f"\npass {i} {lens}: max |logits diff| {(got.float() - want.float()).abs().max().item():.3g}")
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    for x, y in zip(_pools(graphed), _pools(eager), strict=True):
        torch.testing.assert_close(x[1:], y[1:], atol=5e-2, rtol=5e-2)  # the sinks apart


def _randomize_cuda(state, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for t in (*state.kv, *state.conv, *state.ssm):
        t.copy_(torch.randn(t.shape, generator=g, device="cuda", dtype=torch.float32).to(t.dtype) * 0.1)


@pytest.mark.gpu
def test_an_engine_on_cuda_prefill_graphs_gives_the_eager_engines_tokens():
    """0.8B shape, XQA in both arms' resident engine and fa2 in the host arm: prompts served from captured token-bucket
    passes (32 ... 256 tokens) give the eager engine's tokens."""
    _cuda()
    adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    reqs = random_requests(adapter, 24, prompt_len=(64, 64), gen_len=(4, 12), seed=6)
    from models.layers.decode_attention import Backend

    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, attention=Backend.XQA, max_running=4, page_size=16,
                       max_seq_len=128, prefill=PrefillPlacement.IN_STEP)  # both batch alike  # fmt: skip
    eager = run_arms(adapter, cfg, reqs)
    graphed = run_arms(adapter, attrs.evolve(cfg, prefill_graphs=4, prefill_graph_tokens=256), reqs)
    for arm in eager:
        assert graphed[arm].tokens == eager[arm].tokens
        s = graphed[arm].engine.prefill.graphs.stats
        print(f"\n{arm}: prefill graphs {s}")
        assert s.replays > 0


def test_a_pass_longer_than_the_buckets_is_tuned_at_build_not_by_a_request():
    """The eager pass sizes an adapter asks to be warmed (``prefill_warm_sizes``: on CUDA, the varlen conv's tuning
    classes that the buckets leave out and a pass of ``EngineConfig.largest_pass`` tokens reaches) run once at build,
    as dummy passes on the sink page and slot 1, and leave the engine's tokens as they were."""
    from unittest import mock

    from models.engine.adapters import QwenAdapter

    cfg = attrs.evolve(BASE, max_running=3, token_budget=None, prefill_graphs=2, prefill_graph_tokens=16)
    asked, ran = [], []
    real = QwenAdapter.prefill_last

    def warm_sizes(self, largest, buckets, kc):
        asked.append((largest, buckets))
        return (20, 37)

    def spy(self, state, chunks, kc):
        ran.append([(len(c.ids), c.rec_slot, int(c.pages[next(iter(c.pages))].max())) for c in chunks])
        return real(self, state, chunks, kc)

    with mock.patch.object(QwenAdapter, "prefill_warm_sizes", warm_sizes), \
            mock.patch.object(QwenAdapter, "prefill_last", spy):  # fmt: skip
        warmed = Engine(QWEN, cfg)
    assert asked == [(3 * warmed.config.max_seq_len, (8, 16))]  # whole prompts: every running request's context
    assert warmed.prefill.warmed == (20, 37)
    assert ran == [[(20, 1, 0)], [(37, 1, 0)]]  # one chunk each, slot 1, the sink page only
    assert attrs.evolve(cfg, token_budget=5).largest_pass == 5
    reqs = random_requests(QWEN, 6, prompt_len=(3, 30), gen_len=(2, 5), seed=7)
    assert [r.tokens for r in warmed.run(reqs)] == [r.tokens for r in Engine(QWEN, cfg).run(reqs)]


@pytest.mark.gpu
def test_a_pass_beyond_the_buckets_finds_its_conv_tuned_at_build():
    """0.8B shape, bf16, CUDA: buckets of 256 and 512 tokens, whole prompts of 2 requests in a 2048-token context (a
    pass of up to 4096 tokens): the build tunes the varlen conv's 1024, 2048 and 4096 classes, so serving two
    1500-token prompts (an eager pass beyond the buckets: 3000 tokens, or 1500 each) tunes nothing: the autotuner's
    cache gains no key."""
    _cuda()
    from kernels.conv1d_varlen.kernel import _tuned_conv_kernel

    adapter = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    cfg = EngineConfig(device="cuda", dtype=torch.bfloat16, max_running=2, page_size=16, max_seq_len=2048,
                       token_budget=None, prefill_graphs=2, prefill_graph_tokens=512)  # fmt: skip
    engine = Engine(adapter, cfg)
    assert engine.prefill.buckets == (256, 512) and engine.prefill.warmed == (1024, 2048, 4096)
    tuned = set(_tuned_conv_kernel.cache)
    assert {key[0] for key in tuned} >= {256, 512, 1024, 2048, 4096}  # (n_class leads the tuning key)
    reqs = random_requests(adapter, 2, prompt_len=(1500, 1500), gen_len=(2, 2), seed=9)
    assert all(len(r.tokens) == 2 for r in engine.run(reqs))
    assert set(_tuned_conv_kernel.cache) == tuned


def test_token_buckets_halve_down_from_the_largest():
    from models.engine.prefill import token_buckets

    assert token_buckets(6, 8192) == (256, 512, 1024, 2048, 4096, 8192)
    assert token_buckets(3, 64) == (16, 32, 64)
    assert token_buckets(10, 4) == (1, 2, 4)  # never below one token; duplicates dropped
    assert token_buckets(1, 100) == (100,)
    # none past the smallest that holds the largest pass
    assert token_buckets(6, 8192, 2048) == (256, 512, 1024, 2048)
    assert token_buckets(6, 8192, 3000) == (256, 512, 1024, 2048, 4096)
    assert token_buckets(6, 8192, 20) == (256,)
    assert token_buckets(6, 8192, 10**6) == token_buckets(6, 8192)


def test_an_engine_captures_only_the_buckets_its_passes_can_fill():
    """Of the buckets 16, 32 and 64, a budget of 5 tokens a pass fills only 16: only it is captured; a budget of 20,
    or whole prompts of 2 requests in a 12-token context (24 tokens), fill 16 and 32. The tokens are the eager
    engine's."""
    reqs = random_requests(QWEN, 6, prompt_len=(3, 9), gen_len=(2, 5), seed=8)
    eager = Engine(QWEN, attrs.evolve(BASE, max_running=4, token_budget=5)).run(reqs)
    for case, want in [(dict(max_running=4, token_budget=5), (16,)), (dict(max_running=4, token_budget=20), (16, 32)),
                       (dict(max_running=2, max_seq_len=12, token_budget=None), (16, 32))]:  # fmt: skip
        engine = Engine(QWEN, attrs.evolve(BASE, prefill_graphs=3, prefill_graph_tokens=64, **case))
        assert engine.prefill.buckets == want, case
        assert engine.prefill.graphs.stats.captures == len(want)
        if case["max_running"] == 4:
            assert [r.tokens for r in engine.run(reqs)] == [r.tokens for r in eager]
