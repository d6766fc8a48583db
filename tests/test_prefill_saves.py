"""Recurrent-state saves taken inside a prefill pass (a prefix cache's checkpoints, ``PrefillInput.saves``): the state
pass's saves (Triton's interpreter on the CPU) against its torch reference; a tiny float32 Qwen3.5's pass with saves
against prefilling each prefix alone (plain and fused paths, exact and bucket shapes, fresh and continuing chunks,
several chunks of which only some save); the layout's refusals."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import attrs  # noqa: E402
import numpy as np  # noqa: E402
from test_engine import QWEN  # noqa: E402
from test_gdn_prefill import _state_case, _used_rows  # noqa: E402

from kernels.choices import KernelChoices  # noqa: E402
from kernels.gdn_prefill.naive import gated_delta_chunked, state_pass_ref  # noqa: E402
from kernels.gdn_prefill.state_pass import state_pass_  # noqa: E402
from models.engine import build_adapter  # noqa: E402
from models.engine.adapters import PrefillInput  # noqa: E402
from models.engine.prefill_graphs import PrefillGraphs  # noqa: E402
from models.layers.flat import bucket_shape  # noqa: E402
from models.layers.gdn import l2norm  # noqa: E402
from models.qwen3_5 import PrefillChunk  # noqa: E402

MODEL = QWEN.model

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not (INTERPRET or torch.cuda.is_available()), reason="needs Triton's interpreter")


@needs_triton
@pytest.mark.parametrize("dk", [64, 128])
def test_the_state_pass_stores_the_states_entering_the_saved_rows_and_the_saved_finals(dk):
    """Random save rows (most 0) and final saves into spare slots: the saved states equal the reference's (which are
    the h rows and final states), every other slot but the sink untouched."""
    lens = [130, 1, 0, 200, 70, 9, 0]
    slots = [4, 7, 2, 1, 6, 0, 0]
    fresh = [False, True, False, False, True, True, True]
    case = _state_case(0, lens, slots, fresh, hk=2, hv=4, dk=dk, dv=48)
    case["pool"] = torch.cat([case["pool"], torch.randn(8, *case["pool"].shape[1:])])  # slots 10..17 spare
    rows = case["chunk_rows"]
    save = torch.zeros(rows, dtype=torch.int64)
    save[[1, 2, 5, 6]] = torch.tensor([10, 11, 12, 13])  # seq 0's chunks 1, 2; seq 3's chunks 1, 2 (rows 4..7)
    final = torch.tensor([14, 0, 0, 15, 16, 0, 0])
    saves = dict(save_slot=save, final_slot=final)
    want_pool = case["pool"].clone()
    want_h, want_v = state_pass_ref(**{**case, "pool": want_pool}, **saves)
    got_pool = case["pool"].clone()
    h, v_new = state_pass_(**{**case, "pool": got_pool}, **saves)
    used = _used_rows(lens)
    torch.testing.assert_close(h[used], want_h[used], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(v_new, want_v, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_pool[1:], want_pool[1:], atol=1e-4, rtol=1e-4)  # slot 0: the sink's race
    for row, slot in zip([1, 2, 5, 6], [10, 11, 12, 13], strict=True):  # the reference saves what it says
        torch.testing.assert_close(want_pool[slot], want_h[row])
    for s, slot in [(0, 14), (3, 15), (4, 16)]:
        torch.testing.assert_close(want_pool[slot], want_pool[slots[s]])
    untouched = [3, 5, 8, 9, 17]
    assert torch.equal(got_pool[untouched], case["pool"][untouched])


def test_the_state_pass_takes_save_and_final_slots_together():
    case = _state_case(0, [5, 0], [1, 0], [True, True], hk=1, hv=1, dk=64, dv=16)
    with pytest.raises(ValueError, match="together"):
        state_pass_(**case, save_slot=torch.zeros(case["chunk_rows"], dtype=torch.int64))


def test_the_reference_returns_the_states_entering_the_chunks_it_is_asked_for():
    """gated_delta_chunked's entering states equal the final states of its prefixes of 64 i tokens."""
    gen = torch.Generator().manual_seed(0)
    T, h, dk, dv = 200, 2, 16, 8
    q, k = (l2norm(torch.randn(T, h, dk, generator=gen)) for _ in range(2))
    v, g, beta = torch.randn(T, h, dv, generator=gen), -torch.rand(T, h, generator=gen), torch.rand(T, h, generator=gen)
    s0 = torch.randn(h, dk, dv, generator=gen)
    o, st, kept = gated_delta_chunked(q, k, v, g, beta, s0, entering=[2, 0, 3])
    torch.testing.assert_close(o, gated_delta_chunked(q, k, v, g, beta, s0)[0])
    for x, i in zip(kept, [2, 0, 3], strict=True):
        want = s0 if i == 0 else gated_delta_chunked(q[: 64 * i], k[: 64 * i], v[: 64 * i], g[: 64 * i],
                                                     beta[: 64 * i], s0)[1]  # fmt: skip
        torch.testing.assert_close(x, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="chunks 0..3"):
        gated_delta_chunked(q, k, v, g, beta, s0, entering=[4])


