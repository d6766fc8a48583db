"""Torch references of the resident-row kernels: the same functions, same signatures, in place.

They define the semantics the Triton kernels in this package are tested against, and run anywhere torch runs.
``gather_rows_ref`` and ``commit_lengths_ref`` are vectorised and sync-free; ``scatter_cells_ref`` reads the staged
count on the host (it is a reference, not a capture-safe path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from models.layers.gdn import causal_conv1d_step, gated_delta_step, gdn_gates, normalize_qk
from models.layers.norms import gated_rms_norm, rms_normalize
from models.layers.paged import write_kv
from models.layers.rope import apply_partial_rope
from resplan.buffers import StepBuffers
from resplan.layout import SAMPLER_CELLS, RowLayout, StreamMode


def scatter_cells_ref(store: torch.Tensor, staging: torch.Tensor) -> None:
    """store.view(-1)[staging[2 + 2i]] = staging[3 + 2i] for i < staging[0]; then staging[0] = 0 (in place)."""
    n = int(staging[0])
    entries = staging[2 : 2 + 2 * n].view(n, 2).long()
    store.view(-1)[entries[:, 0]] = entries[:, 1].to(store.dtype)
    staging[0] = 0


def gather_rows_ref(store: torch.Tensor, slot_row: torch.Tensor, layout: RowLayout, bufs: StepBuffers) -> None:
    """bufs[r] <- the step view of store[slot_row[r]] (block tables, seq_lens, write_loc, narrow cells), in place."""
    rows = store[slot_row.long()]  # [b, width]
    for p in layout.pools:
        sp = layout.span(p.key)
        ps, width, append = sp.page_size, sp.width, int(sp.mode is StreamMode.APPEND)
        L = rows[:, layout.len_col(p.key)]
        seq = L + append
        n_used = (seq + ps - 1) // ps
        span = rows[:, sp.start : sp.start + width]
        j = torch.arange(width, device=store.device)
        bufs.block_tables[p.key].copy_(torch.where(j[None, :] < n_used[:, None], span, 0))
        bufs.seq_lens[p.key].copy_(seq)
        if append:
            idx = (L // ps).long()
            page = span.gather(1, idx.clamp(max=width - 1)[:, None])[:, 0]
            page = torch.where(idx < width, page, 0)
            bufs.write_loc[p.key].copy_(page * ps + L % ps)
    if layout.positions_pool is not None:
        bufs.positions.copy_(rows[:, layout.len_col(layout.positions_pool)] + rows[:, layout.pos_col])
    if layout.recurrent:
        bufs.recurrent_slots.copy_(rows[:, layout.rec_col])
    if layout.sampler:
        bufs.sampler.copy_(rows[:, layout.sampler_col : layout.sampler_col + len(SAMPLER_CELLS)])


def commit_lengths_ref(store: torch.Tensor, slot_row: torch.Tensor, len_cols: Sequence[int]) -> None:
    """store[s, c] += 1 for each s = slot_row[r] != 0 and each c in len_cols (in place)."""
    slots = slot_row.long()
    live = (slots != 0).to(store.dtype)
    for c in len_cols:
        cols = torch.full_like(slots, c)
        store.index_put_((slots, cols), live, accumulate=True)  # padding rows add 0 to the trash row


def gdn_decode_step_ref(
    ssm_pool: torch.Tensor,
    slots: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """gated_delta_step on ssm_pool[slots] (float32), scattered back in the pool's dtype; o into out (in place).

    q, k [b, hk, dk] are repeated to the hv value heads (value head h reads key head h // (hv // hk)).
    """
    idx = slots.long()
    n_rep = ssm_pool.shape[1] // q.shape[1]
    if n_rep > 1:
        q, k = q.repeat_interleave(n_rep, dim=1), k.repeat_interleave(n_rep, dim=1)
    o, ssm1 = gated_delta_step(ssm_pool[idx].float(), q.float(), k.float(), v.float(), g.float(), beta.float())
    ssm_pool[idx] = ssm1.to(ssm_pool.dtype)
    out.copy_(o)


def conv1d_decode_step_ref(
    conv_pool: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """causal_conv1d_step on conv_pool[slots], new state scattered back (in place); returns silu(conv) [b, C]."""
    idx = slots.long()
    y, conv1 = causal_conv1d_step(x, conv_pool[idx], weight)
    conv_pool[idx] = conv1
    if out is None:
        return y
    out.copy_(y)
    return out


def gdn_decode_raw_step_ref(ssm_pool, slots, q, k, v, a, b, A_log, dt_bias, out) -> None:
    """gdn_decode_step_ref after normalize_qk(q, k, 1) and gdn_gates(a, b, A_log, dt_bias)."""
    qn, kn = normalize_qk(q, k, 1)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    gdn_decode_step_ref(ssm_pool, slots, qn, kn, v, g, beta, out)


# -- the fused decode step's row ops: the model's torch path, op for op ----------------------------------------------


def add_rms_norm_ref(h, delta, weight, eps, *, zero_centered=True, out=None):
    """h += delta (in h's dtype), then rms_normalize(h) * (1 + w) (or * w), cast to h's dtype."""
    if delta is not None:
        h.copy_(h + delta)
    w = 1.0 + weight.float() if zero_centered else weight.float()
    y = rms_normalize(h, eps, w).to(h.dtype)
    return y if out is None else out.copy_(y)


def gated_rms_norm_ref(o, z, weight, eps, out=None):
    """GatedRMSNorm(o, z) per head, flattened: [n, H * D] in weight's dtype."""
    n, H, D = o.shape
    y = gated_rms_norm(o.to(weight.dtype), z.reshape(n, H, D), weight, eps).reshape(n, H * D)
    return y if out is None else out.copy_(y)


def silu_mul_ref(gu, out=None):
    """silu(gate) * up on the halves of gu [n, 2I], in float32, cast once."""
    g, u = gu.float().chunk(2, dim=-1)
    y = (F.silu(g) * u).to(gu.dtype)
    return y if out is None else out.copy_(y)


def sigmoid_gate_mul_ref(o, qkv, out=None):
    """o [n, H, D] * sigmoid(gate) with head h's gate at qkv[:, h * 2D + D : (h + 1) * 2D], flattened."""
    n, H, D = o.shape
    gate = qkv[:, : H * 2 * D].reshape(n, H, 2 * D)[..., D:]
    y = (o.float() * torch.sigmoid(gate.float())).to(o.dtype).reshape(n, H * D)
    return y if out is None else out.copy_(y)


def attention_prep_ref(qkv, q_weight, k_weight, cos, sin, kv, write_loc, num_q_heads, eps, q_out=None):
    """GatedAttention._qkv's norms and RoPE on the fused projection, K/V written at write_loc; returns q."""
    n = qkv.shape[0]
    hq, hk, d = num_q_heads, kv.shape[3], kv.shape[4]
    q = qkv[:, : hq * 2 * d].reshape(n, hq, 2 * d)[..., :d]
    k = qkv[:, hq * 2 * d : hq * 2 * d + hk * d].reshape(n, hk, d)
    v = qkv[:, hq * 2 * d + hk * d :].reshape(n, hk, d)

    def norm(x, w):
        return rms_normalize(x, eps, 1.0 + w.float()).to(x.dtype)

    q = _rope_f32(norm(q, q_weight), cos, sin)
    k = _rope_f32(norm(k, k_weight), cos, sin)
    write_kv(kv, write_loc, k, v)
    return q if q_out is None else q_out.copy_(q)


def _rope_f32(x, cos, sin):
    """apply_partial_rope in float32, cast back once (the kernel rounds once where the torch path rounds thrice)."""
    return apply_partial_rope(x.float(), cos.float(), sin.float()).to(x.dtype)
