"""The varlen prefill delta rule (kernels/gdn_prefill): the chunk index a fixed-shape pass hands fla, the torch
reference against the token-by-token rule, and (GPU) fla-core's kernels against the reference, with unused chunk rows
and empty sequences as a captured pass has them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.gdn_prefill import CHUNK, HAVE_FLA, chunk_index, chunk_rows, gdn_prefill, gdn_prefill_ref
from kernels.gdn_prefill.naive import state_pass_ref
from kernels.gdn_prefill.state_pass import state_pass_
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
    pointing at the empty last sequence; states read from and written to scattered pool slots, a third of the
    sequences fresh (their slots hold states that must not be read). Tolerances: float32 1e-3 (fla's dots run in
    tf32), bfloat16 inputs 3e-2."""
    lens = [300, 1, 64, 0, 1000, 37, 0]
    q, k, v, g, beta, h0, cu = _case(1, lens, hk=16, hv=16, dk=128, dv=128, device="cuda")
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = 128**-0.5
    rows = -(-np.array(lens) // CHUNK).sum() + 6
    idx, offsets = (torch.from_numpy(a).cuda() for a in chunk_index(np.array(lens), int(rows)))
    S = len(lens)
    slots = torch.randperm(2 * S, device="cuda")[:S] + 1  # distinct slots, scattered over a larger pool
    fresh = torch.tensor([s % 3 == 1 for s in range(S)], device="cuda")
    pool = torch.randn(2 * S + 1, 16, 128, 128, device="cuda")
    pool[slots] = h0
    untouched = pool.clone()
    o = gdn_prefill(q, k, v, g, beta, pool, slots, fresh, cu, idx, offsets, scale)
    h0 = h0.masked_fill(fresh[:, None, None, None], 0)
    want_o, want_h = gdn_prefill_ref(q.float(), k.float(), v.float(), g, beta, h0, cu, scale)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(o.float(), want_o, atol=tol, rtol=tol)
    torch.testing.assert_close(pool[slots], want_h, atol=tol, rtol=tol)
    others = torch.ones(pool.shape[0], dtype=torch.bool, device="cuda")
    others[slots] = False
    assert torch.equal(pool[others], untouched[others])


def _state_case(seed, lens, slots, fresh, hk, hv, dk, dv, device="cpu", dtype=torch.float32):
    """The state pass's inputs; g: log2 decays cumulated within each 64-token chunk of each sequence (fla's cumsum
    stage). The pool holds random states everywhere, so a slot read where it should not be shows."""
    gen = torch.Generator().manual_seed(seed)
    N, S = sum(lens), len(lens)
    k = l2norm(torch.randn(N, hk, dk, generator=gen))
    w, u = torch.randn(N, hv, dk, generator=gen) * 0.2, torch.randn(N, hv, dv, generator=gen)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    g = -torch.rand(N, hv, generator=gen) * 0.5
    for a in range(N):  # position within its chunk: a - (its sequence's start), chunk-local running sums
        s = int(np.searchsorted(cu, a, side="right")) - 1
        if (a - cu[s]) % CHUNK:
            g[a] += g[a - 1]
    rows = chunk_rows(N, S)
    _, offsets = chunk_index(np.asarray(lens), rows)
    pool = torch.randn(max(slots) + 3, hv, dk, dv, generator=gen)
    put = {"device": device}
    return dict(k=k.to(device, dtype), w=w.to(device, dtype), u=u.to(device, dtype), g=g.to(device),
                pool=pool.to(device), slots=torch.tensor(slots, **put), fresh=torch.tensor(fresh, **put),
                cu_seqlens=torch.from_numpy(cu).to(device), chunk_offsets=torch.from_numpy(offsets).to(device),
                chunk_rows=rows)  # fmt: skip


def _used_rows(lens) -> list[int]:
    return list(range(int((-(-np.asarray(lens) // CHUNK)).sum())))


@pytest.mark.parametrize("dk, pool_dtype", [(64, torch.float32), (128, torch.float32), (64, torch.bfloat16)],
                         ids=["dk64", "dk128", "dk64-bf16-pool"])  # fmt: skip
def test_the_state_pass_reads_and_writes_each_sequences_slot(dk, pool_dtype):
    """Our state pass against its torch reference (Triton's interpreter on the CPU), float32: chunk states h,
    v_new and final states in the slots; a fresh sequence ignores what its slot holds; padding and empty sequences
    on the sink (slot 0) leave every other slot as it was. dv 48: a partial dv block. A bfloat16 pool
    (``EngineConfig.state_dtype``): read into float32, written back rounded, as the reference does."""
    lens = [130, 1, 0, 64, 70, 9, 0]
    slots = [4, 7, 2, 1, 6, 0, 0]  # the padding (9 tokens) and the empty last sequence on the sink
    fresh = [False, True, False, False, True, True, True]
    case = _state_case(0, lens, slots, fresh, hk=2, hv=4, dk=dk, dv=48)
    case["pool"] = case["pool"].to(pool_dtype)
    tol = 1e-4 if pool_dtype == torch.float32 else 1e-2
    want_pool = case["pool"].clone()
    want_h, want_v = state_pass_ref(**{**case, "pool": want_pool})
    got_pool = case["pool"].clone()
    h, v_new = state_pass_(**{**case, "pool": got_pool})
    used = _used_rows(lens)
    torch.testing.assert_close(h[used], want_h[used], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(v_new, want_v, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_pool[1:], want_pool[1:], atol=tol, rtol=tol)  # slot 0: the sink's race
    assert torch.equal(got_pool[[3, 5, 8, 9]], case["pool"][[3, 5, 8, 9]])  # no sequence's slots


def test_the_state_pass_refuses_a_head_dim_it_was_not_written_for():
    case = _state_case(0, [5, 0], [1, 0], [True, True], hk=1, hv=1, dk=32, dv=16)
    with pytest.raises(ValueError, match="dk 64 or 128"):
        state_pass_(**case)


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and HAVE_FLA), reason="needs CUDA and fla-core")
def test_the_state_pass_equals_flas_on_gathered_states():
    """At the 0.8B shape in bf16: our state pass in the slots against fla-core's chunk_gated_delta_rule_fwd_h on the
    same states gathered (zeros where fresh) and scattered by hand: h and v_new bf16-close (2e-2), final states 1e-2."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h

    lens = [300, 1, 64, 0, 1000, 37, 120, 0]
    slots = [3, 9, 1, 5, 12, 7, 0, 0]
    fresh = [False, True, False, True, False, False, True, True]
    case = _state_case(1, lens, slots, fresh, hk=16, hv=16, dk=128, dv=128, device="cuda", dtype=torch.bfloat16)
    idx, _ = chunk_index(np.asarray(lens), case["chunk_rows"])
    s, f = case["slots"], case["fresh"]
    h0 = case["pool"][s].masked_fill(f[:, None, None, None], 0)
    want_h, want_v, ht = chunk_gated_delta_rule_fwd_h(
        k=case["k"][None], w=case["w"][None], u=case["u"][None], g=case["g"][None], initial_state=h0,
        output_final_state=True, chunk_size=CHUNK, cu_seqlens=case["cu_seqlens"],
        chunk_indices=torch.from_numpy(idx).cuda(), chunk_offsets=case["chunk_offsets"])  # fmt: skip
    pool = case["pool"].clone()
    h, v_new = state_pass_(**{**case, "pool": pool})
    used = _used_rows(lens)
    torch.testing.assert_close(h[used].float(), want_h[0, used].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(v_new.float(), want_v[0].float(), atol=2e-2, rtol=2e-2)
    real = [i for i, x in enumerate(slots) if x]
    torch.testing.assert_close(pool[s[real]], ht[real], atol=1e-2, rtol=1e-2)
