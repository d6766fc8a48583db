"""Causal depthwise conv of a varlen prefill: S sequences back to back ([N, C], ``cu_seqlens``), each continuing
the conv state in its recurrent slot, in two kernels (no padding to the longest sequence).

``conv1d_varlen_(x, conv_pool, weight, seq_of, cu_seqlens, slots, fresh) -> out [N, C]``: out[n] = silu(sum_j
weight[c, j] xs_s[p + 1 + j]) for token n at position p of its sequence s, xs_s = cat(state_s, x_s); taps before the
sequence's first token read its slot's state (zeros when fresh). The first kernel computes every token (one program
per [BLOCK_T, BLOCK_C] tile, accumulated in float32); the second then writes each sequence's last K inputs into its
slot, after every read of the old state. Padding is a sequence like any other (its slot the sink); an empty sequence
leaves its slot as it was.

Saves (a prefix cache's checkpoints, ``naive.conv1d_varlen_ref_``'s ``saves``): the second kernel also writes a
sequence's new state into its final save slot, and a third writes each interior save (the K inputs before its row);
both only where the slot is nonzero, so a pass's save arrays, sized for the most saves its shape holds, cost nothing
where they are empty. The torch form wrote every entry (most into the sink): two index_puts a layer, 12 us each on the
H200 at a 2048-token pass (``models/bench/results/prefix-cache-h200/RUNS.md``, "tokens-and-cost/").
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from kernels.runtime import interpreted


@triton.jit
def _conv_kernel(
    x_ptr, pool_ptr, w_ptr, out_ptr, seq_ptr, cu_ptr, slot_ptr, fresh_ptr, N, C, x_n, p_s, p_c, eps, n_class,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT1: tl.constexpr, SPLIT2: tl.constexpr,
    NORMED: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT] tokens
    c0 = tl.program_id(1) * BLOCK_C
    c = c0 + tl.arange(0, BLOCK_C)  # [BC] channels
    t_ok = t < N
    c_ok = c < C
    s = tl.load(seq_ptr + t, mask=t_ok, other=0)
    pos = t - tl.load(cu_ptr + s, mask=t_ok, other=0)  # [BT] position in the sequence
    slot = tl.load(slot_ptr + s, mask=t_ok, other=0).to(tl.int64)
    warm = tl.load(fresh_ptr + s, mask=t_ok, other=1) == 0  # [BT] the state is read
    ok = t_ok[:, None] & c_ok[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(K):
        q = pos - (K - 1) + j  # [BT] position tap j reads
        in_x = q >= 0
        xv = tl.load(x_ptr + (t - (K - 1) + j)[:, None].to(tl.int64) * x_n + c[None, :],
                     mask=ok & in_x[:, None], other=0.0)  # fmt: skip
        w = tl.load(w_ptr + c * K + j, mask=c_ok, other=0.0)
        acc += xv.to(tl.float32) * w.to(tl.float32)[None, :]
    if tl.min(tl.where(t_ok, pos, K)) < K - 1:  # the tile holds a sequence's first K - 1 tokens: taps on the state
        for j in tl.static_range(K - 1):
            q = pos - (K - 1) + j
            sv = tl.load(pool_ptr + slot[:, None] * p_s + c[None, :] * p_c + (K + q)[:, None],
                         mask=ok & ((q < 0) & warm)[:, None], other=0.0)  # fmt: skip
            w = tl.load(w_ptr + c * K + j, mask=c_ok, other=0.0)
            acc += sv.to(tl.float32) * w.to(tl.float32)[None, :]
    y = acc / (1.0 + tl.exp(-acc))  # silu
    # channels [0, SPLIT1) and [SPLIT1, SPLIT2) (q and k) l2-normalised per BLOCK_C-wide head when NORMED; out is the
    # three parts [0, SPLIT1), [SPLIT1, SPLIT2), [SPLIT2, C) one after another, each [N, width] contiguous
    if NORMED:
        rstd = 1.0 / tl.sqrt(tl.sum(y * y, axis=1) + eps)  # [BT]
        y = tl.where(c0 < SPLIT2, y * rstd[:, None], y)
    base = tl.where(c0 < SPLIT1, 0, tl.where(c0 < SPLIT2, N * SPLIT1, N * SPLIT2)).to(tl.int64)
    first = tl.where(c0 < SPLIT1, 0, tl.where(c0 < SPLIT2, SPLIT1, SPLIT2))
    width = tl.where(c0 < SPLIT1, SPLIT1, tl.where(c0 < SPLIT2, SPLIT2 - SPLIT1, C - SPLIT2))
    dst = out_ptr + base + t[:, None].to(tl.int64) * width + (c - first)[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=ok)


TOKEN_CLASSES = tuple(1 << i for i in range(8, 15))  # 256 .. 16384: the tuner's classes of a pass's tokens


def token_class(n: int) -> int:
    """The tuning class of an n-token pass: n to a power of two, clamped to ``TOKEN_CLASSES`` (one tuning each)."""
    return min(max(triton.next_power_of_2(n), TOKEN_CLASSES[0]), TOKEN_CLASSES[-1])


def untuned_sizes(largest: int, ran: Iterable[int]) -> tuple[int, ...]:
    """A token count (<= ``largest``) in each tuning class that a pass of 1 .. ``largest`` tokens reaches and no
    pass of ``ran`` tokens did, ascending: the passes that tune the rest of the classes."""
    tuned = {token_class(n) for n in ran}
    sizes = {token_class(min(c, largest)): min(c, largest) for c in TOKEN_CLASSES}  # each reachable class: a size
    return tuple(n for c, n in sorted(sizes.items()) if c not in tuned)


_tuned_conv_kernel = triton.autotune(
    [triton.Config({"BLOCK_T": bt}, num_warps=w) for bt in (16, 32, 64) for w in (2, 4, 8)],
    key=["n_class", "C", "x_n", "K", "BLOCK_C", "NORMED"],
    cache_results=True,  # the pick on disk with the compiled kernel: a later process benchmarks nothing
)(_conv_kernel)  # n_class (token_class: unread by the kernel): few tunings, not one an N


@triton.jit
def _state_kernel(
    x_ptr, pool_ptr, cu_ptr, slot_ptr, fresh_ptr, final_ptr, C, x_n, p_s, p_c,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, SAVES: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    j = tl.arange(0, BLOCK_K)  # [BK]
    bos = tl.load(cu_ptr + s)
    n = tl.load(cu_ptr + s + 1) - bos
    slot = tl.load(slot_ptr + s).to(tl.int64)
    warm = tl.load(fresh_ptr + s + j * 0) == 0  # [BK] (a vector: the interpreter wants a mask of the tile's shape)
    q = n - K + j  # [BK] position of each of the last K inputs
    ok = (j < K)[:, None] & (c < C)[None, :]
    in_x = (q >= 0)[:, None]
    xv = tl.load(x_ptr + (bos + q)[:, None].to(tl.int64) * x_n + c[None, :], mask=ok & in_x, other=0.0)
    sv = tl.load(pool_ptr + slot * p_s + c[None, :] * p_c + (K + q)[:, None], mask=ok & ~in_x & warm[:, None],
                 other=0.0)  # fmt: skip
    v = tl.where(in_x, xv.to(tl.float32), sv.to(tl.float32)).to(pool_ptr.dtype.element_ty)
    tl.store(pool_ptr + slot * p_s + c[None, :] * p_c + j[:, None], v, mask=ok)
    if SAVES:  # a final save: the same state into a checkpoint's slot too (a scalar branch: no store where 0)
        final = tl.load(final_ptr + s).to(tl.int64)
        if final != 0:
            tl.store(pool_ptr + final * p_s + c[None, :] * p_c + j[:, None], v, mask=ok)


@triton.jit
def _save_kernel(
    x_ptr, pool_ptr, save_ptr, at_ptr, C, x_n, p_s, p_c, K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Interior save r: pool[save[r]] = the K inputs before flat row at[r] (a scalar branch: nothing where save[r]
    is 0, the chunk rows without a save)."""
    r = tl.program_id(0)
    slot = tl.load(save_ptr + r).to(tl.int64)
    if slot != 0:
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
        j = tl.arange(0, BLOCK_K)  # [BK]
        at = tl.load(at_ptr + r).to(tl.int64)
        ok = (j < K)[:, None] & (c < C)[None, :]
        xv = tl.load(x_ptr + (at - K + j)[:, None] * x_n + c[None, :], mask=ok, other=0.0)
        tl.store(pool_ptr + slot * p_s + c[None, :] * p_c + j[:, None], xv.to(pool_ptr.dtype.element_ty), mask=ok)


