"""The weight stream on a persistent grid (``gemv(..., persistent=...)``: _gemv_stream_kernel) against the grid of a
program a column block at the same tiles (bit for bit: each block's K tiles summed in one order) and a float64 torch
reference; plain, with silu_mul folded, with the pre-norm folded.

Fresh random inputs per case; N and K off the tiles (masked tails), fewer programs than blocks (each program walks
several blocks, so the pipelined loop crosses block boundaries) and as many. Without CUDA the kernels run in Triton's
interpreter (3 "SMs", ``_programs_a_wave``); on a GPU the same cases run compiled (``pytest -m gpu``).
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.gates import silu_mul  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.gemv import gemv, gemv_add_rms_norm, gemv_ref, gemv_silu_mul, tile_rows  # noqa: E402
from kernels.norms import add_rms_norm_  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
TILES = {1: (4, 64), 16: (16, 64)}  # (block_n, block_k) by row tile: 4 or 16 columns, 64 K elements a tile


def _seed(*case) -> int:
    return zlib.crc32(repr(case).encode())


def _w(gen: torch.Generator, N: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """A weight [N, K] with a row stride off K (a column block of a wider tensor)."""
    return (torch.randn(N, K + 3, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)[:, 1 : 1 + K]


def _configs(M: int, K: int, stages: int, per_sm: int) -> tuple[tuple, tuple]:
    """(the grid's config, the persistent grid's) at one tile."""
    bn, bk = TILES[tile_rows(M) if M == 1 else 16]
    return (bn, bk, 2, 1), (bn, bk, 2, stages, per_sm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
# 3 programs (each many blocks) unpipelined and pipelined, or as many programs as blocks
@pytest.mark.parametrize("stages,per_sm", [(1, 1), (3, 1), (3, 40)])
@pytest.mark.parametrize("N,K", [(37, 70), (70, 300), (129, 64)])
@pytest.mark.parametrize("M", [1, 3])
def test_the_persistent_stream_equals_the_grid(M, N, K, stages, per_sm, dtype):
    gen = torch.Generator().manual_seed(_seed(M, N, K, stages, per_sm, dtype))
    x = torch.randn(M, K, generator=gen).to(dtype=dtype, device=DEVICE)
    w = _w(gen, N, K, dtype)
    grid, persistent = _configs(M, K, stages, per_sm)
    got = gemv(x, w, persistent=persistent)
    assert torch.equal(got, gemv(x, w, config=grid))
    if dtype == torch.float32 or M == 1:  # (the interpreter's bf16 tl.dot: see test_gemv_silu._check_ref)
        tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 or (DEVICE == "cuda" and M > 1) else {}
        torch.testing.assert_close(got, gemv_ref(x, w).to(dtype), **tol)


@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("N,K", [(37, 70), (70, 300)])
def test_the_persistent_stream_folds_silu_mul(M, N, K):
    gen = torch.Generator().manual_seed(_seed("silu", M, N, K))
    gu = (torch.randn(M, 2 * K, generator=gen) * 2).to(device=DEVICE)
    w = _w(gen, N, K, torch.float32)
    grid, persistent = _configs(M, K, 3, 1)
    got = gemv_silu_mul(gu, w, persistent=persistent)
    assert torch.equal(got, gemv_silu_mul(gu, w, config=grid))
    assert torch.equal(got, gemv(silu_mul(gu), w, config=grid))


@pytest.mark.parametrize("delta", [True, False], ids=["delta", "no-delta"])
@pytest.mark.parametrize("N,K", [(37, 70), (70, 300)])
def test_the_persistent_stream_folds_the_norm(N, K, delta):
    gen = torch.Generator().manual_seed(_seed("norm", N, K, delta))
    h = torch.randn(1, K, generator=gen).to(dtype=torch.bfloat16, device=DEVICE)
    d = torch.randn(1, K, generator=gen).to(dtype=torch.bfloat16, device=DEVICE) if delta else None
    nw = (torch.randn(K, generator=gen) * 0.1).to(dtype=torch.bfloat16, device=DEVICE)
    w = _w(gen, N, K, torch.bfloat16)
    grid, persistent = _configs(1, K, 3, 1)
    h_out = torch.empty_like(h)
    got = gemv_add_rms_norm(h, d, nw, 1e-6, w, h_out, persistent=persistent)
    h_grid = torch.empty_like(h)
    assert torch.equal(got, gemv_add_rms_norm(h, d, nw, 1e-6, w, h_grid, config=grid))
    assert torch.equal(h_out, h_grid)
    h2 = h.clone()
    x = add_rms_norm_(h2, d, nw, 1e-6)  # the two launches it replaces: the residual bit for bit
    assert torch.equal(h_out, h2)
    torch.testing.assert_close(got, gemv(x, w, config=grid), atol=2e-2, rtol=2e-2)
