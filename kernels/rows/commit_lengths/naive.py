"""The torch reference of ``commit_lengths``: same signature, in place, sync-free."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def commit_lengths_ref(store: torch.Tensor, slot_row: torch.Tensor, len_cols: Sequence[int]) -> None:
    """store[s, c] += 1 for each s = slot_row[r] != 0 and each c in len_cols (in place)."""
    slots = slot_row.long()
    live = (slots != 0).to(store.dtype)
    for c in len_cols:
        cols = torch.full_like(slots, c)
        store.index_put_((slots, cols), live, accumulate=True)  # padding rows add 0 to the trash row