# -- the model's pass -------------------------------------------------------------------------------------------------

PS, PAGES, SLOTS = 4, 160, 24
ATOL = RTOL = 1e-5  # float32: the pass and the prefix alone differ in GEMM blocking only (same delta-rule chunks)


def _state(seed=None):
    state = MODEL.allocate_state(PAGES, PS, SLOTS, "cpu", torch.float32, saving=True)
    if seed is not None:  # what earlier requests left everywhere: a save must overwrite it
        g = torch.Generator().manual_seed(seed)
        for t in (*state.kv, *state.conv, *state.ssm):
            t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
    return state


def _rec(state, slot):
    return [t[slot].clone() for t in (*state.conv, *state.ssm)]


def _prefix_state(ids, p):
    """The GDN state of every layer after positions 0 .. p - 1 of ``ids``, prefilled alone in one fresh chunk."""
    state = _state(7)
    MODEL.prefill(state, ids[:p], np.arange(1, -(-p // PS) + 1), 0, 3)
    return _rec(state, 3)


def _assert_saved(state, slot, want):
    for x, y in zip(_rec(state, slot), want, strict=True):
        torch.testing.assert_close(x, y, atol=ATOL * max(1.0, float(y.abs().max())), rtol=RTOL)


def _kc(fused):
    return KernelChoices(prefill_fused=fused)


def test_saves_in_one_fresh_pass_equal_the_prefixes_prefilled_alone():
    """A 200-token prompt in one pass with saves at 64, 128, 192 (chunk entries) and 200 (its end) into spare slots:
    each slot holds every GDN layer's conv and SSM state of the prompt's first p tokens prefilled alone; the chunk's
    own slot is its final state as without saves."""
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, MODEL.cfg.vocab_size, 200))
    saves = ((64, 5), (128, 6), (192, 7), (200, 8))
    state, plain = _state(1), _state(1)
    pages = np.arange(1, 51)
    got = MODEL.prefill(state, ids, pages, 0, 1, kc=_kc(False), saves=saves)
    want = MODEL.prefill(plain, ids, pages, 0, 1, kc=_kc(False))
    torch.testing.assert_close(got, want)  # the saves change nothing else
    for x, y in zip(_rec(state, 1), _rec(plain, 1), strict=True):
        torch.testing.assert_close(x, y)
    for p, slot in saves:
        _assert_saved(state, slot, _prefix_state(ids, p))
    spare = [2, 3, 4, *range(9, SLOTS)]
    for x, y in zip(state.conv + state.ssm, plain.conv + plain.ssm, strict=True):
        assert torch.equal(x[spare], y[spare])


def test_saves_of_a_continuing_chunk_count_from_its_start():
    """Positions 0..49 in one pass, then 50..199 with saves at 114, 178 (50 + 64 i) and 200."""
    rng = np.random.default_rng(1)
    ids = torch.from_numpy(rng.integers(0, MODEL.cfg.vocab_size, 200))
    state, pages = _state(2), np.arange(1, 51)
    MODEL.prefill(state, ids[:50], pages, 0, 1, kc=_kc(False))
    saves = ((114, 10), (178, 11), (200, 12))
    MODEL.prefill(state, ids[50:], pages, 50, 1, kc=_kc(False), saves=saves)
    for p, slot in saves:
        _assert_saved(state, slot, _prefix_state(ids, p))


@pytest.mark.skipif(not INTERPRET, reason="the CPU model's Triton kernels need Triton's interpreter")
def test_the_fused_pass_saves_as_the_plain_one():
    """The pass's row-wise work and conv on our Triton kernels (``prefill_fused``; 66 tokens: the interpreter takes
    ~10 s a pass): saves at 64 and at the end equal the prefixes prefilled alone (plain path)."""
    ids = torch.from_numpy(np.random.default_rng(5).integers(0, MODEL.cfg.vocab_size, 66))
    state = _state(1)
    MODEL.prefill(state, ids, np.arange(1, 18), 0, 1, kc=_kc(True), saves=((64, 5), (66, 6)))
    for p, slot in ((64, 5), (66, 6)):
        _assert_saved(state, slot, _prefix_state(ids, p))


def _pass_of_three(rng):
    """Three requests' chunks, only two with saves: A fresh (150 tokens, saves at 64 and its end), B fresh (30, none),
    C continuing at 20 (100 tokens, a save at 84). Returns the chunks, each request's whole ids and C's first chunk."""
    whole = [torch.from_numpy(rng.integers(0, MODEL.cfg.vocab_size, n)) for n in (150, 30, 120)]
    pa, pb, pc = np.arange(1, 39), np.arange(39, 47), np.arange(47, 77)
    first_c = PrefillChunk(whole[2][:20], pc, 0, 3)
    chunks = [PrefillChunk(whole[0], pa, 0, 1, 0, ((64, 9), (150, 14))), PrefillChunk(whole[1], pb, 0, 2),
              PrefillChunk(whole[2][20:], pc, 20, 3, 0, ((84, 20),))]  # fmt: skip
    return chunks, whole, first_c


@pytest.mark.parametrize("bucket", [None, 512], ids=["exact", "bucket"])
def test_a_pass_of_several_chunks_saves_only_what_its_chunks_ask(bucket):
    """The three chunks in one pass, exact or padded to a 512-token bucket of 6 chunks (padding and unused save entries
    on the sink): the saves equal the prefixes alone, and every other slot but the sink equals the same pass without
    saves."""
    chunks, whole, first_c = _pass_of_three(np.random.default_rng(2))
    state, plain = _state(3), _state(3)
    for s in (state, plain):
        MODEL.prefill_batch(s, [first_c])
    shape = None if bucket is None else bucket_shape(bucket, 6, PAGES, PS)
    MODEL.prefill_forward(state, MODEL.prefill_inputs(state, chunks, shape, kc=_kc(False)))
    bare = [attrs.evolve(c, saves=()) for c in chunks]
    MODEL.prefill_forward(plain, MODEL.prefill_inputs(plain, bare, shape, kc=_kc(False)))
    for (p, slot), ids in [((64, 9), whole[0]), ((150, 14), whole[0]), ((84, 20), whole[2])]:
        _assert_saved(state, slot, _prefix_state(ids, p))
    others = [s for s in range(1, SLOTS) if s not in (9, 14, 20)]
    for x, y in zip(state.conv + state.ssm, plain.conv + plain.ssm, strict=True):
        torch.testing.assert_close(x[others], y[others], atol=0, rtol=0)


def test_a_captured_bucket_replays_other_saves():
    """A bucket's pass captured with one composition's saves and replayed (PrefillGraphs' copy-in) with another's:
    the replay's saves equal the eager pass's at its exact shape (the save arrays are graph inputs)."""
    chunks, _, first_c = _pass_of_three(np.random.default_rng(3))
    rng = np.random.default_rng(4)
    other = [PrefillChunk(torch.from_numpy(rng.integers(0, MODEL.cfg.vocab_size, 130)), np.arange(80, 113), 0, 4, 0,
                          ((64, 15), (128, 16), (130, 17)))]  # fmt: skip
    graphed, eager = _state(5), _state(5)
    graphs = PrefillGraphs(lambda batch: MODEL.prefill_forward(graphed, batch), "cpu")
    shape = bucket_shape(512, 6, PAGES, PS)
    for s in (graphed, eager):
        MODEL.prefill_batch(s, [first_c])
    graphs.capture(MODEL.prefill_inputs(graphed, chunks, shape, graphed=True))
    graphs.run(MODEL.prefill_inputs(graphed, other, shape, graphed=True))
    assert graphs.stats.replays == 1
    MODEL.prefill_batch(eager, chunks)
    MODEL.prefill_batch(eager, other)
    for x, y in zip(graphed.conv + graphed.ssm, eager.conv + eager.ssm, strict=True):
        torch.testing.assert_close(x[1:], y[1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "saves, match",
    [(((10, 5),), "neither"), (((0, 5),), "neither"), (((201, 5),), "neither"), (((64, 0),), "slot 0"),
     (((64, 1),), "recurrent slot of a chunk"), (((64, 2),), "recurrent slot of a chunk"),
     (((64, 5), (128, 5)), "takes already"), (((64, SLOTS),), "not in 1..")],
)  # fmt: skip
def test_bad_saves_are_refused_with_the_reason(saves, match):
    state = _state()
    chunks = [PrefillChunk(torch.zeros(200, dtype=torch.long), np.arange(1, 51), 0, 1, 0, saves),
              PrefillChunk(torch.zeros(3, dtype=torch.long), np.arange(51, 52), 0, 2)]  # fmt: skip
    with pytest.raises(ValueError, match=match):
        MODEL.prefill_inputs(state, chunks)


def test_a_continuing_chunk_refuses_a_save_not_counted_from_its_start():
    state = _state()
    chunk = PrefillChunk(torch.zeros(100, dtype=torch.long), np.arange(1, 40), 30, 1, 0, ((64, 5),))
    with pytest.raises(ValueError, match="neither"):
        MODEL.prefill_inputs(state, [chunk])


def test_the_adapters_thread_saves_and_whisper_refuses_them():
    """PrefillInput.saves reaches the Qwen batch's save arrays; Whisper (no recurrent state) refuses a save and takes
    chunks without."""
    ids = np.zeros(130, np.int64)
    inp = PrefillInput(ids=ids, pages={"kv": np.arange(1, 34)}, start=0, rec_slot=1, read_lens={}, pos_offset=0,
                       saves=((64, 5), (130, 6)))  # fmt: skip
    batch = QWEN.prefill_inputs(_state(), [inp])
    assert batch.save_slot.tolist()[:3] == [0, 5, 0] and batch.save_at.tolist()[1] == 64
    assert batch.final_slot.tolist()[:2] == [6, 0]
    whisper = build_adapter("whisper-test")
    wstate = whisper.allocate({"self": 8, "cross": 8}, PS, 0, "cpu", torch.float32)
    w_pages = {"self": np.array([1]), "cross": np.array([2])}
    w_inp = PrefillInput(ids=np.array([whisper.model.cfg.decoder_start_token_id]), pages=w_pages, start=0, rec_slot=0,
                         read_lens={"cross": 1}, pos_offset=0)  # fmt: skip
    whisper.prefill_inputs(wstate, [w_inp])
    with pytest.raises(ValueError, match="no recurrent state"):
        whisper.prefill_inputs(wstate, [attrs.evolve(w_inp, saves=((1, 1),))])
