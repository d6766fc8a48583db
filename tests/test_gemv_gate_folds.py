"""The head-gate folds into the one-row weight stream against the two kernels each replaces and a float64 torch
reference: the GDN output norm in out_proj's loads (kernels.gemv.gemv_gated_rms_norm, against
kernels.norms.gated_rms_norm then kernels.gemv.gemv) and attention's output gate in o_proj's loads
(kernels.gemv.gemv_sigmoid_gate, against kernels.gates.sigmoid_gate_mul then gemv).

Exactness: both equal their two kernels bit for bit in the interpreter (same operations, same roundings; a head's sum
of squares is reduced by numpy over the same D elements in both). Compiled, the sigmoid gate stays bit for bit
(elementwise), the gated norm is compared to a tight tolerance: its per-head sum of squares is reduced in the order of
the GEMV tile's layout, not the norm kernel's, so rstd may move by an ulp and an x element by one rounding.

Fresh random inputs per seed; one row; N not a multiple of block_n (masked columns), K over one and many tiles and
off the tile (masked whole heads). Without CUDA the kernels run in Triton's interpreter; on a GPU the same cases run
compiled (``pytest -m gpu``).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.gates import sigmoid_gate_mul  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.gemv import (  # noqa: E402
    DEFAULT_CONFIG,
    gemv,
    gemv_gated_rms_norm,
    gemv_gated_rms_norm_ref,
    gemv_sigmoid_gate,
    gemv_sigmoid_gate_ref,
)
from kernels.norms import gated_rms_norm  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # on a GPU every case here runs compiled
DTYPES = [torch.float32, torch.bfloat16]
SEEDS = [0, 1]
EPS = 1e-6
# (N, H, D): N off block_n; K = H D over one tile, many tiles, and off the tile (9 heads of 128: half a 1024 tile)
SHAPES = [(37, 6, 16), (70, 4, 32), (40, 9, 128)]
# (block_n, block_k, warps, stages): gemv's one-row default, and tiles of one head of 128 (many K steps, N tails)
CONFIGS = {"default": DEFAULT_CONFIG[False], "head-tiles": (4, 128, 2, 1)}


def _dtype_id(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _weight(gen: torch.Generator, N: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """A strided weight w [N, K] (row stride K + 5)."""
    return (torch.randn(N, K + 5, generator=gen) / K**0.5).to(dtype=dtype, device=DEVICE)[:, 2 : 2 + K]


def _gdn_case(seed: int, N: int, H: int, D: int, dtype: torch.dtype):
    """o [1, H, D] float32 (the GDN kernel's output), z [1, H D] a column block of a wider row (as in the in_proj
    output), norm weight [D] around 1, w [N, H D]."""
    gen = torch.Generator().manual_seed(seed)
    o = (torch.randn(1, H, D, generator=gen) * 2).to(DEVICE)
    z = (torch.randn(1, H * D + 7, generator=gen) * 2).to(dtype=dtype, device=DEVICE)[:, 3 : 3 + H * D]
    nw = (1 + 0.3 * torch.randn(D, generator=gen)).to(dtype=dtype, device=DEVICE)
    return o, z, nw, _weight(gen, N, H * D, dtype)


def _attn_case(seed: int, N: int, H: int, D: int, dtype: torch.dtype):
    """o [1, H, D] with head stride D + 4 (a view), qkv [1, 2 H D + 2 D] (query | gate per head, then k, v), w."""
    gen = torch.Generator().manual_seed(seed)
    o = (torch.randn(1, H, D + 4, generator=gen) * 2).to(dtype=dtype, device=DEVICE)[:, :, 1 : 1 + D]
    qkv = (torch.randn(1, 2 * H * D + 2 * D, generator=gen) * 2).to(dtype=dtype, device=DEVICE)
    return o, qkv, _weight(gen, N, H * D, dtype)


def _assert_gated_norm_value(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit in the interpreter; compiled, within a rounding of a head's rstd (see module doc)."""
    if INTERPRET:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    else:
        tol = dict(atol=1e-5, rtol=1e-5) if got.dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got, want, **tol)


def _ref_tol(dtype: torch.dtype) -> dict:
    """Against the float64 reference: float32 differs by reduction order; bf16 by the roundings of x and y."""
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("N,H,D", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_gemv_gated_rms_norm(seed, N, H, D, config, dtype):
    o, z, nw, w = _gdn_case(seed, N, H, D, dtype)
    o_in, z_in = o.clone(), z.clone()
    cfg = CONFIGS[config]
    got = gemv_gated_rms_norm(o, z, nw, EPS, w, config=cfg)
    assert got.shape == (1, N) and got.dtype == dtype
    _assert_gated_norm_value(got, gemv(gated_rms_norm(o, z, nw, EPS), w, config=cfg))  # the two kernels it replaces
    torch.testing.assert_close(got, gemv_gated_rms_norm_ref(o, z, nw, EPS, w), **_ref_tol(dtype))
    assert torch.equal(o, o_in) and torch.equal(z, z_in)  # only read


def test_gemv_gated_rms_norm_refuses_tiles_off_the_heads_and_rows():
    """BLOCK_K and K must hold whole heads (the tile is reshaped to [BLOCK_K // D, D]); one row only."""
    o, z, nw, w = _gdn_case(0, 16, 4, 32, torch.float32)
    with pytest.raises(AssertionError, match="whole heads"):
        gemv_gated_rms_norm(o, z, nw, EPS, w, config=(4, 16, 2, 1))
    with pytest.raises(AssertionError, match="power of two"):
        gemv_gated_rms_norm(o[..., :24].contiguous(), z[:, :96], nw[:24], EPS, w[:, :96])
    with pytest.raises(AssertionError, match="one row"):
        gemv_gated_rms_norm(o.expand(2, -1, -1).contiguous(), z.expand(2, -1), nw, EPS, w)
    with pytest.raises(AssertionError):
        gemv_gated_rms_norm(o, z, nw, EPS, w[:, :96])  # a weight of another width


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("config", ["default", "small-tiles"])
@pytest.mark.parametrize("N,H,D", [(37, 6, 16), (70, 4, 32), (40, 5, 24)])  # D = 24: heads straddle the tiles
@pytest.mark.parametrize("seed", SEEDS)
def test_gemv_sigmoid_gate(seed, N, H, D, config, dtype):
    o, qkv, w = _attn_case(seed, N, H, D, dtype)
    cfg = {"default": DEFAULT_CONFIG[False], "small-tiles": (4, 64, 2, 1)}[config]
    got = gemv_sigmoid_gate(o, qkv, w, config=cfg)
    assert got.shape == (1, N) and got.dtype == dtype
    assert torch.equal(got, gemv(sigmoid_gate_mul(o, qkv), w, config=cfg))  # the two kernels it replaces, bit for bit
    torch.testing.assert_close(got, gemv_sigmoid_gate_ref(o, qkv, w), **_ref_tol(dtype))


def test_gemv_sigmoid_gate_refuses_a_short_qkv_and_rows():
    o, qkv, w = _attn_case(0, 16, 4, 32, torch.float32)
    with pytest.raises(AssertionError):
        gemv_sigmoid_gate(o, qkv[:, : 2 * 4 * 32 - 1], w)  # the last head's gate is missing
    with pytest.raises(AssertionError, match="one row"):
        gemv_sigmoid_gate(o.expand(2, -1, -1), qkv.expand(2, -1), w)
