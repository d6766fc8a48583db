"""The attention's sigmoid gate folded into o_proj's weight stream (kernels.gemv.gemv_sigmoid_gate) against the
two-step form it replaces (kernels.gates.sigmoid_gate_mul then kernels.gemv.gemv: equal bit for bit) and a float64
torch reference.

Fresh random inputs per case; widths off the tiles (masked tails in N and K, a head width that is not a power of two);
the gates in a qkv row wider than the query | gate blocks (the K and V columns after them). Without CUDA the kernels
run in Triton's interpreter (float32 and bf16); on a GPU the same cases run compiled (``pytest -m gpu``).
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.choices import DEFAULT, KernelChoices  # noqa: E402  (after TRITON_INTERPRET is settled)
from kernels.gates import sigmoid_gate_mul  # noqa: E402
from kernels.gemv import DEFAULT_CONFIG, gemv, gemv_sigmoid_gate, gemv_sigmoid_gate_ref, tile_rows  # noqa: E402
from models.layers.fused import decode_gated_linear, decode_linear  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # on a GPU every case here runs compiled
DTYPES = [torch.float32, torch.bfloat16]
SMALL = {1: (4, 64, 2, 1), 16: (16, 64, 2, 1), 32: (16, 64, 2, 1), 64: (16, 64, 2, 1)}  # many K steps, N tails
CONFIGS = {"default": DEFAULT_CONFIG, "small-tiles": SMALL}


def _case(M: int, N: int, H: int, D: int, dtype: torch.dtype, *case):
    """o [M, H, D], qkv [M, 2 H D + 3 D] (query | gate per head, then K and V columns), w [N, H D] strided."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr((M, N, H, D, dtype) + case).encode()))
    o = torch.randn(M, H, D, generator=gen).to(dtype=dtype, device=DEVICE)
    qkv = (torch.randn(M, 2 * H * D + 3 * D, generator=gen) * 3).to(dtype=dtype, device=DEVICE)
    w = (torch.randn(N, H * D + 5, generator=gen) / (H * D) ** 0.5).to(dtype=dtype, device=DEVICE)[:, 2 : 2 + H * D]
    return o, qkv, w


def _check_ref(got, o, qkv, w, D) -> None:
    """Within the dtype's tolerance of the float64 value (float32: accumulation order, TF32 in a compiled tl.dot;
    bf16: roundings). Not in the interpreter for bf16 with tl.dot: it multiplies bf16 bit patterns
    (triton-lang/triton#11584); the bit-for-bit comparison with the two steps still runs there."""
    M, dtype = got.shape[0], got.dtype
    if INTERPRET and dtype == torch.bfloat16 and M > 1:
        return
    loose = dtype == torch.bfloat16 or (DEVICE == "cuda" and M > 1)
    tol = dict(atol=2e-2, rtol=2e-2) if loose else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, gemv_sigmoid_gate_ref(o.reshape(M, -1), qkv, w, D), **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("N,H,D", [(37, 2, 24), (70, 3, 40), (64, 2, 128)])
@pytest.mark.parametrize("M", [1, 3, 16])
def test_gemv_sigmoid_gate(M, N, H, D, config, dtype):
    o, qkv, w = _case(M, N, H, D, dtype, config)
    cfg = CONFIGS[config][tile_rows(M)]
    out = torch.full((M, N), float("nan"), dtype=dtype, device=DEVICE)
    got = gemv_sigmoid_gate(o.view(M, H * D), qkv, w, D, out=out, config=cfg)
    assert got is out
    assert torch.equal(got, gemv(sigmoid_gate_mul(o, qkv), w, config=cfg))  # the two kernels it replaces
    _check_ref(got, o, qkv, w, D)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("M", [1, 3])
def test_gemv_sigmoid_gate_split_k(M, dtype):
    """With K split over 3 programs a column block: still the two-step value at the same config, bit for bit."""
    o, qkv, w = _case(M, 70, 5, 60, dtype, "split")
    cfg = (16 if M > 1 else 4, 64, 2, 1, 3)
    got = gemv_sigmoid_gate(o.view(M, -1), qkv, w, 60, config=cfg)
    assert torch.equal(got, gemv(sigmoid_gate_mul(o, qkv), w, config=cfg))
    _check_ref(got, o, qkv, w, 60)


@pytest.mark.parametrize("fold", [True, False], ids=["fold", "no-fold"])
@pytest.mark.parametrize("M", [1, 16])
def test_decode_gated_linear_is_the_two_step_value(M, fold):
    """The dispatch, at the 0.8B o_proj shape (1024 x 2048, heads of 256; GATE_CONFIGS lists one row): whichever path
    it takes, its value is decode_linear(sigmoid_gate_mul(o, qkv), w) exactly."""
    o, qkv, w = _case(M, 1024, 8, 256, torch.float32, "dispatch")
    kc = KernelChoices(fold_gate=fold)
    assert kc.folds_gate(M, 1024, 2048) == (fold and M == 1)
    assert torch.equal(decode_gated_linear(o, qkv, w, kc), decode_linear(sigmoid_gate_mul(o, qkv), w, DEFAULT))
