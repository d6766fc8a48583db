"""The torch reference of ``gather_rows``: same signature, in place, vectorised and sync-free."""

from __future__ import annotations

import torch

from kernels.rows.gather_rows.spec import GatherTargets, RowColumns


def gather_rows_ref(store: torch.Tensor, slot_row: torch.Tensor, cols: RowColumns, out: GatherTargets) -> None:
    """out[r] <- the step view of store[slot_row[r]] (block tables, seq_lens, write_loc, narrow cells), in place."""
    rows = store[slot_row.long()]  # [b, width]
    for p, bt, sl, wl in zip(cols.pools, out.block_tables, out.seq_lens, out.write_loc, strict=True):
        ps, width, append = p.page_size, p.width, int(p.append)
        L = rows[:, p.len_col]
        seq = L + append
        n_used = (seq + ps - 1) // ps
        span = rows[:, p.start : p.start + width]
        j = torch.arange(width, device=store.device)
        bt.copy_(torch.where(j[None, :] < n_used[:, None], span, 0))
        sl.copy_(seq)
        if append:
            idx = (L // ps).long()
            page = span.gather(1, idx.clamp(max=width - 1)[:, None])[:, 0]
            page = torch.where(idx < width, page, 0)
            wl.copy_(page * ps + L % ps)
    if cols.pos_col >= 0:
        out.positions.copy_(rows[:, cols.pos_len_col] + rows[:, cols.pos_col])
    if cols.rec_col >= 0:
        out.recurrent_slots.copy_(rows[:, cols.rec_col])
    if cols.sampler_col >= 0:
        out.sampler.copy_(rows[:, cols.sampler_col : cols.sampler_col + cols.sampler_cells])
