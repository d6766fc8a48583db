"""Skinny GEMM for decode: ``y[M, N] = x[M, K] @ w[N, K]^T`` with few rows (M <= 64), float32 accumulation.

A decode step reads every weight once for its one to sixty-four rows: the GEMM is a weight stream, bound by memory
bandwidth, and its cost is how many bytes are in flight. One program owns ``BLOCK_N`` output columns and walks K in
``BLOCK_K`` tiles: for M == 1 it reduces ``w_tile * x`` on the CUDA cores, for M > 1 it pads the rows to the row tile
(``tile_rows``: 16, 32 or 64) and uses ``tl.dot``. Configurations are chosen per row tile and shape by
``models/bench/gemv.py`` on the GPU (``GEMV_CONFIGS``, keyed by (row tile, N, K)).

Split K (a configuration's optional fifth entry, SPLIT): where N is small against K (the out projections and the MLP's
down projection: 1024 columns, K up to 3584) one program per column block walks a long K serially and the grid is
small. With SPLIT > 1 the grid is (column blocks, SPLIT): each program walks a run of whole K tiles, stores its float32
partial in the stream's workspace (``split_workspace``) and counts itself done on the column block's counter; the
last to finish sums the SPLIT partials in split order, stores y and resets the counter to 0. The order of the sum
never depends on which program finished last, so the result is deterministic (not gemv's bits at SPLIT = 1: another
order of float32 adds).

SWAP (a configuration's optional sixth entry, after SPLIT): at 16-64 rows the dot takes the weight tile as its first
operand, acc^T += w_tile @ x^T ([BLOCK_N, BLOCK_M], transposed once before the store), so that a dot of 64 or more
weight rows by the input's 16-64 runs on sm_90's wide MMA. On an H100 it was 6-8% faster a call at 16 rows on four
of the 0.8B shapes and no faster at 64 (models/bench/results/gemv-search/swap-h100/).

``gemv_silu_mul`` is the same stream for SwiGLU's down projection with ``kernels.gates.silu_mul`` folded into its input
loads (the kernel's ``SILU_MUL``): x is never written, each program forms its x tiles from the gate|up output gu [M, 2K]
as ``silu(g) * u``, rounded to gu's dtype exactly as silu_mul stores them, so the result is gemv's bit for bit.

``gemv_add_rms_norm`` is the one-row stream with the pre-norm before it (``kernels.norms.add_rms_norm_``) folded in (the
kernel's ``NORM``): every program loads the whole residual row, forms s = round(h + delta) and its rstd as the norm
kernel does, program 0 stores s into a second residual buffer (not h: the other programs still read h), and each x tile
is round(s * rstd * (1 + nw)). Same operations as add_rms_norm_ then gemv: bit for bit in the interpreter. Compiled,
the row's float32 sum of squares is reduced in the order of its layout, which follows the warp count: at the norm
kernel's 4 warps the layouts agree (by the sm_90 TTGIR, K = 1024 bf16), at another count rstd may move by an ulp and
an x element by one rounding. The residual s is bit for bit either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fence import release_fence
from kernels.pdl import launch_options, pdl_wait
from kernels.runtime import interpreted, stream_workspace

MAX_ROWS = 64  # more rows than this: the GEMM is no longer a weight stream; use cuBLAS
ROW_TILES = (1, 16, 32, 64)  # the rows a program's tile holds (1: the CUDA cores; else tl.dot, padded)


def tile_rows(rows: int) -> int:
    """The row tile a GEMM of ``rows`` rows (1..MAX_ROWS) runs in: the smallest of ROW_TILES that holds them."""
    return next(t for t in ROW_TILES if rows <= t)


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
def _residual_load(h_ptr, d_ptr, offs, mask, HAS_DELTA: tl.constexpr):
    """s = h + delta at ``offs`` of one row, rounded to h's dtype as kernels.norms.add_rms_norm_ stores it (h alone
    without delta); masked entries are 0."""
    h = tl.load(h_ptr + offs, mask=mask, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + offs, mask=mask, other=0.0)
        h = (h.to(tl.float32) + d.to(tl.float32)).to(h_ptr.dtype.element_ty)
    return h


@triton.jit
def _normed_load(h_ptr, d_ptr, nw_ptr, offs, mask, rstd, HAS_DELTA: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """The NORM x tile at ``offs``: round(s * rstd * (1 + nw)) (or * nw), as add_rms_norm_ stores its output."""
    s = _residual_load(h_ptr, d_ptr, offs, mask, HAS_DELTA).to(tl.float32)
    nw = tl.load(nw_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        nw = nw + 1.0
    return (s * rstd * nw).to(h_ptr.dtype.element_ty)


@triton.jit
def _gemv_tile(
    acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, d_ptr, nw_ptr, rstd,
    DOT: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr, HAS_DELTA: tl.constexpr,
    ZERO_CENTERED: tl.constexpr, SWAP: tl.constexpr = False,
):  # fmt: skip
    """acc += x[:, k-tile] @ w_tile^T: [BLOCK_M, BLOCK_N] by tl.dot (SWAP: acc^T += w_tile @ x^T, [BLOCK_N, BLOCK_M],
    the weight the dot's wide operand), or [BLOCK_N] on the CUDA cores for one row (where NORM forms the x tile from
    the residual row, ``delta`` and the norm weight)."""
    if DOT:
        ptrs = x_ptr + offs_m[:, None] * x_m + offs_k[None, :]
        x = _silu_mul_load(ptrs, K, mm[:, None] & mk[None, :], SILU_MUL)  # [BLOCK_M, BLOCK_K]
        if SWAP:  # noqa: SIM108 (a static branch of the kernel)
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    else:  # (no early return above: the compiler would build the code after it for the DOT case too)
        if NORM:
            x = _normed_load(x_ptr, d_ptr, nw_ptr, offs_k, mk, rstd, HAS_DELTA, ZERO_CENTERED).to(tl.float32)
        else:
            x = _silu_mul_load(x_ptr + offs_k, K, mk, SILU_MUL).to(tl.float32)  # [BLOCK_K]
        acc = acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    return acc


@triton.jit
def _split_reduce(acc, part_ptr, count_ptr, N, offs_m, offs_n, mm, mn,
                  BLOCK_M: tl.constexpr, SPLIT: tl.constexpr, DOT: tl.constexpr, FENCE: tl.constexpr):  # fmt: skip
    """Store this split's partial ``acc`` and count it; return (the sum of the column block's SPLIT partials in split
    order, True) in its last split to finish, else (zeros, False). The order of the sum never depends on which split
    finished last, so the result is deterministic. The last split sets the count back to 0 for the next launch."""
    split = tl.program_id(1)
    if DOT:
        tl.store(part_ptr + (split * BLOCK_M + offs_m[:, None]) * N + offs_n[None, :], acc,
                 mask=mm[:, None] & mn[None, :])  # fmt: skip
    else:
        tl.store(part_ptr + split * N + offs_n, acc, mask=mn)
    if FENCE:  # the asm's value is never stored (no lane passes the mask); the store keeps the fence in place
        f = release_fence(offs_n)
        tl.store(count_ptr + offs_n, f, mask=f < 0)
    tl.debug_barrier()  # every thread's partial stored (and fenced) before the count
    done = tl.atomic_add(count_ptr + tl.program_id(0), 1, sem="acq_rel")
    last = done == SPLIT - 1
    total = tl.zeros_like(acc)
    if last:
        for s in tl.static_range(SPLIT):  # .cg: from L2, where the other splits' partials are
            if DOT:
                total += tl.load(part_ptr + (s * BLOCK_M + offs_m[:, None]) * N + offs_n[None, :],
                                 mask=mm[:, None] & mn[None, :], other=0.0, cache_modifier=".cg")  # fmt: skip
            else:
                total += tl.load(part_ptr + s * N + offs_n, mask=mn, other=0.0, cache_modifier=".cg")
        tl.store(count_ptr + tl.program_id(0), 0)
    return total, last


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
    d_ptr,  # NORM: delta [1, K]
    nw_ptr,  # NORM: the norm weight [K]
    ho_ptr,  # NORM: where program 0 stores s = round(h + delta) [1, K]
    eps,
    part_ptr,  # SPLIT > 1: float32 partial sums [SPLIT, BLOCK_M, N]
    count_ptr,  # SPLIT > 1: int32 [cdiv(N, BLOCK_N)], zero between launches: the splits done per column block
    k_split,  # SPLIT > 1: the K elements of one split, a multiple of BLOCK_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    NORM_BLOCK: tl.constexpr,  # NORM: next_power_of_2(K), the whole row
    SPLIT: tl.constexpr,  # programs along K per column block (program_id(1)); 1: no split
    FENCE: tl.constexpr,  # SPLIT > 1, compiled: each thread's partial stored GPU-wide before the count
    PDL: tl.constexpr,
    SWAP: tl.constexpr = False,  # DOT: the weight tile as the dot's first operand (module doc)
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mn = offs_n < N
    mm = offs_m < M
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * w_n  # [BLOCK_N, 1]
    if SPLIT > 1:  # this program's K range: [k_begin, k_end)
        k_begin = tl.program_id(1) * k_split
        k_end = tl.minimum(k_begin + k_split, K)
    else:
        k_begin = 0
        k_end = K
    offs_k = k_begin + tl.arange(0, BLOCK_K)
    mk = offs_k < k_end
    # The first weight tile: weights are constant through the step, so under PDL it streams in while the kernel
    # before this one finishes (kernels/pdl.py); x (or gu), written by that kernel, is read only after the wait.
    w = tl.load(rows + offs_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0)  # [BLOCK_N, BLOCK_K]
    pdl_wait(PDL)
    if NORM:  # one row: s = round(h + delta) and its rstd, as kernels.norms.add_rms_norm_ computes them
        tl.static_assert(not DOT, "NORM serves one row")
        offs = tl.arange(0, NORM_BLOCK)
        mr = offs < K
        s = _residual_load(x_ptr, d_ptr, offs, mr, HAS_DELTA)
        sf = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / K + eps)
        # program 0 stores the updated residual (a mask at block shape: the interpreter refuses a scalar one)
        tl.store(ho_ptr + offs, s, mask=mr & ((offs * 0 + tl.program_id(0)) == 0))
    else:
        rstd = 0.0
    if DOT:
        if SWAP:  # noqa: SIM108 (a static branch of the kernel)
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc = _gemv_tile(acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, d_ptr, nw_ptr, rstd,
                     DOT, SILU_MUL, NORM, HAS_DELTA, ZERO_CENTERED, SWAP)  # fmt: skip
    for k0 in range(k_begin + BLOCK_K, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < k_end
        w = tl.load(rows + offs_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        acc = _gemv_tile(acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, d_ptr, nw_ptr, rstd,
                         DOT, SILU_MUL, NORM, HAS_DELTA, ZERO_CENTERED, SWAP)  # fmt: skip
    if DOT:  # noqa: SIM102 (one static branch a constexpr, as above)
        if SWAP:
            acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    if SPLIT > 1:  # the column block's last split to finish sums every split's partial, in split order
        acc, last = _split_reduce(acc, part_ptr, count_ptr, N, offs_m, offs_n, mm, mn, BLOCK_M, SPLIT, DOT, FENCE)
        mm = mm & last
        mn = mn & last
    if DOT:
        dst = y_ptr + offs_m[:, None] * y_m + offs_n[None, :]
        tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & mn[None, :])
    else:
        tl.store(y_ptr + offs_n, acc.to(y_ptr.dtype.element_ty), mask=mn)


# (block_n, block_k, num_warps, num_stages[, split]), from models/bench/results/gemv_h100.md (Qwen3.5-0.8B shapes, on an
# H100: the H200's table, gemv_h200.md, searched tiles of at most 1024 K elements and no split) and gemv_2b_h200.md
# (Qwen3.5-2B). The defaults serve a caller that forces gemv on an unlisted shape; decode_linear uses listed shapes
# only.
DEFAULT_CONFIG = {1: (2, 1024, 4, 3), 16: (32, 128, 4, 4), 32: (32, 64, 4, 3), 64: (32, 64, 4, 3)}  # (fit float32)
GEMV_CONFIGS: dict[tuple[int, int, int], tuple[int, ...]] = {  # (row tile, N, K) -> config
    (1, 7168, 1024): (16, 512, 8, 1),  # 6.0 vs cuBLAS 7.9 us
    (1, 1024, 3584): (1, 2048, 8, 1),  # 3.7 vs 8.0
    (1, 8224, 1024): (16, 512, 4, 1),  # 6.3 vs 8.4
    (1, 1024, 2048): (2, 2048, 8, 1),  # 2.8 vs 5.8
    (1, 5120, 1024): (8, 512, 8, 3),  # 4.8 vs 6.4
    (1, 248320, 1024): (4, 512, 4, 1),  # 165.9 vs 181.9
    # 2-16 rows: the SWAP sweep at 16 rows (gemv-search/swap-h100/, an H100), us a call vs cuBLAS
    (16, 7168, 1024): (64, 256, 4, 3, 1, 1),  # 6.7 vs 8.0 (the input first in tl.dot: 7.2)
    (16, 1024, 3584): (64, 256, 4, 2, 8, 1),  # 5.9 vs 7.6 (6.4)
    (16, 8224, 1024): (64, 256, 4, 3, 1, 1),  # 7.1 vs 8.8 (7.7)
    (16, 1024, 2048): (32, 256, 4, 1, 8),  # 4.5 vs 5.8 (SWAP 4.6)
    (16, 5120, 1024): (64, 256, 4, 3, 1, 1),  # 5.9 vs 6.7 (6.3)
    (16, 248320, 1024): (64, 128, 4, 2),  # 177.3 vs 187.7
    # 17-32 rows, from models/bench/results/gemv_wide_h200.md (an H200; cuBLAS as fast at the other shapes)
    (32, 1024, 3584): (64, 256, 8, 1, 8),  # 6.7 vs 8.2
    (32, 1024, 2048): (32, 256, 8, 1, 8),  # 4.5 vs 6.1
    # 33-64 rows: gemv_wide_h200.md, and the SWAP sweep at 64 rows (an H100: no SWAP pick; two shapes leave cuBLAS)
    (64, 7168, 1024): (64, 128, 4, 4),  # 6.5 vs 7.2 (H100: 7.5 vs 8.3)
    (64, 8224, 1024): (64, 128, 4, 4),  # 6.8 vs 7.5 (H100: 8.2 vs 9.1)
    (64, 5120, 1024): (64, 128, 4, 4),  # H100: 6.5 vs 6.9 (the H200 search: 5.9 vs 5.9)
    (64, 1024, 3584): (32, 128, 4, 4, 4),  # H100: 7.3 vs 7.9 (the H200 search, no staged split: 9.1 vs 8.5)
    # Qwen3.5-2B, from models/bench/results/gemv_2b_h200.md (an H200, rows 1 and 16; 4-16 rows: where Triton won at 16)
    (1, 12288, 2048): (8, 1024, 4, 1),  # 12.8 vs 15.5
    (1, 2048, 6144): (2, 2048, 8, 1),  # 6.7 vs 11.9
    (1, 8224, 2048): (4, 1024, 4, 3),  # 8.9 vs 11.2
    (1, 2048, 2048): (2, 1024, 4, 1),  # 3.4 vs 6.2
    (1, 5120, 2048): (4, 1024, 4, 3),  # 5.8 vs 8.2
    (1, 248320, 2048): (2, 1024, 4, 3),  # 223.3 vs 238.2
    (16, 8224, 2048): (64, 256, 4, 4),  # 10.5 vs 11.4
}
# gemv_silu_mul (SwiGLU's down GEMM with silu_mul in its loads), where it was measured against silu_mul + gemv: one
# row only (at 4 and 16 rows the folded tl.dot path measured 11.3-11.6 us against 7.3, so decode keeps two launches)
SILU_MUL_CONFIGS: dict[tuple[int, int, int], tuple[int, ...]] = {
    (1, 1024, 3584): (2, 4096, 8, 1),  # 4.3 (silu_mul + gemv 4.6; fused at gemv's config 5.8)
}
# gemv_add_rms_norm (a GEMM with the pre-norm before it in its loads), one row only: the GDN in_proj, the MLP gate|up
# and the attention qkv GEMMs, from `python -m models.bench.gemv --parts norm` on an H100
# (models/bench/results/decode-floor-h200/fold-search-h100/): us a call, the fold vs add_rms_norm_ + the faster of
# gemv and cuBLAS. Not the lm_head (248320 columns: its ~31k programs would each re-read the row)
NORM_CONFIGS: dict[tuple[int, int, int], tuple[int, int, int, int]] = {
    (1, 8224, 1024): (8, 512, 4, 3),  # 7.0 vs 7.2
    (1, 7168, 1024): (16, 512, 8, 3),  # 6.3 vs 6.6 (8 warps: rstd may be reduced in another order, module doc)
    (1, 5120, 1024): (8, 1024, 4, 1),  # 4.9 vs 5.2
    # Qwen3.5-2B
    (1, 8224, 2048): (2, 1024, 4, 1),  # 13.3 vs 13.5
    (1, 12288, 2048): (2, 1024, 4, 3),  # 18.6 vs 19.5
    (1, 5120, 2048): (8, 512, 8, 1),  # 8.9 vs 9.2
}


def _listed(table: dict, rows: int, n: int, k: int) -> bool:
    """The GEMM of ``rows`` rows is in ``table`` for its row tile (``tile_rows``)."""
    return 1 <= rows <= MAX_ROWS and (tile_rows(rows), n, k) in table


def gemv_wins(rows: int, n: int, k: int) -> bool:
    """Whether the weight stream was measured faster than cuBLAS for this GEMM: a shape in ``GEMV_CONFIGS`` for its
    row tile (1, 2-16, 17-32 or 33-64 rows). Shapes never benchmarked (another model's) stay on cuBLAS."""
    return _listed(GEMV_CONFIGS, rows, n, k)


def silu_mul_fold_wins(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv_silu_mul`` was measured faster than silu_mul + gemv for this down GEMM (``SILU_MUL_CONFIGS``)."""
    return _listed(SILU_MUL_CONFIGS, rows, n, k)


def norm_fold_wins(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv_add_rms_norm`` serves this GEMM: one row (the table lists one-row shapes only), in
    ``NORM_CONFIGS``."""
    return _listed(NORM_CONFIGS, rows, n, k)


def gemv(
    x: torch.Tensor,  # [M, K], M <= 64, unit column stride
    w: torch.Tensor,  # [N, K], unit column stride
    out: torch.Tensor | None = None,  # [M, N] contiguous, x's dtype unless given
    config: tuple[int, ...] | None = None,  # (block_n, block_k, num_warps, num_stages[, split])
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """x @ w^T for a few rows, as one weight stream. See module doc. Under PDL the first tile of ``w`` is read before
    the kernel waits for the one before it: ``w`` must be a weight, never something an earlier kernel of the step
    writes."""
    M, K = x.shape
    N = w.shape[0]
    assert w.shape == (N, K) and x.stride(-1) == 1 and w.stride(-1) == 1, (x.shape, w.shape)
    return _launch(x, w, out, config, M, N, K, pdl=pdl)


def gemv_silu_mul(
    gu: torch.Tensor,  # [M, 2K], the gate|up GEMM output, M <= 64, unit column stride
    w: torch.Tensor,  # [N, K], the down projection, unit column stride
    out: torch.Tensor | None = None,  # [M, N] contiguous, gu's dtype unless given
    config: tuple[int, ...] | None = None,  # (block_n, block_k, num_warps, num_stages[, split])
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """(silu(gu[:, :K]) * gu[:, K:]) @ w^T, bit for bit ``gemv(kernels.gates.silu_mul(gu), w)``, in one launch."""
    M, two_k = gu.shape
    N, K = w.shape
    assert two_k == 2 * K and gu.stride(-1) == 1 and w.stride(-1) == 1, (gu.shape, w.shape)
    return _launch(gu, w, out, config, M, N, K, silu_mul=True, pdl=pdl)


def gemv_add_rms_norm(
    h_in: torch.Tensor,  # [1, K], the residual stream before this norm; only read
    delta: torch.Tensor | None,  # [1, K], the last sublayer's output, or None
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    w: torch.Tensor,  # [N, K], unit column stride
    h_out: torch.Tensor,  # [1, K], h_in's dtype, not h_in's memory: receives round(h_in + delta)
    out: torch.Tensor | None = None,  # [1, N] contiguous, h_in's dtype unless given
    config: tuple[int, int, int, int] | None = None,  # (block_n, block_k, num_warps, num_stages)
    zero_centered: bool = True,
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """h_out = s = round(h_in + delta); y = round(s * rsqrt(mean(s^2) + eps) * (1 + nw)) @ w^T, in one launch: the
    value of ``gemv(add_rms_norm_(h, delta, nw, eps), w)`` with ``h`` updated into h_out instead of in place."""
    M, K = h_in.shape
    N = w.shape[0]
    assert M == 1, f"gemv_add_rms_norm serves one row, got {M}"
    assert w.shape == (N, K) and h_in.stride(-1) == 1 and w.stride(-1) == 1, (h_in.shape, w.shape)
    assert norm_weight.shape == (K,) and norm_weight.stride(0) == 1, norm_weight.shape
    assert h_out.shape == (1, K) and h_out.stride(-1) == 1 and h_out.dtype == h_in.dtype, (h_out.shape, h_out.dtype)
    # every program reads the whole row of h_in (and delta) while program 0 writes h_out: they must not share memory
    assert h_out.data_ptr() != h_in.data_ptr(), "h_out must be another buffer than h_in"
    if delta is not None:
        assert delta.shape == (1, K) and delta.stride(-1) == 1, (delta.shape, h_in.shape)
        assert h_out.data_ptr() != delta.data_ptr(), "h_out must be another buffer than delta"
    norm = (h_in if delta is None else delta, norm_weight, h_out, float(eps), zero_centered, delta is not None)
    return _launch(h_in, w, out, config, M, N, K, norm=norm, pdl=pdl)


SPLIT_PARTS = 1 << 20  # float32 partial sums a split-K workspace holds (4 MiB): splits x row tile x N
SPLIT_COUNTS = 1 << 12  # column blocks a split-K workspace counts


def _split_parts(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials [SPLIT_PARTS] float32, counts [SPLIT_COUNTS] int32 at zero (each launch's last splits set their counts
    back to 0)."""
    return (torch.empty(SPLIT_PARTS, dtype=torch.float32, device=device),
            torch.zeros(SPLIT_COUNTS, dtype=torch.int32, device=device))  # fmt: skip


_workspace = stream_workspace("split-K workspace", _split_parts)  # (kernels.runtime: one a stream, made before capture)


def split_workspace(device: torch.device, parts: int, counts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The current stream's split-K workspace (partials, counts), checked to hold ``parts`` and ``counts``."""
    assert parts <= SPLIT_PARTS and counts <= SPLIT_COUNTS, (parts, counts)
    return _workspace(device)


def _launch(x, w, out, config, M: int, N: int, K: int, silu_mul: bool = False, norm: tuple | None = None,
            pdl: bool | None = None):
    """Run _gemv_kernel over ``x`` ([M, K], or with ``silu_mul`` gu [M, 2K]) and ``w`` [N, K] into ``out``; ``norm``:
    (delta, norm weight, h_out, eps, zero_centered, has_delta) of gemv_add_rms_norm, x being its h_in."""
    assert M <= MAX_ROWS, f"gemv serves <= {MAX_ROWS} rows, got {M}"
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    assert out.shape == (M, N) and out.is_contiguous()
    if M == 0:
        return out
    tile = tile_rows(M)
    table = NORM_CONFIGS if norm else SILU_MUL_CONFIGS if silu_mul else GEMV_CONFIGS
    block_n, block_k, warps, stages, *rest = config or table.get((tile, N, K), DEFAULT_CONFIG[tile])
    tiles = triton.cdiv(K, block_k)
    swap = len(rest) > 1 and bool(rest[1])  # (a sixth entry: the weight tile as the dot's first operand)
    per_split = triton.cdiv(tiles, rest[0] if rest else 1)  # K tiles a split: at most the config's split count,
    split = triton.cdiv(tiles, per_split)  # none of them empty
    assert split == 1 or norm is None, "gemv_add_rms_norm does not split K"
    d, nw, h_out, eps, zero_centered, has_delta = norm or (x, x, x, 0.0, False, False)
    blocks = triton.cdiv(N, block_n)
    k_split = per_split * block_k
    parts, counts = split_workspace(x.device, split * tile * N, blocks) if split > 1 else (out, out)
    _gemv_kernel[(blocks, split)](
        x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0), d, nw, h_out, eps, parts, counts, k_split,
        BLOCK_M=tile, BLOCK_N=block_n, BLOCK_K=block_k, DOT=tile > 1, SILU_MUL=silu_mul, NORM=norm is not None,
        HAS_DELTA=has_delta, ZERO_CENTERED=zero_centered, NORM_BLOCK=triton.next_power_of_2(K) if norm else 1,
        SPLIT=split, FENCE=split > 1 and not interpreted(), SWAP=swap and tile > 1, num_warps=warps,
        num_stages=stages, **launch_options(pdl),
    )  # fmt: skip
    return out
