"""The chunked delta rule's state pass over a varlen stream, reading and writing each sequence's state in its
recurrent pool slot: no gather of initial states, no zero fill, no scatter of final states.

Sequence s (tokens ``cu[s] .. cu[s + 1] - 1``, chunks ``offsets[s] ..`` of fla's chunk index) starts from
``pool[slots[s]]`` (zeros where ``fresh[s]``); for each 64-token chunk c with decays G (log2, cumulated within the
chunk, fla's ``chunk_local_cumsum``), w and u from the UT transform (fla's ``recompute_w_u``)::

    h[c] = S;  v_new[c] = u[c] - w[c] S;  S = 2^G_last S + k[c]^T (2^(G_last - G) * v_new[c])

and ``pool[slots[s]] = S`` at the end. Saves (a prefix cache's checkpoints): where ``save_slot[row]`` is nonzero the
state entering chunk row ``row`` is stored in ``pool[save_slot[row]]`` too, and where ``final_slot[s]`` is nonzero the
final state in ``pool[final_slot[s]]`` too (a scalar branch each: no store where 0). Save slots must be distinct from
each other and from every sequence's slot (nothing in the pass reads them).

This is fla-core's ``chunk_gated_delta_rule_fwd_h`` (same inputs, h and v_new, MIT-licensed
``chunk_gated_delta_rule_fwd_kernel_h_blockdim64``, whose structure this follows) with the state addressed by slot: in a
pass of fixed shape, gathering, clearing and scattering every sequence's [hv, dk, dv] float32 state around fla's kernel
cost ~90 us a layer whatever the tokens (1.7 ms of a 256-token pass on the H200).

One program per (dv block, sequence, value head): it loads its [dk, BV] state tile once, keeps it in registers over
the sequence's chunks and stores it back; tiles are disjoint, so the update in place needs no communication. Slot 0
is the sink of the padding and empty sequences (always fresh): their programs race there on garbage, as the decode
kernels' padding rows do. Real sequences must have distinct slots. dk is 64 or 128 (Qwen3.5's 128).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.runtime import interpreted

KEY_DIMS = (64, 128)  # the key head widths (dk) the state pass takes


@triton.jit
def _state_pass_kernel(
    k_ptr,  # [N, H, K]
    w_ptr,  # [N, HV, K]
    u_ptr,  # [N, HV, V]
    g_ptr,  # [N, HV] float32, log2 decays cumulated within each chunk
    h_ptr,  # [rows, HV, K, V] out: the state entering each chunk row
    vnew_ptr,  # [N, HV, V] out
    pool_ptr,  # [slots, HV, K, V] in place
    slot_ptr,  # [S]
    fresh_ptr,  # [S] bool
    cu_ptr,  # [S + 1]
    off_ptr,  # [S + 1]
    save_ptr,  # [rows] slot that receives the state entering each chunk row (0: none); unread unless SAVES
    final_ptr,  # [S] slot that receives each sequence's final state too (0: none); unread unless SAVES
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BV: tl.constexpr,
    SAVES: tl.constexpr,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // HV, i_nh % HV
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    T = tl.load(cu_ptr + i_n + 1).to(tl.int64) - bos
    boh = tl.load(off_ptr + i_n).to(tl.int64)
    slot = tl.load(slot_ptr + i_n).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_k = tl.arange(0, 64)
    tile = o_k[:, None] * V + o_v[None, :]  # [64, BV] offsets in one [K, V] state, rows 0..63
    p_s = pool_ptr + (slot * HV + i_h) * K * V + tile
    b_h1 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 64:
        b_h2 = tl.zeros([64, BV], dtype=tl.float32)
    if tl.load(fresh_ptr + i_n) == 0:
        b_h1 = tl.load(p_s, mask=m_v[None, :], other=0.0).to(tl.float32)
        if K > 64:
            b_h2 = tl.load(p_s + 64 * V, mask=m_v[None, :], other=0.0).to(tl.float32)
    k_col = (i_h // (HV // H)) * K  # value head h reads key head h // (HV / H)
    for i_t in range(tl.cdiv(T, BT)):
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        rows = bos + o_t  # [BT] int64 token rows
        p_h = h_ptr + ((boh + i_t) * HV + i_h) * K * V + tile
        tl.store(p_h, b_h1.to(h_ptr.dtype.element_ty), mask=m_v[None, :])
        if K > 64:
            tl.store(p_h + 64 * V, b_h2.to(h_ptr.dtype.element_ty), mask=m_v[None, :])
        if SAVES:
            save = tl.load(save_ptr + boh + i_t).to(tl.int64)
            if save != 0:
                p_sv = pool_ptr + (save * HV + i_h) * K * V + tile
                tl.store(p_sv, b_h1.to(pool_ptr.dtype.element_ty), mask=m_v[None, :])
                if K > 64:
                    tl.store(p_sv + 64 * V, b_h2.to(pool_ptr.dtype.element_ty), mask=m_v[None, :])
        p_w = w_ptr + rows[:, None] * (HV * K) + i_h * K + o_k[None, :]  # [BT, 64]
        b_w = tl.load(p_w, mask=m_t[:, None], other=0.0)
        b_v = tl.dot(b_w, b_h1.to(b_w.dtype))  # [BT, BV] = w S
        if K > 64:
            b_w = tl.load(p_w + 64, mask=m_t[:, None], other=0.0)
            b_v = tl.dot(b_w, b_h2.to(b_w.dtype), b_v)
        m_tv = m_t[:, None] & m_v[None, :]
        uv = rows[:, None] * (HV * V) + i_h * V + o_v[None, :]
        b_v = tl.load(u_ptr + uv, mask=m_tv, other=0.0).to(tl.float32) - b_v
        tl.store(vnew_ptr + uv, b_v.to(vnew_ptr.dtype.element_ty), mask=m_tv)
        last = tl.minimum((i_t + 1) * BT, T) - 1
        g_last = tl.load(g_ptr + (bos + last) * HV + i_h).to(tl.float32)
        b_g = tl.load(g_ptr + rows * HV + i_h, mask=m_t, other=0.0).to(tl.float32)
        b_v = (b_v * tl.where(m_t, tl.exp2(g_last - b_g), 0.0)[:, None]).to(k_ptr.dtype.element_ty)
        b_h1 *= tl.exp2(g_last)
        p_k = k_ptr + rows[None, :] * (H * K) + k_col + o_k[:, None]  # [64, BT]
        b_k = tl.load(p_k, mask=m_t[None, :], other=0.0)
        b_h1 = tl.dot(b_k, b_v, b_h1)
        if K > 64:
            b_h2 *= tl.exp2(g_last)
            b_k = tl.load(p_k + 64, mask=m_t[None, :], other=0.0)
            b_h2 = tl.dot(b_k, b_v, b_h2)
    tl.store(p_s, b_h1.to(pool_ptr.dtype.element_ty), mask=m_v[None, :])
    if K > 64:
        tl.store(p_s + 64 * V, b_h2.to(pool_ptr.dtype.element_ty), mask=m_v[None, :])
    if SAVES:
        final = tl.load(final_ptr + i_n).to(tl.int64)
        if final != 0:
            p_f = pool_ptr + (final * HV + i_h) * K * V + tile
            tl.store(p_f, b_h1.to(pool_ptr.dtype.element_ty), mask=m_v[None, :])
            if K > 64:
                tl.store(p_f + 64 * V, b_h2.to(pool_ptr.dtype.element_ty), mask=m_v[None, :])


_CONFIGS = [
    triton.Config({"BV": bv}, num_warps=warps, num_stages=stages)
    for bv in (32, 64)
    for warps in (2, 4)
    for stages in (2, 3, 4)
]  # fla's search space on Hopper; tuned once per shape at the first (eager) pass, the pool restored after each try
_tuned_kernel = triton.autotune(
    _CONFIGS, key=["H", "HV", "K", "V", "BT"], restore_value=["pool_ptr"],
    cache_results=True,  # the pick on disk with the compiled kernel: a later process benchmarks nothing
)(_state_pass_kernel)  # fmt: skip


def state_pass_(
    k: torch.Tensor,  # [N, H, dk]
    w: torch.Tensor,  # [N, HV, dk]
    u: torch.Tensor,  # [N, HV, dv]
    g: torch.Tensor,  # [N, HV] float32 log2 decays, cumulated within each chunk
    pool: torch.Tensor,  # [slots, HV, dk, dv] the recurrent states, updated in place
    slots: torch.Tensor,  # [S] each sequence's slot
    fresh: torch.Tensor,  # [S] bool: starts from zeros
    cu_seqlens: torch.Tensor,  # [S + 1] int32
    chunk_offsets: torch.Tensor,  # [S + 1] int32: chunks before each sequence
    chunk_rows: int,  # rows of fla's chunk index (>= the chunks of all sequences)
    chunk: int = 64,
    save_slot: torch.Tensor | None = None,  # [chunk_rows] slot receiving the state entering each row (0: none)
    final_slot: torch.Tensor | None = None,  # [S] slot receiving each sequence's final state too (0: none)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The module doc's pass: h [chunk_rows, HV, dk, dv] in k's dtype and v_new [N, HV, dv] in u's; pool updated
    (and the save slots, where ``save_slot`` and ``final_slot`` are given: both or neither). No host sync, fixed
    shapes: capturable."""
    N, H, K = k.shape
    HV, V = u.shape[1], u.shape[2]
    if K not in KEY_DIMS or chunk != 64:
        raise ValueError(f"the state pass takes dk 64 or 128 in 64-token chunks, not dk {K}, chunk {chunk}")
    if pool.shape[1:] != (HV, K, V) or not pool.is_contiguous():
        raise ValueError(f"pool {tuple(pool.shape)} is not contiguous [slots, {HV}, {K}, {V}]")
    k, w, u, g = k.contiguous(), w.contiguous(), u.contiguous(), g.contiguous()
    h = k.new_empty(chunk_rows, HV, K, V)
    v_new = torch.empty_like(u)
    S = slots.shape[0]
    saves = save_slot is not None
    if saves != (final_slot is not None):
        raise ValueError("save_slot and final_slot go together")
    if saves and (save_slot.shape != (chunk_rows,) or final_slot.shape != (S,)):
        raise ValueError(f"save_slot {tuple(save_slot.shape)} / final_slot {tuple(final_slot.shape)} are not "
                         f"[{chunk_rows}] / [{S}]")  # fmt: skip
    args = (k, w, u, g, h, v_new, pool, slots, fresh, cu_seqlens, chunk_offsets,
            save_slot if saves else slots, final_slot if saves else slots)  # fmt: skip
    if interpreted():  # one config: the interpreter's autotuner would only repeat the run
        _state_pass_kernel[(triton.cdiv(V, 32), S * HV)](*args, H=H, HV=HV, K=K, V=V, BT=chunk, BV=32, SAVES=saves)
    else:
        _tuned_kernel[lambda meta: (triton.cdiv(V, meta["BV"]), S * HV)](*args, H=H, HV=HV, K=K, V=V, BT=chunk,
                                                                          SAVES=saves)  # fmt: skip
    return h, v_new
