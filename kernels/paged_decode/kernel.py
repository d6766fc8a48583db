"""Paged decode attention, split over the KV length (flash-decoding), reading the block table and lengths on the
device: nothing is planned on the host, so a captured step replays with new tables and lengths written in place.

Cache layout as ``models.layers.paged``: ``kv[P, 2, ps, hk, d]`` (K at [:, 0], V at [:, 1]); row r attends to its first
``seq_lens[r]`` tokens, token t at page ``block_table[r, t // ps]``, offset ``t % ps``.

One program owns (row, KV head, split): the query heads of that KV head's group as the rows of a ``tl.dot`` (padded
to 16), the split's tokens in tiles of ``BLOCK_T`` with an online softmax. With one split the program writes the
output; with S > 1 it writes its unnormalised ``acc`` and ``(m, l)`` to a workspace and ``_combine_kernel`` merges
the S partials of each (row, query head):

    out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,   M = max_s m_s.

The split count S is a function of the batch size and the table width only (fixed per captured bucket): enough
programs to fill the GPU, at least ``MIN_SPLIT_TOKENS`` tokens each for a row that fills the table. Each row divides
its own length over the S splits (``row_split_tokens``: ceil(n / S) rounded up to a multiple of ``MIN_SPLIT_TOKENS``),
so a 600-token row in a table sized for a 262k-token context takes as many programs as in a table of 640 tokens; the
splits past its tokens write nothing, and the combine reads only the ones it used. A row with no tokens gets zeros
(the torch reference's ``nan_to_num``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait

MIN_SPLIT_TOKENS = 32  # fewer tokens than this a program: the partials cost more than they split
PROGRAMS_PER_SM = 2  # split until (rows x KV heads x splits) reaches this many programs per SM
CPU_SMS = 66  # the "SM count" used off the GPU (the interpreter), so CPU tests exercise split and unsplit paths
BLOCK_S = 16  # partials merged per iteration of the combine


@triton.jit
def _split_kernel(
    q_ptr,  # [b, hq, D]
    kv_ptr,  # [P, 2, ps, hk, D]
    bt_ptr,  # [b, W] int32
    len_ptr,  # [b] int32
    out_ptr,  # SPLIT: acc [b, hk, S, G, D] fp32; else the output [b, hq, D]
    ml_ptr,  # SPLIT: (m, l) [b, hk, S, G, 2] fp32
    scale,
    W,
    S,
    q_b,
    q_h,
    kv_page,
    kv_kv,
    kv_t,
    kv_h,
    o_b,
    o_h,
    PS: tl.constexpr,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    MIN_TOKENS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    row = tl.program_id(0).to(tl.int64)
    kh = tl.program_id(1)
    s = tl.program_id(2)
    n = tl.load(len_ptr + row)
    per = _row_split_tokens(n, S, MIN_TOKENS)
    t_begin = s * per
    t_end = tl.minimum(n, t_begin + per)  # <= t_begin: a split past the row's tokens, which writes nothing
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    offs_t = tl.arange(0, BLOCK_T)
    g_ok = (offs_g < G)[:, None] & (offs_d < D)[None, :]  # [G_PAD, D]
    q = tl.load(q_ptr + row * q_b + (kh * G + offs_g)[:, None] * q_h + offs_d[None, :], mask=g_ok, other=0.0)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([G_PAD], tl.float32)  # sum of exp(s - m)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for t0 in range(t_begin, t_end, BLOCK_T):
        t = t0 + offs_t  # [BLOCK_T]
        valid = t < t_end
        page = tl.load(bt_ptr + row * W + t // PS, mask=valid, other=0)
        base = page.to(tl.int64) * kv_page + (t % PS) * kv_t + kh * kv_h  # [BLOCK_T]
        t_ok = valid[:, None] & (offs_d < D)[None, :]  # [BLOCK_T, D]
        k = tl.load(kv_ptr + base[:, None] + offs_d[None, :], mask=t_ok, other=0.0)
        v = tl.load(kv_ptr + kv_kv + base[:, None] + offs_d[None, :], mask=t_ok, other=0.0)
        sc = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [G_PAD, BLOCK_T] fp32
        sc = tl.where((offs_g >= 0)[:, None] & valid[None, :], sc, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, axis=1))  # finite: every tile has a valid token
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new
    if SPLIT:
        used = t_begin < n  # (split 0 of an empty row is not used either: the combine reads no partial of it)
        part = (row * tl.num_programs(1) + kh) * S + s  # [b, hk, S] index
        tl.store(out_ptr + (part * G + offs_g)[:, None] * D + offs_d[None, :], acc, mask=g_ok & used)
        ml = ml_ptr + (part * G + offs_g) * 2
        tl.store(ml, m, mask=(offs_g < G) & used)
        tl.store(ml + 1, denom, mask=(offs_g < G) & used)
    else:
        o = acc / tl.where(denom > 0, denom, 1.0)[:, None]  # an empty row: acc = 0 -> 0
        dst = out_ptr + row * o_b + (kh * G + offs_g)[:, None] * o_h + offs_d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=g_ok)


@triton.jit
def _row_split_tokens(n, S, MIN_TOKENS: tl.constexpr):
    """Tokens each split of a row of ``n`` tokens takes: ceil(n / S) rounded up to a multiple of MIN_TOKENS (at
    least MIN_TOKENS), so the row's splits 0 .. ceil(n / per) - 1 cover it and the rest are past it."""
    per = (n + S - 1) // S
    return tl.maximum((per + MIN_TOKENS - 1) // MIN_TOKENS, 1) * MIN_TOKENS


@triton.jit
def _combine_kernel(
    acc_ptr,  # [b, hk, S, G, D] fp32
    ml_ptr,  # [b, hk, S, G, 2] fp32
    len_ptr,  # [b] int32
    out_ptr,  # [b, hq, D]
    S,
    o_b,
    o_h,
    G: tl.constexpr,
    D: tl.constexpr,
    MIN_TOKENS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: nothing the step's earlier kernels write is touched before the wait
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kh, g = h // G, h % G
    n = tl.load(len_ptr + row)
    per = _row_split_tokens(n, S, MIN_TOKENS)
    used = (n + per - 1) // per  # the row's splits that hold tokens (0 for an empty row)
    first = (row * (tl.num_programs(1) // G) + kh) * S  # partial (row, kh, 0): [b, hk, S] index
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    big_m = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, used, BLOCK_S):
        ms = tl.load(ml_ptr + ((first + s0 + offs_s) * G + g) * 2, mask=s0 + offs_s < used, other=float("-inf"))
        big_m = tl.maximum(big_m, ms)
    mx = tl.max(big_m, axis=0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)  # no split used (an empty row): weights exp(-inf) = 0 below
    num = tl.zeros([D], tl.float32)
    den = tl.zeros([BLOCK_S], tl.float32)
    for s0 in range(0, used, BLOCK_S):
        s_ok = s0 + offs_s < used
        idx = (first + s0 + offs_s) * G + g  # [BLOCK_S]
        ms = tl.load(ml_ptr + idx * 2, mask=s_ok, other=float("-inf"))
        ls = tl.load(ml_ptr + idx * 2 + 1, mask=s_ok, other=0.0)
        w = tl.exp(ms - mx)  # [BLOCK_S]
        a = tl.load(acc_ptr + idx[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & (offs_d < D)[None, :], other=0.0)
        num += tl.sum(w[:, None] * a, axis=0)
        den += w * ls
    total = tl.sum(den, axis=0)
    o = num / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + row * o_b + h * o_h + offs_d, o.to(out_ptr.dtype.element_ty))


def split_tokens(batch: int, num_kv_heads: int, max_tokens: int, sms: int) -> int:
    """Tokens a program covers: the fewest (a multiple of MIN_SPLIT_TOKENS) that keep (batch x KV heads x splits)
    within ``PROGRAMS_PER_SM * sms`` programs for a row of ``max_tokens``."""
    budget = max(PROGRAMS_PER_SM * sms // max(batch * num_kv_heads, 1), 1)  # splits a row may take
    tokens = math.ceil(max_tokens / budget)
    return max(MIN_SPLIT_TOKENS, math.ceil(tokens / MIN_SPLIT_TOKENS) * MIN_SPLIT_TOKENS)


def num_splits(batch: int, num_kv_heads: int, max_tokens: int, sms: int) -> int:
    """Splits of a row of ``max_tokens``: ceil(max_tokens / split_tokens)."""
    return max(1, math.ceil(max_tokens / split_tokens(batch, num_kv_heads, max_tokens, sms)))


def device_sms(device: torch.device) -> int:
    """The SM count the split heuristic fills (CPU_SMS off the GPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SMS


def paged_decode(
    q: torch.Tensor,  # [b, hq, D], unit stride in D
    kv: torch.Tensor,  # [P, 2, ps, hk, D], unit stride in D
    block_table: torch.Tensor,  # [b, W] int32, contiguous
    seq_lens: torch.Tensor,  # [b] int32, tokens each row attends to (0: an empty row, output 0)
    scale: float,
    out: torch.Tensor,  # [b, hq, D], q's dtype
    workspace: torch.Tensor | None = None,  # fp32, >= b * hk * S * G * (D + 2) elements when S > 1
    splits: int | None = None,  # split count (default: num_splits for this batch and table width)
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """softmax(q K^T * scale) V per row over its paged tokens, GQA (hq = G * hk); see module doc."""
    b, hq, D = q.shape
    P, two, ps, hk, Dk = kv.shape
    W = block_table.shape[1]
    assert two == 2 and Dk == D and hq % hk == 0 and q.stride(-1) == 1 and kv.stride(-1) == 1, (q.shape, kv.shape)
    assert block_table.dtype == torch.int32 and block_table.is_contiguous() and block_table.shape[0] == b
    assert seq_lens.dtype == torch.int32 and seq_lens.shape == (b,)
    assert out.shape == (b, hq, D) and out.stride(-1) == 1
    assert triton.next_power_of_2(D) == D and D >= 16, f"head_dim {D}: a power of two >= 16"
    if b == 0:
        return out
    G = hq // hk
    S = splits or num_splits(b, hk, W * ps, device_sms(q.device))
    tokens = math.ceil(W * ps / S)
    split = S > 1
    if split:
        need = b * hk * S * G * (D + 2)
        assert workspace is not None and workspace.dtype == torch.float32 and workspace.numel() >= need, (
            f"a split run of {b} rows x {S} splits needs a float32 workspace of {need} elements"
        )
        acc, ml = workspace[: b * hk * S * G * D], workspace[b * hk * S * G * D : need]
    else:
        acc, ml = out, out  # ml unused
    block_t = min(64 if D <= 128 else 32, max(16, triton.next_power_of_2(tokens)))  # K and V tiles in registers
    s0, s1, s2, s3, _ = kv.stride()
    _split_kernel[(b, hk, S)](
        q, kv, block_table, seq_lens, acc, ml, float(scale), W, S, q.stride(0), q.stride(1), s0, s1, s2, s3,
        out.stride(0), out.stride(1),
        PS=ps, G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, MIN_TOKENS=MIN_SPLIT_TOKENS, BLOCK_T=block_t,
        SPLIT=split, num_warps=4, num_stages=2, **launch_options(pdl),
    )  # fmt: skip
    if split:
        _combine_kernel[(b, hq)](
            acc, ml, seq_lens, out, S, out.stride(0), out.stride(1), G=G, D=D, MIN_TOKENS=MIN_SPLIT_TOKENS,
            BLOCK_S=BLOCK_S, num_warps=4, **launch_options(pdl),
        )  # fmt: skip
    return out


def workspace_elements(max_batch: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, max_tokens: int,
                       sms: int) -> int:  # fmt: skip
    """Workspace (fp32 elements) that every batch size up to ``max_batch`` needs for rows of ``max_tokens``."""
    G = num_qo_heads // num_kv_heads
    most = max(b * num_splits(b, num_kv_heads, max_tokens, sms) for b in range(1, max_batch + 1))
    return most * num_kv_heads * G * (head_dim + 2)
