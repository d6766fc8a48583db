"""The varlen prefill delta rule (kernels/gdn_prefill): the chunk index a fixed-shape pass hands fla, the torch
reference against the token-by-token rule, and (GPU) fla-core's kernels against the reference, with unused chunk rows
and empty sequences as a captured pass has them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.gdn_prefill import CHUNK, HAVE_FLA, chunk_index, chunk_rows, gdn_prefill, gdn_prefill_ref
from models.layers.gdn import gated_delta_sequential, l2norm


@pytest.mark.parametrize("seed", range(20))
def test_the_chunk_index_lists_every_chunk_once_and_points_unused_rows_at_the_empty_last_sequence(seed):
    rng = np.random.default_rng(seed)
    lens = np.concatenate([rng.integers(0, 300, rng.integers(1, 9)), [0]])
    rows = chunk_rows(int(lens.sum()), lens.size)
    idx, offsets = chunk_index(lens, rows)
    want = [(s, c) for s, n in enumerate(lens) for c in range(-(-n // CHUNK))]
    assert [tuple(r) for r in idx[: len(want)]] == want
    assert (idx[len(want) :] == [lens.size - 1, 0]).all()
    assert offsets.tolist() == [0, *np.cumsum(-(-lens // CHUNK)).tolist()]


def test_the_chunk_index_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        chunk_index(np.array([65, 0]), 1)
    with pytest.raises(ValueError, match="empty last sequence"):
        chunk_index(np.array([10, 3]), 4)


def _case(seed, lens, hk=2, hv=4, dk=32, dv=16, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    N, S = sum(lens), len(lens)
    q, k = l2norm(torch.randn(N, hk, dk, generator=gen)), l2norm(torch.randn(N, hk, dk, generator=gen))
    v = torch.randn(N, hv, dv, generator=gen)
    g, beta = -torch.rand(N, hv, generator=gen), torch.rand(N, hv, generator=gen)
    h0 = torch.randn(S, hv, dk, dv, generator=gen) * 0.3
    cu = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32)
    return [t.to(device) for t in (q, k, v, g, beta, h0, cu)]


def test_the_reference_equals_the_rule_token_by_token_for_each_sequence():
    lens = [5, 70, 0, 130, 1]
    q, k, v, g, beta, h0, cu = _case(0, lens)
    scale = q.shape[-1] ** -0.5
    o, ht = gdn_prefill_ref(q, k, v, g, beta, h0, cu, scale)
    for s in range(len(lens)):
        a, b = int(cu[s]), int(cu[s + 1])
        if a == b:
            torch.testing.assert_close(ht[s], h0[s])
            continue
        qs, ks = (x[a:b].repeat_interleave(2, dim=1) for x in (q, k))  # value head h reads key head h // 2
        want_o, want_h = gated_delta_sequential(qs * scale, ks, v[a:b], g[a:b], beta[a:b], h0[s])
        torch.testing.assert_close(o[a:b], want_o, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(ht[s], want_h, atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and HAVE_FLA), reason="needs CUDA and fla-core")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_equals_the_reference_with_unused_chunk_rows(dtype):
    """fla at the 0.8B shape's heads (16 key, 16 value heads of 128) in the activations' dtype; 6 unused chunk rows
    pointing at the empty last sequence. Tolerances: float32 1e-3 (fla's dots run in tf32), bfloat16 inputs 3e-2."""
    lens = [300, 1, 64, 0, 1000, 37, 0]
    q, k, v, g, beta, h0, cu = _case(1, lens, hk=16, hv=16, dk=128, dv=128, device="cuda")
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = 128**-0.5
    want_o, want_h = gdn_prefill_ref(q.float(), k.float(), v.float(), g, beta, h0, cu, scale)
    rows = -(-np.array(lens) // CHUNK).sum() + 6
    idx, offsets = (torch.from_numpy(a).cuda() for a in chunk_index(np.array(lens), int(rows)))
    o, ht = gdn_prefill(q, k, v, g, beta, h0, cu, idx, offsets, scale)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(o.float(), want_o, atol=tol, rtol=tol)
    torch.testing.assert_close(ht, want_h, atol=tol, rtol=tol)
