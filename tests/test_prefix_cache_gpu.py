"""The prefix cache on the GPU (run on the H200: pytest -m gpu): chats with the cache give the tokens they give without
it (float32, Triton decode attention, overlapped; the passes in their step, so both engines batch alike), and the
checkpoints the 0.8B shape's passes save through fla and our state pass (bf16, captured prefill graphs, passes beside
the decode steps) equal the states a fresh prefill of the same tokens leaves."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import test_prefix_cache as cpu
import torch
from test_prefix_cache import CACHE, _serve, _sessions

from models.engine import Engine, EngineConfig, PrefillPlacement, Request, SamplingParams, build_adapter
from models.layers.decode_attention import Backend

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def test_chats_with_the_cache_equal_chats_without_on_cuda(monkeypatch):
    monkeypatch.setattr(cpu, "QWEN", build_adapter("qwen3_5-tiny", seed=0, device="cuda", dtype=torch.float32))
    cfg = EngineConfig(device="cuda", page_size=4, max_seq_len=160, max_running=3, attention=Backend.TRITON,
                       overlap=True, prefill=PrefillPlacement.IN_STEP, token_budget=24)  # fmt: skip
    sessions = _sessions(seed=11)
    plain, _ = _serve(cfg, sessions)
    cached, eng = _serve(attrs.evolve(cfg, **CACHE), sessions)
    assert cached == plain
    assert eng.stats.prefix_hits > 0 and eng.stats.checkpoints_evicted > 0


def test_checkpoints_saved_by_the_kernels_equal_a_fresh_prefill():
    """Saves at the interval (inside one 200-token pass, fla's chunks), at the prompt's end and at the stream's end,
    against slot 1 of an engine that prefilled exactly those tokens (float32 states; bf16 model: 2% of the scale)."""
    ad = build_adapter("qwen3_5-0.8b", seed=0, device="cuda", dtype=torch.bfloat16)
    base = EngineConfig(device="cuda", page_size=16, max_seq_len=512, max_running=2, attention=Backend.TRITON,
                        overlap=True, prefill_graphs=2, prefill_graph_tokens=256)  # fmt: skip
    eng = Engine(ad, attrs.evolve(base, prefix_cache=True, checkpoints=8, checkpoint_interval=64))
    x = np.random.default_rng(5).integers(0, ad.vocab_size, 200).tolist()
    r = eng.run([Request(tuple(x), SamplingParams(max_tokens=4, ignore_eos=True))])[0]
    fed = x + list(r.tokens[:-1])
    cks = {ck.position: ck for ck in eng.admission.checkpoints.lru.values()}
    assert set(cks) == {64, 128, 192, 200, len(fed)}
    pools = eng.model_state.conv + eng.model_state.ssm  # (one a layer: each checked at its own scale)
    for p, ck in sorted(cks.items()):
        ref = Engine(ad, base)
        ref.run([Request(tuple(fed[:p]), SamplingParams(max_tokens=1))])
        for got, want in zip(pools, ref.model_state.conv + ref.model_state.ssm, strict=True):
            scale = float(want[1].float().abs().max()) or 1.0
            torch.testing.assert_close(got[ck.slot].float(), want[1].float(), atol=2e-2 * scale, rtol=2e-2)
