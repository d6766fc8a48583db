"""The split-KV paged decode kernel (kernels/paged_decode) against its torch reference (``paged_decode_ref``; the
model's torch attention equals it) on fresh random caches, tables and lengths: empty rows, rows that fill the table,
table columns past a row's length pointing at live pages of other rows, forced and default split counts. Without CUDA
it runs in Triton's interpreter; on a GPU it runs compiled, float32 and bf16."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.paged_decode import (  # noqa: E402
    CPU_SMS,
    MIN_SPLIT_TOKENS,
    device_sms,
    num_splits,
    paged_decode,
    paged_decode_ref,
    split_tokens,
    workspace_elements,
)
from models.layers.paged import paged_decode_attention  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=1.5e-2, rtol=1.5e-2)}
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []


def case(seed, b, hq, hk, D, ps, W, dtype, lens=None):
    """q, kv, block_table, seq_lens: distinct live pages per row, the columns past a row's length pointing at other
    rows' pages (a kernel reading past the length picks up real data and fails)."""
    gen = torch.Generator().manual_seed(seed)
    P = 1 + b * W
    kv = torch.randn(P, 2, ps, hk, D, generator=gen).to(dtype=dtype, device=DEVICE)
    q = torch.randn(b, hq, D, generator=gen).to(dtype=dtype, device=DEVICE)
    bt = (1 + torch.randperm(b * W, generator=gen)).reshape(b, W).to(torch.int32)
    if lens is None:
        lens = torch.randint(0, W * ps + 1, (b,), generator=gen)
        lens[0] = W * ps  # a full row
        if b > 2:
            lens[1] = 0  # an empty row (a padding row of a bucket)
            lens[2] = 1
    sl = torch.as_tensor(lens, dtype=torch.int32)
    return q, kv, bt.to(DEVICE), sl.to(DEVICE)


def run(q, kv, bt, sl, scale, splits=None):
    b, hq, D = q.shape
    hk = kv.shape[3]
    W, ps = bt.shape[1], kv.shape[2]
    ws = torch.empty(workspace_elements(b, hq, hk, D, W * ps, 66) + b * hk * 64 * hq * (D + 2), device=DEVICE)
    out = torch.full_like(q, float("nan"))  # every element must be written
    return paged_decode(q, kv, bt, sl, scale, out, ws, splits=splits)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "b,hq,hk,D,ps,W",
    [(1, 8, 2, 256, 16, 48), (5, 4, 4, 64, 16, 6), (7, 8, 1, 128, 8, 9), (3, 16, 2, 64, 64, 3), (9, 6, 2, 32, 4, 13)],
)
def test_matches_torch_reference_default_splits(b, hq, hk, D, ps, W, seed, dtype):
    """Against the op's naive reference, which the model's torch attention (the CPU path) also equals."""
    q, kv, bt, sl = case(seed, b, hq, hk, D, ps, W, dtype)
    scale = D**-0.5
    want = paged_decode_ref(q, kv, bt, sl, scale)
    torch.testing.assert_close(run(q, kv, bt, sl, scale), want, **TOL[dtype])
    live = sl > 0  # (the model's attention serves rows of at least one token)
    torch.testing.assert_close(paged_decode_attention(q, kv, bt, sl, scale)[live], want[live], **TOL[dtype])


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 40])
def test_every_split_count_gives_the_same_attention(splits):
    """Forced split counts, including more splits than tokens in most rows (empty partials merge as zero weight)."""
    q, kv, bt, sl = case(5, 4, 8, 2, 64, 16, 10, DTYPES[-1])
    want = paged_decode_ref(q, kv, bt, sl, 0.125)
    torch.testing.assert_close(run(q, kv, bt, sl, 0.125, splits=splits), want, **TOL[DTYPES[-1]])


def test_all_rows_empty_give_zeros():
    q, kv, bt, sl = case(3, 3, 4, 2, 32, 16, 4, torch.float32, lens=[0, 0, 0])
    assert torch.equal(paged_decode_ref(q, kv, bt, sl, 0.2), torch.zeros_like(q))
    for splits in (1, 4):
        assert torch.equal(run(q, kv, bt, sl, 0.2, splits=splits), torch.zeros_like(q))


def test_each_row_divides_its_own_length_over_the_splits():
    """A table sized for a long context (64 pages of 16 tokens) holding short rows: each row spreads its tokens over
    the splits its length needs (ceil(n / S) tokens a split, rounded up to a multiple of 32), the splits past them write
    nothing, and the combine reads none of those (the workspace starts as NaN: a partial read unwritten would show)."""
    b, hq, hk, D, ps, W, S = 4, 8, 2, 64, 16, 64, 16
    lens = [0, 1, 100, 1024]
    q, kv, bt, sl = case(5, b, hq, hk, D, ps, W, torch.float32, lens=lens)
    G = hq // hk
    ws = torch.full((b * hk * S * G * (D + 2),), float("nan"), device=DEVICE)
    out = paged_decode(q, kv, bt, sl, 0.125, torch.full_like(q, float("nan")), ws, splits=S)
    torch.testing.assert_close(out, paged_decode_ref(q, kv, bt, sl, 0.125), **TOL[torch.float32])
    ml = ws[b * hk * S * G * D :].view(b, hk, S, G, 2)
    for r, n in enumerate(lens):
        per = max(1, math.ceil(math.ceil(n / S) / MIN_SPLIT_TOKENS)) * MIN_SPLIT_TOKENS
        used = math.ceil(n / per)
        assert used == [0, 1, 4, 16][r]
        assert not ml[r, :, :used].isnan().any() and ml[r, :, used:].isnan().all(), r


def test_split_heuristic_fills_the_gpu_and_keeps_splits_long():
    assert split_tokens(1, 2, 768, 132) == MIN_SPLIT_TOKENS  # 132 splits a row allowed: the 32-token floor binds
    assert split_tokens(16, 2, 768, 132) == 96  # 8 splits a row allowed: 768 / 8, a multiple of 32
    assert device_sms(torch.device("cpu")) == CPU_SMS
    assert num_splits(1, 2, 768, 132) == 768 // MIN_SPLIT_TOKENS  # one row: as many splits as 32-token pieces
    assert num_splits(64, 2, 768, 132) == 2  # 128 programs: two splits fill 2 programs an SM
    assert num_splits(128, 2, 768, 132) == 1  # 256 programs already: one split
    for b in (1, 2, 16, 64, 256):
        s = num_splits(b, 2, 4096, 132)
        assert 4096 / s >= MIN_SPLIT_TOKENS - 1e-9 and (s == 1 or b * 2 * s <= 2 * 132 + b * 2)
