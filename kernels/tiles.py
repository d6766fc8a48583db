"""The vocabulary's tiles: one program a (row, tile of BLOCK logits), as greedy's argmax and the sampled draw read
the lm_head's output."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_row_tile(x_ptr, x_r, V, BLOCK: tl.constexpr):
    """(row r, positions [BLOCK] of tile t in the row, their mask < V, the logits there as float32 (0 past V)) of
    program (r, t) over x [rows, V] with row stride x_r."""
    r = tl.program_id(0)
    at = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = at < V
    v = tl.load(x_ptr + r.to(tl.int64) * x_r + at, mask=valid, other=0.0).to(tl.float32)
    return r, at, valid, v
