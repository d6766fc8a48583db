"""Qwen3.5 attention's per-token prologue in one kernel: q/k RMS norms, partial RoPE, and the K/V cache write.

On the fused projection ``qkv [n, HQ*2D | HK*D | HK*D]`` (per query head h: query at ``h*2D``, its output gate at
``h*2D + D``), for row r and head j::

    x' = round(x * rsqrt(mean(x^2) + eps) * (1 + w))        w = q_norm.weight (query heads) or k_norm.weight
    y[i] = x'[i] cos[i] - x'[i + R/2] sin[i]   (i < R/2)     NeoX half rotation on the first R channels,
    y[i] = x'[i] cos[i] + x'[i - R/2] sin[i]   (R/2 <= i < R)  y[i] = x'[i] beyond R
    query heads -> q_out[r, h];  key head k -> kv[page, 0, off, k]; its value -> kv[page, 1, off, k]

with ``page, off = divmod(write_loc[r], page_size)``. One program per (row, query head + key head). Padding rows
write to the sink page as the torch path does. CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait


@triton.jit
def _norm_rope(base, w_ptr, cos, sin, rstd_eps, offs, m, is_rot, partner, sgn, DT: tl.constexpr, D: tl.constexpr):
    """The normed, rotated head at ``base`` (float32, rounded through DT after the norm)."""
    x = tl.load(base + offs, mask=m, other=0.0).to(tl.float32)
    xp = tl.load(base + partner, mask=m, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + rstd_eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32) + 1.0
    wp = tl.load(w_ptr + partner, mask=m, other=0.0).to(tl.float32) + 1.0
    xn = (x * rstd * w).to(DT).to(tl.float32)
    xpn = (xp * rstd * wp).to(DT).to(tl.float32)
    return tl.where(is_rot, xn * cos + sgn * xpn * sin, xn)


@triton.jit
def _attn_prep_kernel(
    qkv_ptr,
    wq_ptr,
    wk_ptr,
    cos_ptr,
    sin_ptr,
    kv_ptr,
    loc_ptr,
    q_ptr,
    qkv_b,
    cs_b,
    kv_page,
    kv_kv,
    kv_tok,
    kv_h,
    q_b,
    q_h,
    eps,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    D: tl.constexpr,
    R: tl.constexpr,
    PS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    r = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    DT: tl.constexpr = qkv_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK)
    m = offs < D
    is_rot = offs < R
    half: tl.constexpr = R // 2
    partner = tl.where(is_rot, tl.where(offs < half, offs + half, offs - half), offs)
    sgn = tl.where(offs < half, -1.0, 1.0)
    cs = cos_ptr + r * cs_b + offs
    cos = tl.load(cs, mask=m & is_rot, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + r * cs_b + offs, mask=m & is_rot, other=0.0).to(tl.float32)
    row = qkv_ptr + r * qkv_b
    if j < HQ:
        y = _norm_rope(row + j * 2 * D, wq_ptr, cos, sin, eps, offs, m, is_rot, partner, sgn, DT, D)
        tl.store(q_ptr + r * q_b + j * q_h + offs, y.to(q_ptr.dtype.element_ty), mask=m)
    else:
        kh = j - HQ
        y = _norm_rope(row + HQ * 2 * D + kh * D, wk_ptr, cos, sin, eps, offs, m, is_rot, partner, sgn, DT, D)
        loc = tl.load(loc_ptr + r).to(tl.int64)
        dst = kv_ptr + (loc // PS) * kv_page + (loc % PS) * kv_tok + kh * kv_h + offs
        tl.store(dst, y.to(kv_ptr.dtype.element_ty), mask=m)
        v = tl.load(row + HQ * 2 * D + HK * D + kh * D + offs, mask=m, other=0.0)
        tl.store(dst + kv_kv, v.to(kv_ptr.dtype.element_ty), mask=m)


def attention_prep_(
    qkv: torch.Tensor,  # [n, HQ*2D + 2*HK*D], unit column stride
    q_weight: torch.Tensor,  # [D] zero-centred q_norm weight
    k_weight: torch.Tensor,  # [D] zero-centred k_norm weight
    cos: torch.Tensor,  # [n, R]
    sin: torch.Tensor,  # [n, R]
    kv: torch.Tensor,  # [P, 2, ps, HK, D], written at write_loc
    write_loc: torch.Tensor,  # [n] int, flat token slot page * ps + offset
    num_q_heads: int,
    eps: float,
    q_out: torch.Tensor | None = None,  # [n, HQ, D] contiguous, qkv's dtype unless given
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """Normed, rotated queries [n, HQ, D]; normed, rotated keys and the values written into ``kv``. See module doc."""
    n = qkv.shape[0]
    _, two, ps, hk, d = kv.shape
    hq, r = num_q_heads, cos.shape[-1]
    assert two == 2 and qkv.shape[1] == hq * 2 * d + 2 * hk * d and qkv.stride(-1) == 1, (qkv.shape, kv.shape)
    assert cos.shape == sin.shape == (n, r) and r % 2 == 0 and r <= d and cos.stride() == sin.stride()
    assert q_weight.shape == k_weight.shape == (d,) and write_loc.shape == (n,) and kv.stride(-1) == 1
    if q_out is None:
        q_out = torch.empty(n, hq, d, dtype=qkv.dtype, device=qkv.device)
    assert q_out.shape == (n, hq, d) and q_out.stride(-1) == 1
    if n == 0:
        return q_out
    _attn_prep_kernel[(n, hq + hk)](
        qkv, q_weight, k_weight, cos, sin, kv, write_loc, q_out,
        qkv.stride(0), cos.stride(0), kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
        q_out.stride(0), q_out.stride(1), float(eps),
        HQ=hq, HK=hk, D=d, R=r, PS=ps, BLOCK=triton.next_power_of_2(d), num_warps=4,
        **launch_options(pdl),
    )  # fmt: skip
    return q_out
