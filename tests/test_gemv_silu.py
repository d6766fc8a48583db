"""SwiGLU's silu_mul folded into the down projection's weight stream (kernels.gemv.gemv_silu_mul) against the two-step
form it replaces (kernels.gates.silu_mul then kernels.gemv.gemv: equal bit for bit) and a float64 torch reference.

Fresh random inputs per case; widths that are not multiples of the tiles (masked tails in N and K); gu as a row-strided
column block of a wider tensor. Without CUDA the kernels run in Triton's interpreter (float32 and bf16); on a GPU the
same cases run compiled (``pytest -m gpu``).
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.choices import DEFAULT  # noqa: E402
from kernels.gates import silu_mul  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.gemv import DEFAULT_CONFIG, gemv, gemv_silu_mul, gemv_silu_mul_ref, tile_rows  # noqa: E402
from models.layers.fused import decode_linear, decode_silu_mul_linear  # noqa: E402
from models.layers.mlp import SwiGLU  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # on a GPU every case here runs compiled
DTYPES = [torch.float32, torch.bfloat16]
SEEDS = [0, 1]
SHAPES = [(37, 70), (64, 129), (70, 300), (40, 1100)]  # (N, K): N and K off the tile sizes; K over one and many tiles
# (block_n, block_k, warps, stages) per path (one row / tl.dot): the defaults, and small tiles (many K steps, N tails)
SMALL = (16, 64, 2, 1)  # tl.dot needs 16-wide tiles
CONFIGS = {"default": DEFAULT_CONFIG, "small-tiles": {1: (4, 64, 2, 1), 16: SMALL, 32: SMALL, 64: SMALL}}


def _tol(dtype: torch.dtype, M: int) -> dict:
    """Against the float64 reference: float32 differs by accumulation order (and TF32 in a compiled tl.dot); bf16 by
    the rounding of the activation and of the output."""
    if dtype == torch.bfloat16:
        return dict(atol=2e-2, rtol=2e-2)
    if DEVICE == "cuda" and M > 1:
        return dict(atol=2e-2, rtol=2e-2)
    return dict(atol=1e-4, rtol=1e-4)


def _seed(*case) -> int:
    """A seed of the case's own (its parameters' text, hashed the same in every process): fresh inputs a case."""
    return zlib.crc32(repr(case).encode())


def _case(seed: int, M: int, N: int, K: int, dtype: torch.dtype, pad: int = 0):
    """gu [M, 2K] (a column block of a [M, 2K + 2 pad] tensor when pad > 0) and a strided weight w [N, K]."""
    gen = torch.Generator().manual_seed(seed)
    wide = (torch.randn(M, 2 * K + 2 * pad, generator=gen) * 2).to(dtype=dtype, device=DEVICE)
    gu = wide[:, pad : pad + 2 * K]
    w = (torch.randn(N, K + 5, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)[:, 2 : 2 + K]
    return gu, w


def _check_ref(got: torch.Tensor, gu: torch.Tensor, w: torch.Tensor) -> None:
    """got is (silu(g) * u) @ w^T within the dtype's tolerance of the float64 torch value. Not checkable in the
    interpreter for bf16 with tl.dot (M > 1): its tl.dot multiplies bf16 bit patterns (triton-lang/triton#11584), for
    the plain gemv as much as for the fused one; there the bit-for-bit comparison with gemv(silu_mul(gu)) still runs."""
    M, dtype = got.shape[0], got.dtype
    if INTERPRET and dtype == torch.bfloat16 and M > 1:
        return
    torch.testing.assert_close(got, gemv_silu_mul_ref(gu, w), **_tol(dtype, M))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", [1, 3, 16])
def test_gemv_silu_mul(M, N, K, config, dtype):
    gu, w = _case(_seed(M, N, K, config, dtype), M, N, K, dtype)
    cfg = CONFIGS[config][tile_rows(M)]
    got = gemv_silu_mul(gu, w, config=cfg)
    assert got.shape == (M, N) and got.dtype == dtype
    assert torch.equal(got, gemv(silu_mul(gu), w, config=cfg))  # the two kernels it replaces, bit for bit
    _check_ref(got, gu, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("M", [1, 3])
def test_gemv_silu_mul_split_k(M, dtype):
    """With K split over 3 programs a column block (a config's fifth entry): still gemv(silu_mul(gu)) at the same
    config bit for bit, and the float64 value within tolerance."""
    gu, w = _case(2, M, 70, 300, dtype)
    cfg = (16 if M > 1 else 4, 64, 2, 1, 3)
    got = gemv_silu_mul(gu, w, config=cfg)
    assert torch.equal(got, gemv(silu_mul(gu), w, config=cfg))
    _check_ref(got, gu, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("M", [1, 3, 16])
def test_gemv_silu_mul_row_strided_input(M, dtype):
    N, K = 70, 300
    gu, w = _case(_seed("strided", M, dtype), M, N, K, dtype, pad=3)  # row stride 2K + 6, unit column stride
    assert gu.stride() == (2 * K + 6, 1) and (M == 1 or not gu.is_contiguous())
    cfg = CONFIGS["small-tiles"][tile_rows(M)]
    out = torch.full((M, N), float("nan"), dtype=dtype, device=DEVICE)
    got = gemv_silu_mul(gu, w, out=out, config=cfg)
    assert got is out
    assert torch.equal(got, gemv(silu_mul(gu.contiguous()), w, config=cfg))
    _check_ref(got, gu, w)


def test_gemv_silu_mul_rejects_mismatched_widths():
    gu, w = _case(0, 2, 16, 32, torch.float32)
    with pytest.raises(AssertionError):
        gemv_silu_mul(gu[:, :62], w)  # gu must be [M, 2K]
    with pytest.raises(AssertionError):
        gemv_silu_mul(torch.zeros(65, 64, device=DEVICE), w)  # more rows than a weight stream serves


@pytest.mark.parametrize("M", [1, 3, 16])
def test_decode_silu_mul_linear_is_the_two_step_value(M):
    """The dispatch: whichever path it takes (the fused kernel on CUDA where it wins, silu_mul + F.linear or gemv
    elsewhere), its value is decode_linear(silu_mul(gu), w) exactly."""
    gu, w = _case(M, M, 96, 200, torch.float32)
    assert torch.equal(decode_silu_mul_linear(gu, w, DEFAULT), decode_linear(silu_mul(gu), w, DEFAULT))


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("seed", SEEDS)
def test_swiglu_forward_fused_matches_forward(seed, M):
    torch.manual_seed(seed)
    mlp = SwiGLU(64, 200).to(DEVICE)
    x = torch.randn(M, 64, generator=torch.Generator().manual_seed(seed + 100)).to(DEVICE)
    with torch.no_grad():
        want = mlp(x)
        got = mlp.forward_fused(x, DEFAULT)
    tol = dict(atol=2e-2, rtol=2e-2) if DEVICE == "cuda" else dict(atol=1e-5, rtol=1e-5)  # TF32 on the GPU
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.skipif(DEVICE != "cuda", reason="the fused kernel serves decode only on CUDA")
@pytest.mark.parametrize("M", [1, 16])
def test_swiglu_forward_fused_takes_the_fused_stream_gpu(M):
    """At Qwen3.5-0.8B's down projection (1024 x 3584, a SILU_MUL_CONFIGS shape for one row), forward_fused's down GEMM
    is gemv_silu_mul; at 16 rows, silu_mul + cuBLAS. Both: the two-step value."""
    from kernels.gemv import silu_mul_fold_wins

    mlp = SwiGLU(1024, 3584).to(device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(M, 1024, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        gu = decode_linear(x, mlp.gate_up_weight(), DEFAULT)
        want = decode_linear(silu_mul(gu), mlp.down_proj.weight, DEFAULT)
        got = mlp.forward_fused(x, DEFAULT)
    assert silu_mul_fold_wins(1, 1024, 3584) and not silu_mul_fold_wins(16, 1024, 3584)
    assert torch.equal(got, want)
