"""Gated DeltaNet decode step, fused and in place on the slotted recurrent pools.

``gdn_decode_step_``: for row r with slot ``s = slots[r]`` and value head h (key head ``h // (hv // hk)``, the
``repeat_interleave`` mapping of ``normalize_qk``; pass q, k with hk == hv when they are already repeated), on the
float32 state ``S = ssm_pool[s, h]`` [dk, dv]::

    S = exp(g) S;  delta = beta (v - S^T k);  S = S + k delta^T;  o = S^T q

exactly ``models.layers.gdn.gated_delta_step``; S goes back to ``ssm_pool[s, h]`` in the pool's dtype and o to
``out[r, h]``. One program per (row, value head, dv block): it loads its [dk, BLOCK_V] state tile once, updates it
in registers and stores it back (the dv columns of S are independent, so blocks need no communication); its columns
by default from ``block_v_for`` (narrow tiles while the rows are few, so the state's bytes spread over more SMs).
``gdn_decode_raw_step_`` takes the raw conv output and gate projections instead: the kernel l2-normalises q and k
(``normalize_qk``) and computes ``g, beta = gdn_gates(a, b, A_log, dt_bias)`` itself.

``conv1d_decode_step_``: the one-token causal depthwise conv (``causal_conv1d_step``) on ``conv_pool[slots[r]]``
[C, K] in place; returns silu(conv) [b, C]. One program per (row, channel block).

Slot 0 is the sink shared by padding rows: their programs race on it (garbage there is fine); real rows must have
distinct slots. No host sync, no allocation beyond the conv output, so both are CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn_decode.naive import L2_EPS as _L2_EPS
from kernels.pdl import launch_options, pdl_wait

L2_EPS = tl.constexpr(_L2_EPS)
STEP_PROGRAMS = 1024  # the delta rule's programs a step that block_v_for aims under


def block_v_for(rows: int, hv: int, dk: int, dv: int) -> int:
    """The state columns a delta-rule program takes by default: the narrowest power of two from 16 that keeps the
    grid (rows x hv x dv / block_v) within STEP_PROGRAMS, at most a [dk, block_v] tile of 8192 elements. At the 0.8B
    shape (16 heads, 128 x 128) that is 16 columns at one row, 32 at 16 rows, 64 at 64, each the fastest of 16 / 32 /
    64 in the step on the H200 (models/bench/results/decode-profile-h200/delta-rule-columns.md)."""
    widest = max(16, min(triton.next_power_of_2(dv), 8192 // triton.next_power_of_2(dk)))
    block_v = 16
    while block_v < widest and rows * hv * triton.cdiv(dv, block_v) > STEP_PROGRAMS:
        block_v *= 2
    return block_v


@triton.jit
def _gdn_decode_kernel(
    ssm_ptr,
    slot_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    out_ptr,
    alog_ptr,
    dtb_ptr,
    q_scale,
    s_slot,
    s_h,
    s_k,
    s_v,
    q_b,
    q_h,
    k_b,
    k_h,
    v_b,
    v_h,
    g_b,
    beta_b,
    o_b,
    o_h,
    HV: tl.constexpr,
    N_REP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PREP: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    r = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = h // N_REP
    slot = tl.load(slot_ptr + r).to(tl.int64)

    offs_k = tl.arange(0, BLOCK_K)
    offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    mk = offs_k < DK
    mv = offs_v < DV
    m2 = mk[:, None] & mv[None, :]

    base = ssm_ptr + slot * s_slot + h * s_h
    tile = base + offs_k[:, None] * s_k + offs_v[None, :] * s_v
    S = tl.load(tile, mask=m2, other=0.0).to(tl.float32)  # [BLOCK_K, BLOCK_V]

    q = tl.load(q_ptr + r * q_b + kh * q_h + offs_k, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + r * k_b + kh * k_h + offs_k, mask=mk, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + r * v_b + h * v_h + offs_v, mask=mv, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + r * g_b + h).to(tl.float32)
    beta = tl.load(beta_ptr + r * beta_b + h).to(tl.float32)
    if PREP:  # raw inputs: l2-normalise q, k (q scaled by dk^-0.5) and turn a, b into the gates (gdn_gates)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + L2_EPS) * q_scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + L2_EPS)
        a = g + tl.load(dtb_ptr + h).to(tl.float32)
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
        g = -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * softplus
        beta = tl.sigmoid(beta)

    S = S * tl.exp(g)
    kv = tl.sum(S * k[:, None], axis=0)  # [BLOCK_V]
    delta = (v - kv) * beta
    S = S + k[:, None] * delta[None, :]
    o = tl.sum(S * q[:, None], axis=0)  # [BLOCK_V]

    tl.store(tile, S.to(ssm_ptr.dtype.element_ty), mask=m2)
    tl.store(out_ptr + r * o_b + h * o_h + offs_v, o.to(out_ptr.dtype.element_ty), mask=mv)


def gdn_decode_step_(
    ssm_pool: torch.Tensor,  # [slots, hv, dk, dv], any float dtype (math in float32)
    slots: torch.Tensor,  # [b] int, 0 (sink) for padding rows
    q: torch.Tensor,  # [b, hk, dk] (normed and scaled), hv % hk == 0
    k: torch.Tensor,  # [b, hk, dk] (normed)
    v: torch.Tensor,  # [b, hv, dv]
    g: torch.Tensor,  # [b, hv] log decay
    beta: torch.Tensor,  # [b, hv]
    out: torch.Tensor,  # [b, hv, dv], written
    block_v: int | None = None,
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> None:
    """One gated-delta-rule token per row on ``ssm_pool[slots[r]]``, in place; writes o to ``out``. See module doc."""
    _launch_gdn(ssm_pool, slots, q, k, v, g, beta, out, block_v, prep=None, pdl=pdl)


def gdn_decode_raw_step_(
    ssm_pool: torch.Tensor,  # [slots, hv, dk, dv]
    slots: torch.Tensor,  # [b] int, 0 (sink) for padding rows
    q: torch.Tensor,  # [b, hk, dk] raw (the conv output's query channels)
    k: torch.Tensor,  # [b, hk, dk] raw
    v: torch.Tensor,  # [b, hv, dv]
    a: torch.Tensor,  # [b, hv] raw in_proj_a output
    b: torch.Tensor,  # [b, hv] raw in_proj_b output
    A_log: torch.Tensor,  # [hv]
    dt_bias: torch.Tensor,  # [hv]
    out: torch.Tensor,  # [b, hv, dv], written
    block_v: int | None = None,
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> None:
    """``gdn_decode_step_`` after ``normalize_qk(q, k, 1)`` and ``gdn_gates(a, b, A_log, dt_bias)``, in the kernel."""
    hv = ssm_pool.shape[1]
    assert A_log.shape == dt_bias.shape == (hv,), (A_log.shape, dt_bias.shape)
    _launch_gdn(ssm_pool, slots, q, k, v, a, b, out, block_v, prep=(A_log, dt_bias), pdl=pdl)


def _launch_gdn(ssm_pool, slots, q, k, v, g, beta, out, block_v, prep, pdl) -> None:
    _, hv, dk, dv = ssm_pool.shape
    b, hk = q.shape[0], q.shape[1]
    assert k.shape == q.shape == (b, hk, dk) and hv % hk == 0, (q.shape, k.shape, ssm_pool.shape)
    assert v.shape == (b, hv, dv) and out.shape == (b, hv, dv), (v.shape, out.shape)
    assert g.shape == (b, hv) and beta.shape == (b, hv) and slots.shape == (b,), (g.shape, beta.shape, slots.shape)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and out.stride(-1) == 1
    assert g.stride(-1) == 1 and beta.stride(-1) == 1
    if b == 0:
        return
    block_k = triton.next_power_of_2(dk)
    if block_v is None:
        block_v = block_v_for(b, hv, dk, dv)
    A_log, dt_bias = prep if prep is not None else (g, g)  # unread unless PREP
    grid = (b, hv, triton.cdiv(dv, block_v))
    _gdn_decode_kernel[grid](
        ssm_pool, slots, q, k, v, g, beta, out, A_log, dt_bias, dk**-0.5,
        *ssm_pool.stride(), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), beta.stride(0), out.stride(0), out.stride(1),
        HV=hv, N_REP=hv // hk, DK=dk, DV=dv, BLOCK_K=block_k, BLOCK_V=block_v, PREP=prep is not None,
        num_warps=4,
        **launch_options(pdl),
    )  # fmt: skip


@triton.jit
def _conv1d_decode_kernel(
    conv_ptr,
    slot_ptr,
    x_ptr,
    w_ptr,
    out_ptr,
    s_slot,
    s_c,
    s_k,
    x_b,
    w_c,
    w_k,
    o_b,
    C: tl.constexpr,
    K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    r = tl.program_id(0)
    cb = tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_k = tl.arange(0, BLOCK_K)
    mc = offs_c < C
    mk = offs_k < K
    m2 = mc[:, None] & mk[None, :]
    last = (offs_k == K - 1)[None, :] & mc[:, None]  # [BLOCK_C, BLOCK_K]
    shifted = mc[:, None] & ((offs_k + 1) < K)[None, :]

    base = conv_ptr + slot * s_slot + offs_c[:, None] * s_c
    x = tl.load(x_ptr + r * x_b + offs_c, mask=mc, other=0.0)  # [BLOCK_C]
    w = tl.load(w_ptr + offs_c[:, None] * w_c + offs_k[None, :] * w_k, mask=m2, other=0.0)
    old = tl.load(base + (offs_k[None, :] + 1) * s_k, mask=shifted, other=0.0)  # state[:, j + 1]
    # new state = cat(state[:, 1:], x), each entry rounded through the weight dtype as the torch step does
    new = tl.where(last, x[:, None].to(w_ptr.dtype.element_ty), old.to(w_ptr.dtype.element_ty))
    acc = tl.sum(new.to(tl.float32) * w.to(tl.float32), axis=1)  # [BLOCK_C]
    y = acc * tl.sigmoid(acc)
    tl.store(base + offs_k[None, :] * s_k, new.to(conv_ptr.dtype.element_ty), mask=m2)
    tl.store(out_ptr + r * o_b + offs_c, y.to(out_ptr.dtype.element_ty), mask=mc)


def conv1d_decode_step_(
    conv_pool: torch.Tensor,  # [slots, C, K]
    slots: torch.Tensor,  # [b] int, 0 (sink) for padding rows
    x: torch.Tensor,  # [b, C]
    weight: torch.Tensor,  # [C, K]
    out: torch.Tensor | None = None,  # [b, C], x's dtype unless given
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """One causal-conv token per row on ``conv_pool[slots[r]]`` (shift in x, in place); returns silu(conv) [b, C].

    Same as ``causal_conv1d_step`` except that the products are summed in float32.
    """
    _, C, K = conv_pool.shape
    b = x.shape[0]
    assert x.shape == (b, C) and weight.shape == (C, K) and slots.shape == (b,), (x.shape, weight.shape, slots.shape)
    assert x.stride(-1) == 1
    if out is None:
        out = torch.empty_like(x)
    assert out.shape == (b, C) and out.stride(-1) == 1
    if b == 0:
        return out
    block_c = 256
    grid = (b, triton.cdiv(C, block_c))
    _conv1d_decode_kernel[grid](
        conv_pool,
        slots,
        x,
        weight,
        out,
        *conv_pool.stride(),
        x.stride(0),
        *weight.stride(),
        out.stride(0),
        C=C,
        K=K,
        BLOCK_C=block_c,
        BLOCK_K=triton.next_power_of_2(K),
        num_warps=4,
        **launch_options(pdl),
    )
    return out
