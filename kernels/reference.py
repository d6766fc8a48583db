"""Torch references of the resident-row kernels: the same functions, same signatures, in place.

They define the semantics the Triton kernels in this package are tested against, and run anywhere torch runs.
``gather_rows_ref`` and ``commit_lengths_ref`` are vectorised and sync-free; ``scatter_cells_ref`` reads the staged
count on the host (it is a reference, not a capture-safe path).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.layers.gdn import causal_conv1d_step, gated_delta_step
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
