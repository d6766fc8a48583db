"""commit_lengths: after a decode forward, add 1 to the stored length of each APPEND pool for every live row.

``store[slot, c] += 1`` for each ``slot = slot_row[r] != 0`` and each column ``c`` of ``len_cols`` (the APPEND pools'
KV_LEN columns, static). Slots in one slot row are distinct apart from repeated 0s (padding), so the programs never
collide. Programs tile the rows in blocks; the columns are a constexpr bit mask. No host sync, no allocation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

MAX_BLOCK = 1024


@triton.jit
def _commit_lengths_kernel(
    store_ptr,
    slot_ptr,
    b,
    ROW_W: tl.constexpr,
    COL_MASK: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    c = tl.arange(0, BLOCK_C)
    sel = ((tl.full([BLOCK_C], COL_MASK, tl.int32) >> c) & 1) != 0
    slot = tl.load(slot_ptr + r, mask=r < b, other=0)
    m = (slot != 0)[:, None] & sel[None, :]
    ptr = store_ptr + slot.to(tl.int64)[:, None] * ROW_W + c[None, :]
    v = tl.load(ptr, mask=m, other=0)
    tl.store(ptr, v + 1, mask=m)


@functools.cache
def _col_config(len_cols: tuple[int, ...]) -> tuple[int, int]:
    """(COL_MASK, BLOCK_C) for a static set of length columns."""
    assert len(set(len_cols)) == len(len_cols), f"len_cols must be distinct, got {len_cols}"
    assert all(0 <= c < 31 for c in len_cols), f"len_cols must lie in [0, 31), got {len_cols}"
    mask = sum(1 << c for c in len_cols)
    return mask, triton.next_power_of_2(max(len_cols, default=0) + 1)


def commit_lengths(
    store: torch.Tensor, slot_row: torch.Tensor, len_cols: Sequence[int], *, max_block: int = MAX_BLOCK
) -> None:
    """store[s, c] += 1 for each s = slot_row[r] != 0 and each c in len_cols (in place)."""
    assert store.dtype == torch.int32 and store.dim() == 2 and store.is_contiguous(), "store: contiguous int32 [S, W]"
    assert slot_row.dtype == torch.int32 and slot_row.dim() == 1 and slot_row.is_contiguous(), "slot_row: int32 [b]"
    assert slot_row.device == store.device, "store and slot_row must share a device"
    len_cols = tuple(len_cols)
    b = slot_row.shape[0]
    if not len_cols or b == 0:
        return
    col_mask, block_c = _col_config(len_cols)
    assert max(len_cols) < store.shape[1], f"len_cols {len_cols} past the row width {store.shape[1]}"
    block_b = min(triton.next_power_of_2(b), max_block)
    _commit_lengths_kernel[(triton.cdiv(b, block_b),)](
        store_ptr=store,
        slot_ptr=slot_row,
        b=b,
        ROW_W=store.shape[1],
        COL_MASK=col_mask,
        BLOCK_B=block_b,
        BLOCK_C=block_c,
        num_warps=max(1, min(4, block_b * block_c // 256)),
    )
