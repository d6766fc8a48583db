"""The Gated DeltaNet decode mixer in one kernel: conv step, delta rule and gated norm, from the input projection's
output to the out projection's input.

For row r (slot ``s = slots[r]``) and key head kh, one program: the causal conv step of kh's query and key channels
and of the value channels of its value heads (``kh * n_rep + j``), in place on ``conv_pool[s]``; then per value head h
the delta rule on ``ssm_pool[s, h]`` over the whole [dk, dv] state, and the gated norm of its output::

    q, k, v = silu(conv(p[:, :C]));  S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
    y[r, h] = (w * rms_normalize(o)) * silu(z[r, h])

exactly ``conv1d_decode_step_``, ``gdn_decode_raw_step_`` and ``kernels.norms.gated_rms_norm`` one after another,
rounded where they store (the conv output to p's dtype, o to float32, the norm where GatedRMSNorm rounds): three
launches of a decode step's ~190 become one. A program owns every channel it shifts (its key head's and its value
heads'), so no two programs touch one conv state entry; a head's dv outputs are all in one program, so the norm needs
no other. Slot 0 is the sink the padding rows share (their programs race there; garbage is fine).

``p`` is the fused input projection's output [b, C | vd | hv | hv]: conv channels (q | k | v), z, then b and a.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gdn_decode.kernel import L2_EPS
from kernels.pdl import launch_options, pdl_wait


@triton.jit
def _conv_silu(conv_row, x_row, w_ptr, offs_c, mc, offs_w, c_c, c_w, w_c, w_w, KW: tl.constexpr):
    """silu(conv) of channels ``offs_c`` of one row, rounded to x's dtype and returned in float32; the row's conv
    state [C, KW] shifted in place (each entry rounded through the weight's dtype, as conv1d_decode_step_ does)."""
    mw = offs_w < KW
    m2 = mc[:, None] & mw[None, :]
    last = (offs_w == KW - 1)[None, :] & mc[:, None]
    shifted = mc[:, None] & ((offs_w + 1) < KW)[None, :]
    state = conv_row + offs_c[:, None] * c_c
    x = tl.load(x_row + offs_c, mask=mc, other=0.0)  # [BLOCK]
    w = tl.load(w_ptr + offs_c[:, None] * w_c + offs_w[None, :] * w_w, mask=m2, other=0.0)  # [BLOCK, BLOCK_W]
    old = tl.load(state + (offs_w[None, :] + 1) * c_w, mask=shifted, other=0.0)  # state[:, j + 1]
    new = tl.where(last, x[:, None].to(w_ptr.dtype.element_ty), old.to(w_ptr.dtype.element_ty))
    acc = tl.sum(new.to(tl.float32) * w.to(tl.float32), axis=1)
    tl.store(state + offs_w[None, :] * c_w, new.to(conv_row.dtype.element_ty), mask=m2)
    return (acc * tl.sigmoid(acc)).to(x_row.dtype.element_ty).to(tl.float32)


@triton.jit
def _gdn_decode_mixer_kernel(
    conv_ptr,  # [slots, C, KW]
    ssm_ptr,  # [slots, hv, dk, dv]
    slot_ptr,  # [b]
    p_ptr,  # [b, C + vd + 2 hv]
    cw_ptr,  # [C, KW]
    alog_ptr,  # [hv]
    dtb_ptr,  # [hv]
    nw_ptr,  # [dv]
    out_ptr,  # [b, vd]
    q_scale,
    eps,
    c_slot,
    c_c,
    c_w,
    s_slot,
    s_h,
    s_k,
    s_v,
    p_b,
    w_c,
    w_w,
    out_b,
    KD: tl.constexpr,  # hk * dk
    VD: tl.constexpr,  # hv * dv
    HV: tl.constexpr,
    N_REP: tl.constexpr,  # hv // hk
    DK: tl.constexpr,
    DV: tl.constexpr,
    KW: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_W: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    r = tl.program_id(0).to(tl.int64)
    kh = tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.arange(0, BLOCK_V)
    offs_w = tl.arange(0, BLOCK_W)
    mk = offs_k < DK
    mv = offs_v < DV
    m2 = mk[:, None] & mv[None, :]
    conv_row = conv_ptr + slot * c_slot
    p_row = p_ptr + r * p_b
    # the first value head's state first: its load (the kernel's largest) needs only the slot, so it streams in
    # while the conv and the norms below run
    tiles = ssm_ptr + slot * s_slot + offs_k[:, None] * s_k + offs_v[None, :] * s_v  # [BLOCK_K, BLOCK_V], head 0
    S_first = tl.load(tiles + kh * N_REP * s_h, mask=m2, other=0.0)
    q = _conv_silu(conv_row, p_row, cw_ptr, kh * DK + offs_k, mk, offs_w, c_c, c_w, w_c, w_w, KW)  # [BLOCK_K]
    k = _conv_silu(conv_row, p_row, cw_ptr, KD + kh * DK + offs_k, mk, offs_w, c_c, c_w, w_c, w_w, KW)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + L2_EPS) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + L2_EPS)
    nw = tl.load(nw_ptr + offs_v, mask=mv, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    for j in tl.static_range(N_REP):
        h = kh * N_REP + j
        v = _conv_silu(conv_row, p_row, cw_ptr, 2 * KD + h * DV + offs_v, mv, offs_w, c_c, c_w, w_c, w_w, KW)
        beta = tl.sigmoid(tl.load(p_row + KD * 2 + VD + VD + h).to(tl.float32))
        a = tl.load(p_row + KD * 2 + VD + VD + HV + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32)
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
        g = -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * softplus
        tile = tiles + h * s_h
        if j == 0:
            S = S_first.to(tl.float32) * tl.exp(g)  # [BLOCK_K, BLOCK_V]
        else:
            S = tl.load(tile, mask=m2, other=0.0).to(tl.float32) * tl.exp(g)
        delta = (v - tl.sum(S * k[:, None], axis=0)) * beta  # [BLOCK_V]
        S = S + k[:, None] * delta[None, :]
        o = tl.sum(S * q[:, None], axis=0).to(dt).to(tl.float32)  # [BLOCK_V]
        tl.store(tile, S.to(ssm_ptr.dtype.element_ty), mask=m2)
        rstd = tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps)
        y = (nw * (o * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        z = tl.load(p_row + KD * 2 + VD + h * DV + offs_v, mask=mv, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * out_b + h * DV + offs_v, (y * z * tl.sigmoid(z)).to(dt), mask=mv)


def gdn_decode_mixer_step_(
    conv_pool: torch.Tensor,  # [slots, C, KW], C = 2 hk dk + hv dv
    ssm_pool: torch.Tensor,  # [slots, hv, dk, dv], any float dtype (math in float32)
    slots: torch.Tensor,  # [b] int, 0 (sink) for padding rows
    p: torch.Tensor,  # [b, C + hv dv + 2 hv]: conv channels q | k | v, z, b, a; unit column stride
    conv_weight: torch.Tensor,  # [C, KW]
    A_log: torch.Tensor,  # [hv]
    dt_bias: torch.Tensor,  # [hv]
    norm_weight: torch.Tensor,  # [dv], the model dtype
    eps: float,
    hk: int,
    out: torch.Tensor | None = None,  # [b, hv dv], norm_weight's dtype unless given
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
    num_warps: int | None = None,  # None: 4 up to a [dk, dv] state of 4096 elements, else 8
) -> torch.Tensor:
    """Conv step, delta rule and gated norm of one token a row, in place on the pools; returns out. See module doc."""
    _, hv, dk, dv = ssm_pool.shape
    _, C, KW = conv_pool.shape
    b = p.shape[0]
    assert hv % hk == 0 and 2 * hk * dk + hv * dv == C, (hk, ssm_pool.shape, conv_pool.shape)
    assert p.shape == (b, C + hv * dv + 2 * hv) and p.stride(-1) == 1, (p.shape, C, hv, dv)
    assert conv_weight.shape == (C, KW) and slots.shape == (b,), (conv_weight.shape, slots.shape)
    assert A_log.shape == dt_bias.shape == (hv,) and norm_weight.shape == (dv,), (A_log.shape, norm_weight.shape)
    if out is None:
        out = torch.empty(b, hv * dv, dtype=norm_weight.dtype, device=p.device)
    assert out.shape == (b, hv * dv) and out.stride(-1) == 1, out.shape
    if b == 0:
        return out
    block_k, block_v = triton.next_power_of_2(dk), triton.next_power_of_2(dv)
    _gdn_decode_mixer_kernel[(b, hk)](
        conv_pool, ssm_pool, slots, p, conv_weight, A_log, dt_bias, norm_weight, out, dk**-0.5, float(eps),
        *conv_pool.stride(), *ssm_pool.stride(), p.stride(0), *conv_weight.stride(), out.stride(0),
        KD=hk * dk, VD=hv * dv, HV=hv, N_REP=hv // hk, DK=dk, DV=dv, KW=KW, BLOCK_K=block_k, BLOCK_V=block_v,
        BLOCK_W=triton.next_power_of_2(KW), num_warps=num_warps or (4 if block_k * block_v <= 4096 else 8), **launch_options(pdl),
    )  # fmt: skip
    return out
