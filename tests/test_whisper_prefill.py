"""Whisper's batched decoder prefill (``WhisperModel.prefill_batch``): several requests' chunks in one flat pass give
what each chunk's own ``prefill`` gives, fresh and continuing, with and without a context, and leave the self pool
as the chunks alone would; the cross pool is only read."""

from __future__ import annotations

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
