"""Skinny GEMM for decode: ``y[M, N] = x[M, K] @ w[N, K]^T`` with few rows (M <= 16), float32 accumulation.

A decode step at small batch reads every weight once for one to sixteen rows: the GEMM is a weight stream, bound by
memory bandwidth, and its cost is how many bytes are in flight. One program owns ``BLOCK_N`` output columns and walks
K in ``BLOCK_K`` tiles: for M == 1 it reduces ``w_tile * x`` on the CUDA cores, for M > 1 it pads the rows to 16 and
uses ``tl.dot``. Configurations are chosen per shape by ``models/bench/gemv.py`` on the GPU (``GEMV_CONFIGS``).

``gemv_silu_mul`` is the same stream for SwiGLU's down projection with ``kernels.gates.silu_mul`` folded into its input
loads (the kernel's ``SILU_MUL``): x is never written, each program forms its x tiles from the gate|up output gu [M, 2K]
as ``silu(g) * u``, rounded to gu's dtype exactly as silu_mul stores them, so the result is gemv's bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait

MAX_ROWS = 16  # more rows than this: the GEMM is no longer a weight stream; use cuBLAS


@triton.jit
def _silu_mul_load(ptrs, K, mask, SILU_MUL: tl.constexpr):
    """The x tile at ``ptrs``: a plain load, or with SILU_MUL ``silu(g) * u`` from the gate|up row (g at ``ptrs``, u at
    ``ptrs + K``) in float32, rounded to gu's dtype as kernels.gates.silu_mul stores it; masked entries are 0."""
    if SILU_MUL:
        g = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(ptrs + K, mask=mask, other=0.0).to(tl.float32)
        return (g * tl.sigmoid(g) * u).to(ptrs.dtype.element_ty)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _gemv_tile(acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, DOT: tl.constexpr, SILU_MUL: tl.constexpr):
    """acc += x[:, k-tile] @ w_tile^T: [BLOCK_M, BLOCK_N] by tl.dot, or [BLOCK_N] on the CUDA cores for one row."""
    if DOT:
        ptrs = x_ptr + offs_m[:, None] * x_m + offs_k[None, :]
        x = _silu_mul_load(ptrs, K, mm[:, None] & mk[None, :], SILU_MUL)  # [BLOCK_M, BLOCK_K]
        return tl.dot(x, tl.trans(w), acc)
    x = _silu_mul_load(x_ptr + offs_k, K, mk, SILU_MUL).to(tl.float32)  # [BLOCK_K]
    return acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    x_m,
    w_n,
    y_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
    SILU_MUL: tl.constexpr,
    PDL: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mn = offs_n < N
    mm = offs_m < M
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * w_n  # [BLOCK_N, 1]
    offs_k = tl.arange(0, BLOCK_K)
    mk = offs_k < K
    # The first weight tile: weights are constant through the step, so under PDL it streams in while the kernel
    # before this one finishes (kernels/pdl.py); x (or gu), written by that kernel, is read only after the wait.
    w = tl.load(rows + offs_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0)  # [BLOCK_N, BLOCK_K]
    pdl_wait(PDL)
    if DOT:  # noqa: SIM108 (a static branch of the kernel)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc = _gemv_tile(acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, DOT, SILU_MUL)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < K
        w = tl.load(rows + offs_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        acc = _gemv_tile(acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, DOT, SILU_MUL)
    if DOT:
        dst = y_ptr + offs_m[:, None] * y_m + offs_n[None, :]
        tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & mn[None, :])
    else:
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mn)


