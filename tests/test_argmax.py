"""kernels.argmax (greedy decoding's draw) against numpy's argmax: fresh random rows, vocabularies that end inside a
tile and rows of one tile (one launch) and of many (two), ties within and across tiles, NaN and all -inf rows, both
output dtypes. Without CUDA the kernels run in Triton's interpreter; on a GPU compiled, in bf16 too, where the maxima
of real logits tie more often."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.argmax import argmax_rows, argmax_rows_ref  # noqa: E402  (after TRITON_INTERPRET)
from kernels.argmax.kernel import BLOCK  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])  # bf16: compiled only
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []


def _draw(x: torch.Tensor, dtype=torch.int64) -> torch.Tensor:
    out = torch.full((x.shape[0],), -7, dtype=dtype, device=x.device)
    return argmax_rows(x, out).cpu().long()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("rows,V", [(1, 3 * BLOCK + 5), (4, 5 * BLOCK - 1), (3, 700), (2, BLOCK), (5, BLOCK + 1)])
def test_argmax_equals_numpy_on_random_rows(rows, V, dtype):
    gen = torch.Generator().manual_seed(rows * 1000 + V)
    x = (torch.randn(rows, V, generator=gen) * 4).to(dtype=dtype, device=DEVICE)
    assert torch.equal(_draw(x), argmax_rows_ref(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_argmax_keeps_the_first_index_among_equal_maxima_within_and_across_tiles(dtype):
    V = 6 * BLOCK + 3
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, V, generator=gen).to(dtype)
    for r, where in enumerate([(5, 9), (BLOCK + 1, 2 * BLOCK + 2), (4 * BLOCK, 2 * BLOCK - 1), (V - 1, V - 2),
                               (3 * BLOCK + 7, BLOCK - 1, 5 * BLOCK)]):  # fmt: skip
        x[r, list(where)] = 100.0
    x = x.to(DEVICE)
    want = torch.tensor([5, BLOCK + 1, 2 * BLOCK - 1, V - 2, BLOCK - 1])
    assert torch.equal(argmax_rows_ref(x), want)  # (the reference agrees with the construction)
    assert torch.equal(_draw(x), want)
    assert torch.equal(_draw(x[:, :BLOCK].contiguous()), argmax_rows_ref(x[:, :BLOCK]))  # one tile: one launch


def test_argmax_takes_the_first_nan_and_a_row_of_minus_inf_gives_index_0():
    V = 3 * BLOCK + 17
    x = torch.randn(5, V)
    x[0, [2 * BLOCK + 3, BLOCK + 4]] = float("nan")  # the first NaN, in an earlier tile than the other
    x[1] = float("-inf")
    x[2, V - 1] = float("nan")
    x[3, :] = float("-inf")
    x[3, BLOCK + 9] = -1e30
    x[4, [7, 3]] = float("nan")  # two NaNs in one tile
    x = x.to(DEVICE)
    want = torch.tensor([BLOCK + 4, 0, V - 1, BLOCK + 9, 3])
    assert torch.equal(argmax_rows_ref(x), want)
    assert torch.equal(_draw(x), want)
    head = x[:, :BLOCK].contiguous()  # one tile: one launch (rows 0 and 2 have no NaN there)
    got = _draw(head)
    assert torch.equal(got, argmax_rows_ref(head)) and (int(got[1]), int(got[3]), int(got[4])) == (0, 0, 3)


def test_argmax_writes_int32_and_reads_rows_of_a_strided_batch():
    x = torch.randn(6, 4 * BLOCK, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    view = x[::2, : 3 * BLOCK + 1]  # rows 2 apart, each ending inside a tile
    assert torch.equal(_draw(view, torch.int32), argmax_rows_ref(view))


def test_the_kernel_draws_greedy_steps_on_cuda_by_default_and_where_asked():
    """KernelChoices.argmax None: the kernel on CUDA, torch's argmax off it; True/False: as asked on either."""
    from kernels.choices import KernelChoices

    assert KernelChoices().draws_argmax_kernel(cuda=True) and not KernelChoices().draws_argmax_kernel(cuda=False)
    assert KernelChoices(argmax=True).draws_argmax_kernel(cuda=False)
    assert not KernelChoices(argmax=False).draws_argmax_kernel(cuda=True)
