"""The flat prefill pass's layout (models.layers.flat), a pure host function: on random chunk sets, in their exact
shape and in a token bucket's, every real token is where its chunk says (id, position, K/V slot, sequence), padding
and empty sequences sit on the sinks, and the page lists and lengths are what each stream holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.layers.flat import SINK_PAGE, HostStaging, bucket_shape, exact_shape, flat_layout

PS = 4


def _draw(rng):
    R = int(rng.integers(1, 6))
    lens = rng.integers(1, 30, R)
    starts = np.where(rng.random(R) < 0.5, 0, rng.integers(1, 20, R))
    need = -(-(starts + lens) // PS)
    pages = np.split(rng.permutation(np.arange(1, 1 + need.sum())), np.cumsum(need)[:-1])
    ids = [rng.integers(0, 1000, n) for n in lens]
    return ids, starts, rng.integers(0, 5, R), rng.permutation(np.arange(1, 9))[:R], pages


@pytest.mark.parametrize("seed", range(40))
def test_every_token_lands_where_its_chunk_says(seed):
    rng = np.random.default_rng(seed)
    ids, starts, offsets, slots, pages = _draw(rng)
    lens = np.array([len(t) for t in ids])
    exact = exact_shape(lens, [len(p) for p in pages])
    for shape in (exact, bucket_shape(int(lens.sum()) + int(rng.integers(0, 40)), 6, 64, PS)):
        lay = flat_layout(ids, starts, offsets, slots, pages, PS, shape)
        R, N, S = len(ids), shape.tokens, shape.seqs
        assert lay.chunks == R and lay.ids.shape == (N,) and lay.cu_seqlens.shape == (S + 1,)
        cu = lay.cu_seqlens
        for r in range(R):
            a, b = cu[r], cu[r + 1]
            stream = starts[r] + np.arange(lens[r])
            assert (lay.ids[a:b] == ids[r]).all() and (lay.seq_of[a:b] == r).all()
            assert (lay.pos[a:b] == offsets[r] + stream).all()
            assert (lay.write_loc[a:b] == pages[r][stream // PS] * PS + stream % PS).all()
            assert lay.last[r] == b - 1 and lay.slots[r] == slots[r] and lay.fresh[r] == (starts[r] == 0)
            used = lay.kv_indices[lay.kv_indptr[r] : lay.kv_indptr[r + 1]]
            assert (used == pages[r][: len(used)]).all() and lay.kv_lens[r] == starts[r] + lens[r]
            assert len(used) == -(-lay.kv_lens[r] // PS) and 1 <= lay.kv_last_page_len[r] <= PS
        pad = slice(cu[R], N)  # the padding sequence, then empty ones up to S
        assert cu[R + 1] == N and (cu[R + 1 :] == N).all()
        assert (lay.write_loc[pad] // PS == SINK_PAGE).all() and (lay.ids[pad] == 0).all()
        assert (lay.slots[R:] == 0).all() and lay.fresh[R:].all() and (lay.last[R:] == 0).all()
        assert (lay.kv_indices[lay.kv_indptr[R] :] == SINK_PAGE).all() and (lay.kv_lens[R + 1 :] == 1).all()
        assert (lay.chunk_indices[:, 0] < S).all() and lay.chunk_offsets[-1] <= shape.chunk_rows


def test_chunks_that_do_not_fit_are_refused():
    ids, starts, offsets, slots, pages = [np.zeros(9, np.int64)] * 2, [0, 0], [0, 0], [1, 2], [np.arange(1, 4)] * 2
    with pytest.raises(ValueError, match="do not fit"):
        flat_layout(ids, starts, offsets, slots, pages, PS, bucket_shape(16, 2, 64, PS))  # 18 tokens
    with pytest.raises(ValueError, match="do not fit"):
        flat_layout(ids, starts, offsets, slots, pages, PS, bucket_shape(32, 1, 64, PS))  # 2 chunks


def test_host_staging_brings_every_array_up_as_it_was():
    """HostStaging packs a pass's arrays (mixed dtypes and shapes, empty ones, odd byte counts) into one buffer and
    hands back typed views of one copy: each equals its array; its buffers grow when a pass needs more, and a batch
    stays intact after later passes (each pass's device copy is its own)."""
    rng = np.random.default_rng(0)
    staging = HostStaging("cpu")
    kept = []
    for n in (3, 40, 1, 200, 7):
        arrays = [rng.integers(-5, 10**9, n), rng.integers(0, 1000, (n, 2)).astype(np.int32), rng.random(n) < 0.5,
                  np.zeros(0, np.int64), rng.integers(0, 9, n + 1).astype(np.int32)]  # fmt: skip
        got = staging.up(arrays)
        for a, t in zip(arrays, got, strict=True):
            assert t.shape == a.shape and t.dtype == torch.from_numpy(a).dtype
            np.testing.assert_array_equal(t.numpy(), a)
        kept.append((arrays, got))
    for arrays, got in kept:  # (five passes later, through buffers reused and grown)
        for a, t in zip(arrays, got, strict=True):
            np.testing.assert_array_equal(t.numpy(), a)
