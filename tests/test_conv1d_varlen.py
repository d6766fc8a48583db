"""The varlen prefill conv (kernels/conv1d_varlen) against the per-sequence torch conv (models.layers.gdn's
``causal_conv1d_prefill``: F.conv1d over cat(state, x)), on fresh random sequences back to back: continuing and fresh
sequences, ones shorter than the kernel, an empty one, padding on the sink slot, strided rows.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.conv1d_varlen import conv1d_varlen_, conv1d_varlen_ref_  # noqa: E402
from models.layers.gdn import causal_conv1d_prefill  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # on a GPU every case here runs compiled


STARTS_IN_EVERY_TILE = [37, 1, 0, 3, 20]  # every 32-token tile holds a sequence's first tokens
WITH_INNER_TILES = [100, 1, 0, 70, 20]  # tiles 32-63, 64-95 and 128-159 hold none: their state taps are skipped


def _case(seed: int, C: int = 200, K: int = 4, lens: list[int] = STARTS_IN_EVERY_TILE):
    """Sequences of ``lens`` (the last the padding, on sink slot 0), slots distinct but the sink's."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.tensor([5, 2, 0, 7, 0], dtype=torch.int32)
    fresh = torch.tensor([False, True, True, False, True])
    N = sum(lens)
    wide = torch.randn(N, C + 9, generator=gen)  # x is a column slice of a wider projection, as in the model
    pool = torch.randn(9, C, K, generator=gen)
    w = torch.randn(C, K, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_of = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), torch.tensor(lens))
    return wide[:, 3 : 3 + C], pool, w, seq_of, cu, slots, fresh, lens


def _want(x, pool, w, cu, slots, fresh, lens):
    """Each sequence alone through causal_conv1d_prefill; the pool after (the sink's row not checked)."""
    pool = pool.clone()
    outs = []
    for s, n in enumerate(lens):
        state = torch.zeros_like(pool[0]) if fresh[s] else pool[int(slots[s])]
        if n == 0:
            continue
        out, new = causal_conv1d_prefill(x[int(cu[s]) : int(cu[s + 1])], state, w)
        outs.append(out)
        pool[int(slots[s])] = new
    return torch.cat(outs), pool


@pytest.mark.parametrize("seed", range(2))
def test_the_reference_equals_each_sequence_alone(seed):
    x, pool, w, seq_of, cu, slots, fresh, lens = _case(seed)
    want, want_pool = _want(x, pool, w, cu, slots, fresh, lens)
    got_pool = pool.clone()
    got = conv1d_varlen_ref_(x, got_pool, w, seq_of, cu, slots, fresh)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_pool[1:], want_pool[1:])


@pytest.mark.parametrize("lens", [STARTS_IN_EVERY_TILE, WITH_INNER_TILES], ids=["starts-in-every-tile", "inner-tiles"])
@pytest.mark.parametrize("seed", range(2))
def test_the_kernel_equals_each_sequence_alone(seed, lens):
    x, pool, w, seq_of, cu, slots, fresh, lens = _case(seed, lens=lens)
    want, want_pool = _want(x, pool, w, cu, slots, fresh, lens)
    dev = [t.to(DEVICE) for t in (x, pool, w, seq_of, cu, slots, fresh)]
    got = conv1d_varlen_(*dev).cpu()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dev[1].cpu()[1:], want_pool[1:])


def _saves(cu, lens, n_rows: int = 6):
    """A prefix cache's saves over ``_case``'s sequences (module flat's form): interior saves at flat rows 20 and 64
    into sequences long enough (rows at - K .. at - 1 inside them), final saves of sequences 0 and 3, every other
    entry 0; save slots distinct from each other and from the sequences' (1, 3, 4, 6, 8 of 9)."""
    save_slot, save_at = torch.zeros(n_rows, dtype=torch.int64), torch.zeros(n_rows, dtype=torch.int64)
    free = iter([1, 6, 8])
    for r, (s, at) in enumerate([(0, 20), (0, 32), (3, 10)]):  # (sequence, position in it)
        if lens[s] > at:
            save_slot[2 * r], save_at[2 * r] = next(free), int(cu[s]) + at
    final = torch.tensor([3, 0, 0, 4, 0], dtype=torch.int64)
    return save_slot, save_at, final


