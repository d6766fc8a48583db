"""Skinny GEMM for decode: ``y[M, N] = x[M, K] @ w[N, K]^T`` with few rows (M <= 16), float32 accumulation.

A decode step at small batch reads every weight once for one to sixteen rows: the GEMM is a weight stream, bound by
memory bandwidth, and its cost is how many bytes are in flight. One program owns ``BLOCK_N`` output columns and walks
K in ``BLOCK_K`` tiles: for M == 1 it reduces ``w_tile * x`` on the CUDA cores, for M > 1 it pads the rows to 16 and
uses ``tl.dot``. Configurations are chosen per shape by ``models/bench/gemv.py`` on the GPU (``GEMV_CONFIGS``).

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

A one-row stream may also carry the GDN layer's causal conv in its epilogue (``conv=``, the kernel's ``CONV``): the
program that owns output column n < C (a conv channel) rounds y[n] as it stores it, shifts it into that channel's
conv state in ``conv_pool[slots[0]]`` and writes silu(conv) to ``conv_out[0, n]``, exactly as
``kernels.gdn_decode.conv1d_decode_step_`` does from the stored y. Each channel has one owner, so no program reads
a state another writes; one launch fewer a GDN layer.

``gemv_gated_rms_norm`` is the one-row stream with the GDN output norm before it (``kernels.norms.gated_rms_norm``)
folded in (the kernel's ``GATED_NORM``): the norm is per head of width D, and BLOCK_K is a multiple of D, so each x
tile holds whole heads; it is reshaped to [BLOCK_K // D, D], each head's rstd reduced within the tile, and formed with
gated_rms_norm's operations and roundings. In the interpreter the value is ``gemv(gated_rms_norm(o, z, nw), w)`` bit
for bit; compiled, a head's sum of squares is reduced in the order of the tile's layout, not the norm kernel's, so
rstd may move by an ulp (as for NORM).

``gemv_sigmoid_gate`` is the one-row stream with attention's output gate (``kernels.gates.sigmoid_gate_mul``) folded in
(the kernel's ``SIGMOID_GATE``): x = round(o * sigmoid(gate)), the gate of head h read beside its query in the qkv
output. Elementwise, no reduction: bit for bit ``gemv(sigmoid_gate_mul(o, qkv), w)``, compiled or interpreted.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait

MAX_ROWS = 16  # more rows than this: the GEMM is no longer a weight stream; use cuBLAS


class ConvStep(NamedTuple):
    """The conv step a one-row stream runs in its epilogue (module doc): on ``pool[slots[0]]`` with ``weight``, into
    ``out``; the GEMM's first C = weight.shape[0] output columns are its input."""

    pool: torch.Tensor  # [slots, C, KW], updated in place
    slots: torch.Tensor  # [1] int, the row's recurrent slot
    weight: torch.Tensor  # [C, KW]
    out: torch.Tensor  # [1, C], silu(conv), unit column stride


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
def _head_gate_load(
    o_ptr, g_ptr, nw_ptr, offs, mask, o_h, eps,
    GATED_NORM: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The x tile at ``offs`` (flat h * D + d over one row's heads) from o [H, D] (head stride ``o_h``): with GATED_NORM
    round(round(nw * round(o_hat)) * silu(z)), o_hat = round(o) * rsqrt(mean_d(round(o)^2) + eps) per head, rounded to
    nw's dtype as kernels.norms.gated_rms_norm stores it (z [H * D] at ``g_ptr``, nw [D]); else round(o * sigmoid(gate))
    in o's dtype as kernels.gates.sigmoid_gate_mul stores it (head h's gate at ``g_ptr + h * 2D + D``). Masked: 0."""
    h = offs // HEAD_D
    d = offs % HEAD_D
    o = tl.load(o_ptr + h * o_h + d, mask=mask, other=0.0)  # [BLOCK_K]
    if GATED_NORM:  # BLOCK_K % D == 0, K % D == 0: the tile holds whole heads, masked ones whole (their x is 0)
        dt = nw_ptr.dtype.element_ty
        x = tl.reshape(o.to(dt).to(tl.float32), [BLOCK_K // HEAD_D, HEAD_D])
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_D + eps)  # [BLOCK_K // D]
        nw = tl.load(nw_ptr + tl.arange(0, HEAD_D)).to(tl.float32)[None, :]
        y = (nw * (x * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        z = tl.reshape(tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32), [BLOCK_K // HEAD_D, HEAD_D])
        x = tl.reshape((y * z * tl.sigmoid(z)).to(dt), [BLOCK_K])
    else:  # one return: compiled, the returns of both static branches must agree in type (o and nw's dtypes differ)
        gate = tl.load(g_ptr + h * 2 * HEAD_D + HEAD_D + d, mask=mask, other=0.0).to(tl.float32)
        x = (o.to(tl.float32) * tl.sigmoid(gate)).to(o_ptr.dtype.element_ty)
    return x


@triton.jit
def _gemv_tile(
    acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, d_ptr, nw_ptr, rstd, x_h, eps,
    DOT: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr, HAS_DELTA: tl.constexpr,
    ZERO_CENTERED: tl.constexpr, GATED_NORM: tl.constexpr, SIGMOID_GATE: tl.constexpr, HEAD_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """acc += x[:, k-tile] @ w_tile^T: [BLOCK_M, BLOCK_N] by tl.dot, or [BLOCK_N] on the CUDA cores for one row (where
    NORM forms the x tile from the residual row, ``delta`` and the norm weight; GATED_NORM and SIGMOID_GATE from the
    heads' output o and its gate)."""
    if DOT:
        ptrs = x_ptr + offs_m[:, None] * x_m + offs_k[None, :]
        x = _silu_mul_load(ptrs, K, mm[:, None] & mk[None, :], SILU_MUL)  # [BLOCK_M, BLOCK_K]
        return tl.dot(x, tl.trans(w), acc)
    if NORM:
        x = _normed_load(x_ptr, d_ptr, nw_ptr, offs_k, mk, rstd, HAS_DELTA, ZERO_CENTERED).to(tl.float32)
    elif GATED_NORM:
        x = _head_gate_load(x_ptr, d_ptr, nw_ptr, offs_k, mk, x_h, eps, True, HEAD_D, BLOCK_K).to(tl.float32)
    elif SIGMOID_GATE:
        x = _head_gate_load(x_ptr, d_ptr, nw_ptr, offs_k, mk, x_h, eps, False, HEAD_D, BLOCK_K).to(tl.float32)
    else:
        x = _silu_mul_load(x_ptr + offs_k, K, mk, SILU_MUL).to(tl.float32)  # [BLOCK_K]
    return acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)


@triton.jit
def _conv_epilogue(y, offs_n, C, conv_ptr, slot_ptr, cw_ptr, co_ptr, s_slot, s_c, s_k, cw_c, cw_k,
                   KW: tl.constexpr, KW_BLOCK: tl.constexpr):  # fmt: skip
    """The conv step of one row's channels ``offs_n`` (those < C) from their rounded GEMM outputs ``y`` [BLOCK_N]:
    state = cat(state[:, 1:], y) in place in the row's slot, conv_out = silu(sum(state * w)), as the conv kernel."""
    mc = offs_n < C
    offs_j = tl.arange(0, KW_BLOCK)
    m2 = mc[:, None] & (offs_j < KW)[None, :]
    last = (offs_j == KW - 1)[None, :] & mc[:, None]  # [BLOCK_N, KW_BLOCK]
    shifted = mc[:, None] & ((offs_j + 1) < KW)[None, :]
    slot = tl.load(slot_ptr).to(tl.int64)
    base = conv_ptr + slot * s_slot + offs_n.to(tl.int64)[:, None] * s_c
    w = tl.load(cw_ptr + offs_n[:, None] * cw_c + offs_j[None, :] * cw_k, mask=m2, other=0.0)
    old = tl.load(base + (offs_j[None, :] + 1) * s_k, mask=shifted, other=0.0)  # state[:, j + 1]
    new = tl.where(last, y[:, None].to(cw_ptr.dtype.element_ty), old.to(cw_ptr.dtype.element_ty))
    acc = tl.sum(new.to(tl.float32) * w.to(tl.float32), axis=1)  # [BLOCK_N]
    tl.store(base + offs_j[None, :] * s_k, new.to(conv_ptr.dtype.element_ty), mask=m2)
    tl.store(co_ptr + offs_n, (acc * tl.sigmoid(acc)).to(co_ptr.dtype.element_ty), mask=mc)


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
    d_ptr,  # NORM: delta [1, K]; GATED_NORM: the gate z [1, K]; SIGMOID_GATE: qkv [1, >= 2K]
    nw_ptr,  # NORM: the norm weight [K]; GATED_NORM: [D]
    ho_ptr,  # NORM: where program 0 stores s = round(h + delta) [1, K]
    eps,
    conv_ptr,  # CONV: the conv pool [slots, C, KW]
    slot_ptr,  # CONV: the row's recurrent slot [1]
    cw_ptr,  # CONV: the conv weight [C, KW]
    co_ptr,  # CONV: silu(conv) out [1, C]
    C,  # CONV: conv channels, the first C output columns
    s_slot,
    s_c,
    s_k,
    cw_c,
    cw_k,
    x_h,  # GATED_NORM, SIGMOID_GATE: x is o [1, H, D], its head stride
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    HAS_DELTA: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    NORM_BLOCK: tl.constexpr,  # NORM: next_power_of_2(K), the whole row
    CONV: tl.constexpr,
    KW: tl.constexpr,  # CONV: the conv's taps
    KW_BLOCK: tl.constexpr,  # CONV: next_power_of_2(KW)
    GATED_NORM: tl.constexpr,
    SIGMOID_GATE: tl.constexpr,
    HEAD_D: tl.constexpr,  # GATED_NORM, SIGMOID_GATE: D, the width of a head
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
        if GATED_NORM:
            tl.static_assert(not DOT, "GATED_NORM serves one row")
        if SIGMOID_GATE:
            tl.static_assert(not DOT, "SIGMOID_GATE serves one row")
        rstd = 0.0
    if DOT:  # noqa: SIM108 (a static branch of the kernel)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc = _gemv_tile(acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, d_ptr, nw_ptr, rstd, x_h, eps,
                     DOT, SILU_MUL, NORM, HAS_DELTA, ZERO_CENTERED, GATED_NORM, SIGMOID_GATE, HEAD_D,
                     BLOCK_K)  # fmt: skip
    for k0 in range(BLOCK_K, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < K
        w = tl.load(rows + offs_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        acc = _gemv_tile(acc, w, x_ptr, x_m, K, offs_m, offs_k, mm, mk, d_ptr, nw_ptr, rstd, x_h, eps,
                         DOT, SILU_MUL, NORM, HAS_DELTA, ZERO_CENTERED, GATED_NORM, SIGMOID_GATE, HEAD_D,
                         BLOCK_K)  # fmt: skip
    if DOT:
        dst = y_ptr + offs_m[:, None] * y_m + offs_n[None, :]
        tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & mn[None, :])
    else:
        y = acc.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + offs_n, y, mask=mn)
        if CONV:
            _conv_epilogue(y, offs_n, C, conv_ptr, slot_ptr, cw_ptr, co_ptr, s_slot, s_c, s_k, cw_c, cw_k, KW,
                           KW_BLOCK)  # fmt: skip


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
# gemv_add_rms_norm (a GEMM with the pre-norm before it in its loads), one row only: the GDN in_proj, the MLP gate|up
# and the attention qkv GEMMs of Qwen3.5-0.8B. Not yet measured: gemv's one-row configs as a start. Not the lm_head
# (248320 columns: its ~31k programs would each re-read the row)
NORM_CONFIGS: dict[tuple[bool, int, int], tuple[int, int, int, int]] = {
    (False, 8224, 1024): (8, 512, 4, 3),
    (False, 7168, 1024): (16, 512, 4, 3),
    (False, 5120, 1024): (8, 512, 8, 3),  # 8 warps: rstd reduced in another order than add_rms_norm_'s (module doc)
}
# gemv_gated_rms_norm (the GDN output norm in out_proj's loads) and gemv_sigmoid_gate (attention's output gate in
# o_proj's loads), one row only: Qwen3.5-0.8B's out_proj and o_proj are both 1024 x 2048 (16 heads of 128, 8 of 256).
# Not yet measured on the GPU: gemv's one-row config, whose BLOCK_K (1024) holds whole heads of either width
GATED_NORM_CONFIGS: dict[tuple[bool, int, int], tuple[int, int, int, int]] = {
    (False, 1024, 2048): (2, 1024, 4, 1),
}
SIGMOID_GATE_CONFIGS: dict[tuple[bool, int, int], tuple[int, int, int, int]] = {
    (False, 1024, 2048): (2, 1024, 4, 1),
}


