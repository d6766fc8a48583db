"""The torch reference of ``gather_rows``: same signature, in place, vectorised and sync-free."""

from __future__ import annotations

import torch

from resplan.buffers import StepBuffers
from resplan.layout import SAMPLER_CELLS, RowLayout, StreamMode


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