@pytest.mark.parametrize("impl", ["reference", "kernel"])
@pytest.mark.parametrize("lens", [STARTS_IN_EVERY_TILE, WITH_INNER_TILES], ids=["starts-in-every-tile", "inner-tiles"])
def test_saves_hold_the_inputs_before_their_row_and_the_final_states(impl, lens):
    """An interior save's slot holds the K conv inputs before its flat row, a final save's the sequence's new state,
    the sequences' slots and outputs are as without saves, and no other slot but the sink is written."""
    x, pool, w, seq_of, cu, slots, fresh, lens = _case(3, lens=lens)
    want, want_pool = _want(x, pool, w, cu, slots, fresh, lens)
    save_slot, save_at, final = _saves(cu, lens)
    for slot, at in zip(save_slot.tolist(), save_at.tolist(), strict=True):
        if slot:
            want_pool[slot] = x[at - 4 : at].t()
    for s, f in enumerate(final.tolist()):
        if f:
            want_pool[f] = want_pool[int(slots[s])]
    run = conv1d_varlen_ref_ if impl == "reference" else conv1d_varlen_
    dev = [t.to(DEVICE) for t in (x, pool, w, seq_of, cu, slots, fresh)]
    got = run(*dev, saves=tuple(t.to(DEVICE) for t in (save_slot, save_at, final))).cpu()
    assert int(save_slot.count_nonzero()) >= 2
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dev[1].cpu()[1:], want_pool[1:], atol=1e-6, rtol=1e-6)


def test_the_kernel_splits_q_k_v_and_normalises_q_and_k_per_head():
    """split=(128, 256), normed: three contiguous parts, the first two l2-normalised per 128-channel head, equal to
    the reference's output cut and normalised (in float32: the kernel normalises before rounding to x's dtype)."""
    from models.layers.gdn import l2norm

    x, pool, w, seq_of, cu, slots, fresh, lens = _case(3, C=356)
    want = conv1d_varlen_ref_(x, pool.clone(), w, seq_of, cu, slots, fresh)
    dev = [t.to(DEVICE) for t in (x, pool, w, seq_of, cu, slots, fresh)]
    q, k, v = (t.cpu() for t in conv1d_varlen_(*dev, split=(128, 256), normed=True))
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    torch.testing.assert_close(q, l2norm(want[:, :128]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, l2norm(want[:, 128:256]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v, want[:, 256:], atol=1e-5, rtol=1e-5)


def test_untuned_sizes_cover_each_class_a_pass_reaches_that_ran_did_not():
    """``untuned_sizes(largest, ran)`` against the classes of every pass size 1 .. largest, counted one by one: one size
    a missing class, within ``largest``, in that class, ascending."""
    import numpy as np

    from kernels.conv1d_varlen import TOKEN_CLASSES, token_class, untuned_sizes

    rng = np.random.default_rng(0)
    buckets = (256, 512, 1024, 2048, 4096, 8192)
    classes = [token_class(n) for n in range(1, 40001)]  # classes[n - 1]: an n-token pass's
    for largest in [1, 100, 256, 257, 3000, 8192, 8193, 16384, 16385, 40000, *rng.integers(1, 40000, 6).tolist()]:
        reached = set(classes[:largest])
        for ran in [(), buckets, tuple(rng.choice(buckets, 2, replace=False).tolist()), (100, 9000)]:
            want = sorted(reached - {token_class(n) for n in ran})
            got = untuned_sizes(largest, ran)
            assert [token_class(n) for n in got] == want, (largest, ran)
            assert all(1 <= n <= largest for n in got) and list(got) == sorted(got)
    assert untuned_sizes(65536, buckets) == (16384,)  # the engine's buckets: one eager pass covers every longer one
    assert untuned_sizes(2048, buckets) == ()  # the default budget: every pass is a bucket's class
    assert set(TOKEN_CLASSES) == set(classes)
