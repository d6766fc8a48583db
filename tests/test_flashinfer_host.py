"""The CPU side of the FlashInfer backends: the FA2 host CSR builder, the torch dispatch and the owned workspaces (no
flashinfer needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.layers.decode_attention import Backend
from models.layers.flashinfer_attention import (
    TorchDecode,
    WorkspaceKind,
    Workspaces,
    build_paged_kv_csr,
    decode_attention,
    make_decode_attention,
)
from models.layers.paged import paged_decode_attention


def _naive_csr(bt, sl, ps):
    indptr, indices, last = [0], [], []
    for row, n in zip(bt, sl, strict=True):
        k = -(-int(n) // ps)
        indices += [int(p) for p in row[:k]]
        indptr.append(indptr[-1] + k)
        last.append(int(n) - (k - 1) * ps if k else 0)
    return np.array(indptr), np.array(indices, dtype=np.int64), np.array(last)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ps", [1, 16, 64])
def test_csr_matches_a_loop(seed, ps):
    rng = np.random.default_rng(seed)
    b, W = int(rng.integers(1, 20)), int(rng.integers(1, 9))
    sl = rng.integers(0, W * ps + 1, size=b)
    bt = rng.integers(1, 1000, size=(b, W)).astype(np.int32)
    bt[np.arange(W)[None, :] >= -(-sl // ps)[:, None]] = 0
    indptr, indices, last, nnz = build_paged_kv_csr(bt, sl, ps)
    ref = _naive_csr(bt, sl, ps)
    np.testing.assert_array_equal(indptr, ref[0])
    np.testing.assert_array_equal(indices, ref[1])
    np.testing.assert_array_equal(last, ref[2])
    assert nnz == indptr[-1] == len(indices)
    # the same through caller-owned (pinned-host-like) buffers, larger than needed
    bufs = np.full(b + 3, -1, np.int32), np.full(b * W + 4, -1, np.int32), np.full(b + 2, -1, np.int32)
    indptr2, indices2, last2, nnz2 = build_paged_kv_csr(bt, sl, ps, *bufs)
    assert nnz2 == nnz and indptr2.base is not None
    np.testing.assert_array_equal(indptr2, ref[0])
    np.testing.assert_array_equal(indices2, ref[1])
    np.testing.assert_array_equal(last2, ref[2])


def test_csr_rejects_rows_longer_than_the_table():
    with pytest.raises(ValueError):
        build_paged_kv_csr(np.zeros((2, 2), np.int32), np.array([3, 33]), 16)


def test_csr_describes_the_same_attention():
    """Attention over the CSR pages (FlashInfer's reading) equals paged_decode_attention over the block table."""
    rng = np.random.default_rng(0)
    ps, W, b, hq, hk, d = 4, 5, 6, 4, 2, 8
    sl = rng.integers(1, W * ps + 1, size=b).astype(np.int32)
    npages = -(-sl // ps)
    bt = np.zeros((b, W), np.int32)
    bt[np.arange(W)[None, :] < npages[:, None]] = rng.permutation(np.arange(1, 40))[: npages.sum()]
    kv = torch.randn(40, 2, ps, hk, d)
    q = torch.randn(b, hq, d)
    ref = paged_decode_attention(q, kv, torch.from_numpy(bt), torch.from_numpy(sl), d**-0.5)
    indptr, indices, last, _ = build_paged_kv_csr(bt, sl, ps)
    for i in range(b):
        pages = torch.from_numpy(indices[indptr[i] : indptr[i + 1]]).long()
        n = (len(pages) - 1) * ps + int(last[i])
        k = kv[pages, 0].reshape(-1, hk, d)[:n].repeat_interleave(hq // hk, 1)  # [n, hq, d]
        v = kv[pages, 1].reshape(-1, hk, d)[:n].repeat_interleave(hq // hk, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[i], k) * d**-0.5, -1)
        torch.testing.assert_close(torch.einsum("hn,nhd->hd", p, v), ref[i], rtol=1e-5, atol=1e-5)


def test_torch_dispatch():
    kv = torch.randn(9, 2, 4, 2, 8)
    q = torch.randn(3, 4, 8)
    bt = torch.tensor([[1, 2], [3, 0], [4, 5]], dtype=torch.int32)
    sl = torch.tensor([5, 1, 8], dtype=torch.int32)
    ref = paged_decode_attention(q, kv, bt, sl, 0.3)
    attn = make_decode_attention(
        Backend.TORCH, batch_size=3, max_pages_per_row=2, num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=4
    )
    assert isinstance(attn, TorchDecode) and attn.backend is Backend.TORCH
    torch.testing.assert_close(attn(q, kv, bt, sl, 0.3), ref)
    torch.testing.assert_close(decode_attention(None, q, kv, bt, sl, 0.3), ref)
    torch.testing.assert_close(decode_attention(attn, q, kv, bt, sl, 0.3), ref)


def test_workspaces_give_one_zeroed_buffer_a_kind_to_their_owner_alone():
    """Every ask of a kind gets the same zeroed buffer; kinds are distinct buffers; another owner's are its own; a
    larger ask than the first is refused; an attention on another device is refused its owner's workspaces."""
    ws, other = Workspaces("cpu"), Workspaces("cpu")
    xqa = ws.get(WorkspaceKind.XQA, 64)
    assert xqa.dtype == torch.uint8 and xqa.numel() == 64 and not xqa.any()
    assert ws.get(WorkspaceKind.XQA, 64) is xqa and ws.get(WorkspaceKind.XQA, 16) is xqa
    fa2, prefill = ws.get(WorkspaceKind.FA2, 64), ws.get(WorkspaceKind.PREFILL, 64)
    ptrs = {t.data_ptr() for t in (xqa, fa2, prefill, other.get(WorkspaceKind.XQA, 64))}
    assert len(ptrs) == 4
    with pytest.raises(ValueError, match="the xqa workspace holds 64 bytes, 128 asked for"):
        ws.get(WorkspaceKind.XQA, 128)
    assert ws.on("cpu") is ws
    with pytest.raises(ValueError, match="workspaces on cpu given to an attention on meta"):
        ws.on("meta")