def _listed(table: dict, rows: int, n: int, k: int) -> bool:
    """The GEMM of ``rows`` rows is in ``table`` for its path (one row, or 2-16 rows)."""
    return 1 <= rows <= MAX_ROWS and (rows > 1, n, k) in table


def gemv_wins(rows: int, n: int, k: int) -> bool:
    """Whether the weight stream was measured faster than cuBLAS for this GEMM: a shape in ``GEMV_CONFIGS`` for its
    path (one row, or 2-16 rows). Shapes never benchmarked (another model's) stay on cuBLAS."""
    return _listed(GEMV_CONFIGS, rows, n, k)


def silu_mul_fold_wins(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv_silu_mul`` was measured faster than silu_mul + gemv for this down GEMM (``SILU_MUL_CONFIGS``)."""
    return _listed(SILU_MUL_CONFIGS, rows, n, k)


def norm_fold_wins(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv_add_rms_norm`` serves this GEMM: one row (the table lists one-row shapes only), in
    ``NORM_CONFIGS``."""
    return _listed(NORM_CONFIGS, rows, n, k)


def gated_norm_fold_wins(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv_gated_rms_norm`` serves this GEMM: one row, in ``GATED_NORM_CONFIGS``."""
    return _listed(GATED_NORM_CONFIGS, rows, n, k)


def sigmoid_gate_fold_wins(rows: int, n: int, k: int) -> bool:
    """Whether ``gemv_sigmoid_gate`` serves this GEMM: one row, in ``SIGMOID_GATE_CONFIGS``."""
    return _listed(SIGMOID_GATE_CONFIGS, rows, n, k)


def gemv(
    x: torch.Tensor,  # [M, K], M <= 16, unit column stride
    w: torch.Tensor,  # [N, K], unit column stride
    out: torch.Tensor | None = None,  # [M, N] contiguous, x's dtype unless given
    config: tuple[int, int, int, int] | None = None,  # (block_n, block_k, num_warps, num_stages)
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
    conv: ConvStep | None = None,  # one row: the conv step on the first C output columns, in the epilogue
) -> torch.Tensor:
    """x @ w^T for a few rows, as one weight stream. See module doc. Under PDL the first tile of ``w`` is read before
    the kernel waits for the one before it: ``w`` must be a weight, never something an earlier kernel of the step
    writes."""
    M, K = x.shape
    N = w.shape[0]
    assert w.shape == (N, K) and x.stride(-1) == 1 and w.stride(-1) == 1, (x.shape, w.shape)
    return _launch(x, w, out, config, M, N, K, pdl=pdl, conv=conv)


def gemv_silu_mul(
    gu: torch.Tensor,  # [M, 2K], the gate|up GEMM output, M <= 16, unit column stride
    w: torch.Tensor,  # [N, K], the down projection, unit column stride
    out: torch.Tensor | None = None,  # [M, N] contiguous, gu's dtype unless given
    config: tuple[int, int, int, int] | None = None,  # (block_n, block_k, num_warps, num_stages)
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
    conv: ConvStep | None = None,  # the conv step on the first C output columns, in the epilogue
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
    return _launch(h_in, w, out, config, M, N, K, norm=norm, pdl=pdl, conv=conv)


def _head_gate_args(o, g, w, config, table, D: int):
    """Shapes of a one-row head-gate fold (o [1, H, D], w [N, H D]) checked, its config resolved: (N, K, config)."""
    n, H, d = o.shape
    N, K = w.shape
    assert n == 1, f"the head-gate folds serve one row, got {n}"
    assert d == D and K == H * D and o.stride(-1) == 1 and g.stride(-1) == 1 and w.stride(-1) == 1, (o.shape, w.shape)
    config = config or table.get((False, N, K), DEFAULT_CONFIG[False])
    return N, K, config


def gemv_gated_rms_norm(
    o: torch.Tensor,  # [1, H, D], the GDN output (float32 from its kernel), unit column stride
    z: torch.Tensor,  # [1, H * D], the output gate, unit column stride
    norm_weight: torch.Tensor,  # [D], the model dtype
    eps: float,
    w: torch.Tensor,  # [N, H * D], out_proj, unit column stride
    out: torch.Tensor | None = None,  # [1, N] contiguous, norm_weight's dtype unless given
    config: tuple[int, int, int, int] | None = None,  # (block_n, block_k, num_warps, num_stages); block_k % D == 0
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """gated_rms_norm(o, z, nw, eps) @ w^T in one launch: per head round(round(nw * round(norm(o))) * silu(z)), formed
    in the loads; in the interpreter ``gemv(kernels.norms.gated_rms_norm(o, z, nw, eps), w)`` bit for bit."""
    D = o.shape[-1]
    N, K, config = _head_gate_args(o, z, w, config, GATED_NORM_CONFIGS, D)
    assert D & (D - 1) == 0, f"the head width must be a power of two (the tile is reshaped to heads), got {D}"
    assert config[1] % D == 0 and K % D == 0, f"BLOCK_K {config[1]} and K {K} must hold whole heads of {D}"
    assert z.shape == (1, K) and norm_weight.shape == (D,) and norm_weight.stride(0) == 1, (z.shape, norm_weight.shape)
    if out is None:
        out = torch.empty(1, N, dtype=norm_weight.dtype, device=o.device)
    gate = (z, norm_weight, o.stride(1), float(eps), D, True)
    return _launch(o, w, out, config, 1, N, K, gate=gate, pdl=pdl)


def gemv_sigmoid_gate(
    o: torch.Tensor,  # [1, H, D], the attention output, unit column stride
    qkv: torch.Tensor,  # [1, >= 2 H D], the fused projection: per head h, [query D | gate D] at h * 2D
    w: torch.Tensor,  # [N, H * D], o_proj, unit column stride
    out: torch.Tensor | None = None,  # [1, N] contiguous, o's dtype unless given
    config: tuple[int, int, int, int] | None = None,  # (block_n, block_k, num_warps, num_stages)
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """(o * sigmoid(gate)) @ w^T in one launch, bit for bit ``gemv(kernels.gates.sigmoid_gate_mul(o, qkv), w)``."""
    D = o.shape[-1]
    N, K, config = _head_gate_args(o, qkv, w, config, SIGMOID_GATE_CONFIGS, D)
    assert qkv.shape[0] == 1 and qkv.shape[1] >= 2 * K, (qkv.shape, o.shape)
    gate = (qkv, qkv, o.stride(1), 0.0, D, False)
    return _launch(o, w, out, config, 1, N, K, gate=gate, pdl=pdl)


def _launch(
    x,
    w,
    out,
    config,
    M: int,
    N: int,
    K: int,
    silu_mul: bool = False,
    norm: tuple | None = None,
    gate: tuple | None = None,
    pdl: bool | None = None,
    conv: ConvStep | None = None,
):
    """Run _gemv_kernel over ``x`` ([M, K], or with ``silu_mul`` gu [M, 2K]) and ``w`` [N, K] into ``out``; ``norm``:
    (delta, norm weight, h_out, eps, zero_centered, has_delta) of gemv_add_rms_norm, x being its h_in; ``gate``:
    (z or qkv, norm weight, o's head stride, eps, D, gated_norm) of gemv_gated_rms_norm / gemv_sigmoid_gate, x being
    their o; ``conv``: the conv step in the epilogue."""
    assert M <= MAX_ROWS, f"gemv serves <= {MAX_ROWS} rows, got {M}"
    if out is None:
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    assert out.shape == (M, N) and out.is_contiguous()
    if M == 0:
        return out
    dot = M > 1
    table = NORM_CONFIGS if norm else SILU_MUL_CONFIGS if silu_mul else GEMV_CONFIGS
    block_n, block_k, warps, stages = config or table.get((dot, N, K), DEFAULT_CONFIG[dot])
    d, nw, h_out, eps, zero_centered, has_delta = norm or (x, x, x, 0.0, False, False)
    x_h, head_d, gated_norm = 0, 1, False
    if gate:
        d, nw, x_h, eps, head_d, gated_norm = gate
    if conv is not None:
        C, KW = conv.weight.shape
        assert M == 1, f"the conv epilogue serves one row, got {M}"
        assert C <= N and conv.pool.shape[1:] == (C, KW) and conv.slots.shape == (1,), (conv.pool.shape, N)
        assert conv.out.shape == (1, C) and conv.out.stride(-1) == 1, conv.out.shape
        conv_args = (conv.pool, conv.slots, conv.weight, conv.out, C, *conv.pool.stride(), *conv.weight.stride())
    else:
        C = KW = 1
        conv_args = (x, x, x, x, 0, 0, 0, 0, 0, 0)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, w, out, M, N, K, x.stride(0), w.stride(0), out.stride(0), d, nw, h_out, eps, *conv_args, x_h,
        BLOCK_M=16 if dot else 1, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot, SILU_MUL=silu_mul, NORM=norm is not None,
        HAS_DELTA=has_delta, ZERO_CENTERED=zero_centered, NORM_BLOCK=triton.next_power_of_2(K) if norm else 1,
        GATED_NORM=gate is not None and gated_norm, SIGMOID_GATE=gate is not None and not gated_norm, HEAD_D=head_d,
        CONV=conv is not None, KW=KW, KW_BLOCK=triton.next_power_of_2(KW),
        num_warps=warps, num_stages=stages, **launch_options(pdl),
    )  # fmt: skip
    return out