# (block_n, block_k, num_warps, num_stages), from models/bench/results/gemv_h200.md (Qwen3.5-0.8B shapes, H200). The
# defaults serve a caller that forces gemv on an unlisted shape; decode_linear uses listed shapes only.
DEFAULT_CONFIG = {False: (2, 1024, 4, 3), True: (32, 128, 4, 4)}
GEMV_CONFIGS: dict[tuple[bool, int, int], tuple[int, int, int, int]] = {  # (dot, N, K) -> config
    (False, 7168, 1024): (16, 512, 4, 3),  # 4.8 vs cuBLAS 6.5 us
    (False, 1024, 3584): (2, 1024, 8, 3),  # 4.5 vs 7.9
    (False, 8224, 1024): (8, 512, 4, 3),  # 4.9 vs 7.1
    (False, 1024, 2048): (2, 1024, 4, 1),  # 2.8 vs 13.0
    (False, 5120, 1024): (8, 512, 8, 3),  # 3.9 vs 5.6
    (False, 248320, 1024): (8, 512, 4, 3),  # 121.0 vs 131.3
    (True, 7168, 1024): (64, 256, 4, 4),  # 12.3 vs 13.5 (M = 4 plus M = 16)
    (True, 8224, 1024): (64, 256, 4, 4),  # 13.4 vs 14.2
    (True, 1024, 2048): (16, 256, 4, 4),  # 10.4 vs 14.6
}
# gemv_silu_mul (SwiGLU's down GEMM with silu_mul in its loads), where it was measured against silu_mul + gemv: one
# row only (at 4 and 16 rows the folded tl.dot path measured ~30 us against ~8, so decode keeps two launches there)
SILU_MUL_CONFIGS: dict[tuple[bool, int, int], tuple[int, int, int, int]] = {
    (False, 1024, 3584): (2, 1024, 8, 1),  # 5.7 (7.6 at gemv's config)
}


def gemv_wins(rows: int, n: int, k: int) -> bool:
    """Whether the weight stream was measured faster than cuBLAS for this GEMM: a shape in ``GEMV_CONFIGS`` for its
    path (one row, or 2-16 rows). Shapes never benchmarked (another model's) stay on cuBLAS."""
    return 1 <= rows <= MAX_ROWS and (rows > 1, n, k) in GEMV_CONFIGS


def silu_mul_fold_wins(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv_silu_mul`` was measured faster than silu_mul + gemv for this down GEMM (``SILU_MUL_CONFIGS``)."""
    return 1 <= rows <= MAX_ROWS and (rows > 1, n, k) in SILU_MUL_CONFIGS


def gemv(
    x: torch.Tensor,  # [M, K], M <= 16, unit column stride
    w: torch.Tensor,  # [N, K], unit column stride
    out: torch.Tensor | None = None,  # [M, N] contiguous, x's dtype unless given
    config: tuple[int, int, int, int] | None = None,  # (block_n, block_k, num_warps, num_stages)
) -> torch.Tensor:
    """x @ w^T for a few rows, as one weight stream. See module doc. Under PDL the first tile of ``w`` is read before
    the kernel waits for the one before it: ``w`` must be a weight, never something an earlier kernel of the step
    writes."""
    M, K = x.shape
    N = w.shape[0]
    assert w.shape == (N, K) and x.stride(-1) == 1 and w.stride(-1) == 1, (x.shape, w.shape)
    return _launch(x, w, out, config, M, N, K, silu_mul=False)


def gemv_silu_mul(
    gu: torch.Tensor,  # [M, 2K], the gate|up GEMM output, M <= 16, unit column stride
    w: torch.Tensor,  # [N, K], the down projection, unit column stride
    out: torch.Tensor | None = None,  # [M, N] contiguous, gu's dtype unless given
    config: tuple[int, int, int, int] | None = None,  # (block_n, block_k, num_warps, num_stages)
) -> torch.Tensor:
    """(silu(gu[:, :K]) * gu[:, K:]) @ w^T, bit for bit ``gemv(kernels.gates.silu_mul(gu), w)``, in one launch."""
    M, two_k = gu.shape
    N, K = w.shape
    assert two_k == 2 * K and gu.stride(-1) == 1 and w.stride(-1) == 1, (gu.shape, w.shape)
    return _launch(gu, w, out, config, M, N, K, silu_mul=True)


def _launch(x, w, out, config, M: int, N: int, K: int, silu_mul: bool) -> torch.Tensor:
    """Run _gemv_kernel over ``x`` ([M, K], or with ``silu_mul`` gu [M, 2K]) and ``w`` [N, K] into ``out``."""
    assert M <= MAX_ROWS, f"gemv serves <= {MAX_ROWS} rows, got {M}"
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    assert out.shape == (M, N) and out.is_contiguous()
    if M == 0:
        return out
    dot = M > 1
    table = SILU_MUL_CONFIGS if silu_mul else GEMV_CONFIGS
    block_n, block_k, warps, stages = config or table.get((dot, N, K), DEFAULT_CONFIG[dot])
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=16 if dot else 1, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot, SILU_MUL=silu_mul,
        num_warps=warps, num_stages=stages, **launch_options(),
    )  # fmt: skip
    return out
