"""A prefill pass reads nothing outside its chunks' own streams. Whatever a decode step or an earlier request left in
the sink page, in the tail of a stream's last page, or in the recurrent slot of a request that starts afresh (here:
NaN and inf, which no multiplication by zero removes) changes neither its logits nor what it writes.

The defect this guards (issue 11): the paged prefill attention weighted every cell of each chunk's page table by its
softmax probability, 0 for a cell past the stream, and 0 * NaN is NaN; the GDN prefill cleared a fresh chunk's slot by
multiplying it with 0. A non-finite value in the sink page (which every padded page-table column reads) turned the
logits of every chunk batched with a longer one into NaN."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from test_engine import BASE, QWEN
from test_prefill_graphs import PAGES, PS, _chunks, _pools, _randomize, _state

from models.engine import Engine, Planning
from models.engine.compare import random_requests
from models.layers.paged import paged_decode_attention

MODEL = QWEN.model


def _poison(state, chunks, value: float, fresh_slots: bool = True) -> None:
    """``value`` in every cell no chunk reads: the sink page, every page no chunk holds, each chunk's page cells past
    its stream (start + T), the sink slot and (``fresh_slots``) the slots of fresh chunks."""
    held = torch.zeros(PAGES, PS, dtype=torch.bool)
    for c in chunks:
        end = c.start + len(c.token_ids)
        for j, page in enumerate(c.pages.tolist()):
            held[page, : max(0, min(PS, end - j * PS))] = True
    held[0] = False
    for kv in state.kv:
        kv.masked_fill_(~held[:, None, :, None, None], value)
    fresh = [0] + [c.rec_slot for c in chunks if c.start == 0 and fresh_slots]
    for pool in (*state.conv, *state.ssm):
        pool[fresh] = value


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("starts", [None, [0, 5, 0, 2]], ids=["fresh", "continuing"])
def test_a_prefill_pass_ignores_what_it_does_not_read(value, starts):
    """Fresh chunks and a batch with continuing chunks give the same logits and write the same cells over poisoned
    pools as over clean ones (the poison stays where it was, but in the sink page and slot, which the pass's padding
    and empty sequences write)."""
    rng = np.random.default_rng(3)
    chunks = _chunks(rng, [6, 3, 9, 2], starts)
    clean, dirty = _state(), _state()
    _randomize(clean, 7)
    _randomize(dirty, 7)
    _poison(dirty, chunks, value)
    want = MODEL.prefill_batch(clean, chunks)
    got = MODEL.prefill_batch(dirty, chunks)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    _poison(clean, chunks, value, fresh_slots=False)  # the pass wrote the same; what it did not touch keeps the poison
    for x, y in zip(_pools(dirty), _pools(clean), strict=True):  # but the sinks: the padding sequences write them
        torch.testing.assert_close(x[1:], y[1:], rtol=0, atol=0, equal_nan=True)


def test_decode_attention_ignores_the_cells_past_a_rows_length():
    """The torch decode attention (the CPU path and the reference) over rows whose table columns past their length
    name the sink page, poisoned, and whose last page holds inf past the row's tokens."""
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(7, 2, PS, 2, 8, generator=g)
    table = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 6, 0]], dtype=torch.int32)
    lens = torch.tensor([6, 1, 9], dtype=torch.int32)
    q = torch.randn(3, 4, 8, generator=g)
    want = paged_decode_attention(q, kv, table, lens, 0.3)
    kv[0] = float("nan")
    kv[2, :, 2:] = float("inf")  # row 0's second page past its 6 tokens
    kv[3, :, 1:] = float("inf")
    kv[6, :, 1:] = float("nan")  # row 2's third page past its 9 tokens
    torch.testing.assert_close(paged_decode_attention(q, kv, table, lens, 0.3), want, rtol=0, atol=0)


def test_an_engine_whose_sink_page_and_free_slots_hold_nan_gives_the_same_tokens():
    """The engine end to end (chunked prefill, so passes mix continuing and fresh chunks; mixed steps): the sink page
    and every free recurrent slot poisoned after the engine is built, as a kernel writing a padding row's garbage
    there would leave them."""
    reqs = random_requests(QWEN, 16, prompt_len=(3, 14), gen_len=(2, 8), seed=11)
    cfg = attrs.evolve(BASE, max_running=4, token_budget=6, planning=Planning.RESIDENT)
    want = Engine(QWEN, cfg).run(reqs)
    e = Engine(QWEN, cfg)
    for kv in e.model_state.kv:
        kv[0] = float("nan")
    for pool in (*e.model_state.conv, *e.model_state.ssm):
        pool[:] = float("nan")  # every slot is free (sink included): an admitted request starts afresh
    got = e.run(reqs)
    assert e.stats.mixed_steps > 0 and e.stats.prefill_chunks > len(reqs)
    assert [r.tokens for r in got] == [r.tokens for r in want]


