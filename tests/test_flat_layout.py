"""The flat prefill pass's layout (models.layers.flat), a pure host function: on random chunk sets, in their exact
shape and in a token bucket's, every real token is where its chunk says (id, position, K/V slot, sequence), padding
and empty sequences sit on the sinks, and the page lists and lengths are what each stream holds."""

from __future__ import annotations

import numpy as np
import pytest

from models.layers.flat import SINK_PAGE, bucket_shape, exact_shape, flat_layout

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
