"""scatter_cells: apply a staged upload of (flat index, value) cells to the store, then clear the staged count.

Staging buffer, int32 ``[2 + 2 * cap]``: ``staging[0] = n`` entries, ``staging[1]`` unused, entry ``i < n`` is
``(staging[2 + 2i], staging[3 + 2i]) = (slot * row_width + col, value)``. The kernel writes
``store.view(-1)[idx_i] = val_i`` for ``i < n`` (indices are distinct), then sets ``staging[0] = 0`` so a graph replay
with no new upload scatters nothing. One program; it loops over ``cap`` in blocks. No host sync, no allocation.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

MAX_BLOCK = 1024


@triton.jit
def _scatter_cells_kernel(store_ptr, staging_ptr, CAP: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.load(staging_ptr)  # every thread reads the count before anyone clears it (barrier below)
    offs0 = tl.arange(0, BLOCK)
    for start in tl.static_range(0, CAP, BLOCK):
        i = start + offs0
        m = (i < n) & (i < CAP)
        idx = tl.load(staging_ptr + 2 + 2 * i, mask=m, other=0)
        val = tl.load(staging_ptr + 3 + 2 * i, mask=m, other=0)
        tl.store(store_ptr + idx.to(tl.int64), val, mask=m)
    tl.debug_barrier()
    tl.store(staging_ptr, n * 0)


@functools.cache
def _launch_config(cap: int, max_block: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a staging capacity."""
    block = min(triton.next_power_of_2(max(cap, 1)), max_block)
    return block, max(1, min(4, block // 128))


def scatter_cells(store: torch.Tensor, staging: torch.Tensor, *, max_block: int = MAX_BLOCK) -> None:
    """store.view(-1)[staging[2 + 2i]] = staging[3 + 2i] for i < staging[0]; then staging[0] = 0 (in place)."""
    assert store.dtype == torch.int32 and store.dim() == 2 and store.is_contiguous(), "store: contiguous int32 [S, W]"
    assert staging.dtype == torch.int32 and staging.dim() == 1 and staging.is_contiguous(), "staging: int32 [2+2cap]"
    assert staging.numel() >= 2 and staging.numel() % 2 == 0, f"staging length must be 2 + 2*cap, got {staging.numel()}"
    assert staging.device == store.device, "store and staging must share a device"
    assert store.numel() < 2**31, "flat cell indices are int32"
    cap = (staging.numel() - 2) // 2
    block, num_warps = _launch_config(cap, max_block)
    _scatter_cells_kernel[(1,)](store_ptr=store, staging_ptr=staging, CAP=cap, BLOCK=block, num_warps=num_warps)
