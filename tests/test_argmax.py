"""kernels.argmax (greedy decoding's draw) against numpy's argmax: fresh random rows, vocabularies that end inside a
tile, rows of one and of many chunks, ties across chunks, NaN and all -inf rows, both output dtypes, and a launch's
counters left at zero for the next. Without CUDA the kernel runs in Triton's interpreter; on a GPU compiled, in bf16
too, where the maxima of real logits tie more often."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.argmax import argmax_rows, argmax_rows_ref, chunks_for  # noqa: E402  (after TRITON_INTERPRET)
from kernels.argmax.kernel import BLOCK, _workspace  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])  # bf16: compiled only
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []


def _draw(x: torch.Tensor, chunks: int | None = None, dtype=torch.int64) -> torch.Tensor:
    out = torch.full((x.shape[0],), -7, dtype=dtype, device=x.device)
    return argmax_rows(x, out, chunks=chunks).cpu().long()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("rows,V,chunks", [(1, 3 * BLOCK + 5, None), (4, 5 * BLOCK - 1, 3), (3, 700, None),
                                           (2, 4 * BLOCK, 4), (5, 2 * BLOCK + 1, 1)])  # fmt: skip
def test_argmax_equals_numpy_on_random_rows(rows, V, chunks, dtype):
    gen = torch.Generator().manual_seed(rows * 1000 + V)
    x = (torch.randn(rows, V, generator=gen) * 4).to(dtype=dtype, device=DEVICE)
    assert torch.equal(_draw(x, chunks), argmax_rows_ref(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_argmax_keeps_the_first_index_among_equal_maxima_across_tiles_and_chunks(dtype):
    """The row's maximum at several indices (in one tile, in two tiles of a chunk, in two chunks): the first wins,
    whichever chunk finishes last."""
    V = 6 * BLOCK + 3
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, V, generator=gen).to(dtype)
    for r, where in enumerate([(5, 9), (BLOCK + 1, 2 * BLOCK + 2), (4 * BLOCK, 2 * BLOCK - 1), (V - 1, V - 2)]):
        x[r, list(where)] = 100.0
    x = x.to(DEVICE)
    want = torch.tensor([5, BLOCK + 1, 2 * BLOCK - 1, V - 2])
    assert torch.equal(argmax_rows_ref(x), want)  # (the reference agrees with the construction)
    for chunks in (1, 2, 3, 7):
        assert torch.equal(_draw(x, chunks), want), chunks


def test_argmax_takes_the_first_nan_and_a_row_of_minus_inf_gives_index_0():
    V = 3 * BLOCK + 17
    x = torch.randn(4, V)
    x[0, [2 * BLOCK + 3, BLOCK + 4]] = float("nan")  # the first NaN, in an earlier chunk than the other
    x[1] = float("-inf")
    x[2, V - 1] = float("nan")
    x[3, :] = float("-inf")
    x[3, BLOCK + 9] = -1e30
    x = x.to(DEVICE)
    want = torch.tensor([BLOCK + 4, 0, V - 1, BLOCK + 9])
    assert torch.equal(argmax_rows_ref(x), want)
    for chunks in (1, 4):
        assert torch.equal(_draw(x, chunks), want), chunks


def test_argmax_writes_int32_and_leaves_the_counters_at_zero_for_the_next_launch():
    x = torch.randn(6, 3 * BLOCK + 1, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    want = argmax_rows_ref(x)
    for _ in range(3):  # each launch reuses the stream's counters: a count left behind would pick early
        assert torch.equal(_draw(x, 4, torch.int32), want)
    counts = _workspace(x.device, torch.cuda.current_stream().cuda_stream if DEVICE == "cuda" else 0)[2]
    assert int(counts.count_nonzero()) == 0


def test_chunks_for_fills_the_sms_and_keeps_a_tile_a_chunk():
    assert chunks_for(1, 248320, 132) == 122  # one tile a chunk (fewer than 2 programs an SM)
    assert chunks_for(1, 1 << 20, 132) == 264  # 2 programs an SM
    assert chunks_for(64, 248320, 132) == 4
    assert chunks_for(512, 248320, 132) == 1
    assert chunks_for(1, 3 * BLOCK, 132) == 3  # no chunk without a whole tile