def conv1d_varlen_(
    x: torch.Tensor,
    conv_pool: torch.Tensor,
    weight: torch.Tensor,
    seq_of: torch.Tensor,
    cu_seqlens: torch.Tensor,
    slots: torch.Tensor,
    fresh: torch.Tensor,
    split: tuple[int, int] | None = None,
    normed: bool = False,
    eps: float = 1e-6,
    block_t: int | None = None,
    block_c: int = 128,
    saves: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``naive.conv1d_varlen_ref_`` in two kernels: x [N, C] (rows may be strided), conv_pool [slots, C, K] with
    unit stride along K, weight [C, K]; int32 or int64 indices. Returns out [N, C] in x's dtype; with ``split`` (a,
    b) the three parts [N, a], [N, b - a], [N, C - b] instead, each contiguous (the delta rule's q, k, v), and with
    ``normed`` the first two l2-normalised per ``block_c`` channels (a head: a and b must be multiples of it).
    ``block_t``: tokens a program; None: tuned on the GPU. ``saves``: (save_slot [R], save_at [R], final_slot [S]), as
    the reference takes them, written by the state kernel (final) and one more kernel (interior) only where nonzero."""
    N, C = x.shape
    K = weight.shape[1]
    if x.stride(1) != 1 or conv_pool.stride(2) != 1 or conv_pool.shape[1:] != (C, K):
        raise ValueError(f"x [N, C] must be unit-stride in C and conv_pool [slots, {C}, {K}] in K, got "
                         f"{tuple(x.shape)} {x.stride()}, {tuple(conv_pool.shape)} {conv_pool.stride()}")  # fmt: skip
    a, b = split if split is not None else (C, C)
    if split is not None and (a % block_c or b % block_c or not 0 < a < b < C):
        raise ValueError(f"split {split} must cut {C} channels at multiples of {block_c}")
    if normed and split is None:
        raise ValueError("normed needs split (the q and k parts it normalises)")
    flat = torch.empty(N * C, dtype=x.dtype, device=x.device)
    fresh_i = fresh.to(torch.int32)
    w = weight.contiguous()
    args = (x, conv_pool, w, flat, seq_of, cu_seqlens, slots, fresh_i, N, C, x.stride(0), conv_pool.stride(0),
            conv_pool.stride(1), float(eps), token_class(N))  # fmt: skip
    meta = dict(K=K, BLOCK_C=block_c, SPLIT1=a, SPLIT2=b, NORMED=normed)
    if block_t or interpreted():  # a given tile height (the interpreter: one, 32)
        _conv_kernel[(triton.cdiv(N, block_t or 32), triton.cdiv(C, block_c))](*args, BLOCK_T=block_t or 32, **meta)
    else:  # the tile height and warps tuned once per token class and shape, at its first (eager) pass: the kernel
        # is pure (it writes only ``flat``), so the tuner's repeated runs change nothing
        _tuned_conv_kernel[lambda m: (triton.cdiv(N, m["BLOCK_T"]), triton.cdiv(C, block_c))](*args, **meta)
    S, BK = slots.shape[0], triton.next_power_of_2(K)
    strides = (C, x.stride(0), conv_pool.stride(0), conv_pool.stride(1))
    final = saves[2] if saves is not None else slots  # (unread without saves)
    _state_kernel[(S, triton.cdiv(C, block_c))](x, conv_pool, cu_seqlens, slots, fresh_i, final, *strides, K=K,
                                                BLOCK_K=BK, BLOCK_C=block_c, SAVES=saves is not None)  # fmt: skip
    if saves is not None and saves[0].numel():
        save_slot, save_at = saves[0], saves[1]
        _save_kernel[(save_slot.shape[0], triton.cdiv(C, block_c))](x, conv_pool, save_slot, save_at, *strides, K=K,
                                                                     BLOCK_K=BK, BLOCK_C=block_c)  # fmt: skip
    if split is None:
        return flat.view(N, C)
    return flat[: N * a].view(N, a), flat[N * a : N * b].view(N, b - a), flat[N * b :].view(N, C - b)
