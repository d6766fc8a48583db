"""gather_rows: fill a bucket's step buffers (``GatherTargets``) from the store rows of the step's slots, in one launch.

Row r reads store row ``s = slot_row[r]`` (0: the all-zero trash row, for padding). For each pool p (``PoolSpan``:
span start ``st``, width W, page size ps, ``A = 1`` for APPEND else 0) with stored length ``L = store[s, len_col]``:
``seq_lens[p][r] = L + A``; ``block_tables[p][r, j] = store[s, st + j]`` for ``j < min(ceil((L + A) / ps), W)``
else 0; APPEND only: ``write_loc[p][r] = page * ps + L % ps`` with ``page = store[s, st + L // ps]`` (0 when
``L // ps >= W``). Narrow cells (``RowColumns``): ``positions[r] = store[s, pos_len_col] + store[s, pos_col]``,
``recurrent_slots[r] = store[s, rec_col]``, ``sampler[r] = store[s, sampler_col : sampler_col + sampler_cells]``.

One program per row; every pool (up to MAX_POOLS) and the narrow cells are handled in the same launch, each pool's
geometry a constexpr, so a layout compiles once. Spans wider than a block are walked in unrolled chunks. The page of
the write is picked out of the already loaded block-table chunk (it always lies in the used columns), so no scalar
mask is needed. No host sync, no allocation.
"""

from __future__ import annotations

import functools
import types

import torch
import triton
import triton.language as tl

from kernels.rows.gather_rows.spec import GatherTargets, RowColumns

MAX_POOLS = 4
MAX_BLOCK_W = 1024


@triton.jit
def _gather_pool(
    row_ptr,
    r,
    bt_ptr,
    sl_ptr,
    wl_ptr,
    START: tl.constexpr,
    W: tl.constexpr,
    LEN_COL: tl.constexpr,
    PS: tl.constexpr,
    APPEND: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    L = tl.load(row_ptr + LEN_COL)
    seq = L + APPEND
    n_used = (seq + (PS - 1)) // PS
    page_idx = L // PS
    offs0 = tl.arange(0, BLOCK_W)
    acc = tl.zeros([BLOCK_W], dtype=tl.int32)
    for c0 in tl.static_range(0, W, BLOCK_W):
        offs = c0 + offs0
        in_w = offs < W
        v = tl.load(row_ptr + START + offs, mask=in_w & (offs < n_used), other=0)
        tl.store(bt_ptr + r * W + offs, v, mask=in_w)
        if APPEND:
            acc += tl.where(offs == page_idx, v, 0)
    tl.store(sl_ptr + r, seq)
    if APPEND:
        page = tl.sum(acc, axis=0)
        tl.store(wl_ptr + r, page * PS + L % PS)


@triton.jit
def _gather_rows_kernel(
    store_ptr,
    slot_ptr,
    bt0,
    sl0,
    wl0,
    bt1,
    sl1,
    wl1,
    bt2,
    sl2,
    wl2,
    bt3,
    sl3,
    wl3,
    pos_ptr,
    rec_ptr,
    smp_ptr,
    ROW_W: tl.constexpr,
    N_POOLS: tl.constexpr,
    START0: tl.constexpr,
    W0: tl.constexpr,
    LC0: tl.constexpr,
    PS0: tl.constexpr,
    APP0: tl.constexpr,
    BW0: tl.constexpr,
    START1: tl.constexpr,
    W1: tl.constexpr,
    LC1: tl.constexpr,
    PS1: tl.constexpr,
    APP1: tl.constexpr,
    BW1: tl.constexpr,
    START2: tl.constexpr,
    W2: tl.constexpr,
    LC2: tl.constexpr,
    PS2: tl.constexpr,
    APP2: tl.constexpr,
    BW2: tl.constexpr,
    START3: tl.constexpr,
    W3: tl.constexpr,
    LC3: tl.constexpr,
    PS3: tl.constexpr,
    APP3: tl.constexpr,
    BW3: tl.constexpr,
    POS_LEN_COL: tl.constexpr,
    POS_COL: tl.constexpr,
    REC_COL: tl.constexpr,
    SMP_COL: tl.constexpr,
    N_SMP: tl.constexpr,
):
    r = tl.program_id(0)
    slot = tl.load(slot_ptr + r)
    row_ptr = store_ptr + slot.to(tl.int64) * ROW_W
    if N_POOLS > 0:
        _gather_pool(row_ptr, r, bt0, sl0, wl0, START0, W0, LC0, PS0, APP0, BW0)
    if N_POOLS > 1:
        _gather_pool(row_ptr, r, bt1, sl1, wl1, START1, W1, LC1, PS1, APP1, BW1)
    if N_POOLS > 2:
        _gather_pool(row_ptr, r, bt2, sl2, wl2, START2, W2, LC2, PS2, APP2, BW2)
    if N_POOLS > 3:
        _gather_pool(row_ptr, r, bt3, sl3, wl3, START3, W3, LC3, PS3, APP3, BW3)
    if POS_COL >= 0:
        tl.store(pos_ptr + r, tl.load(row_ptr + POS_LEN_COL) + tl.load(row_ptr + POS_COL))
    if REC_COL >= 0:
        tl.store(rec_ptr + r, tl.load(row_ptr + REC_COL))
    if SMP_COL >= 0:
        o = tl.arange(0, N_SMP)
        tl.store(smp_ptr + r * N_SMP + o, tl.load(row_ptr + SMP_COL + o))


@functools.cache
def _launch_config(cols: RowColumns, max_block_w: int) -> tuple[types.MappingProxyType, int]:
    """(constexpr kwargs, num_warps) for a row's columns; computed once per value."""
    assert len(cols.pools) <= MAX_POOLS, f"gather_rows handles at most {MAX_POOLS} pools, got {len(cols.pools)}"
    n_smp = cols.sampler_cells
    assert n_smp & (n_smp - 1) == 0, "sampler cells must be a power of two"
    consts: dict[str, int] = {"ROW_W": cols.width, "N_POOLS": len(cols.pools)}
    max_bw = 1
    for k in range(MAX_POOLS):
        if k < len(cols.pools):
            p = cols.pools[k]
            bw = min(triton.next_power_of_2(p.width), max_block_w)
            max_bw = max(max_bw, bw)
            vals = (p.start, p.width, p.len_col, p.page_size, int(p.append), bw)
        else:
            vals = (0, 1, 0, 1, 0, 1)  # never traced: N_POOLS guards it
        for name, v in zip(("START", "W", "LC", "PS", "APP", "BW"), vals, strict=True):
            consts[f"{name}{k}"] = v
    consts["POS_LEN_COL"] = cols.pos_len_col if cols.pos_col >= 0 else -1
    consts["POS_COL"] = cols.pos_col
    consts["REC_COL"] = cols.rec_col
    consts["SMP_COL"] = cols.sampler_col
    consts["N_SMP"] = n_smp
    return types.MappingProxyType(consts), max(1, min(4, max_bw // 128))


def _check_out(t: torch.Tensor | None, shape: tuple[int, ...], store: torch.Tensor, name: str) -> None:
    assert t is not None, f"{name}: missing buffer"
    assert t.dtype == torch.int32 and tuple(t.shape) == shape and t.is_contiguous(), (
        f"{name}: want contiguous int32 {shape}, got {t.dtype} {tuple(t.shape)}"
    )
    assert t.device == store.device, f"{name}: on {t.device}, store on {store.device}"


def gather_rows(
    store: torch.Tensor,  # [S, width] int32
    slot_row: torch.Tensor,  # [b] int32, 0 = the trash row
    cols: RowColumns,
    out: GatherTargets,  # of b rows
    *,
    max_block_w: int = MAX_BLOCK_W,
) -> None:
    """out[r] <- the step view of store[slot_row[r]] (block tables, seq_lens, write_loc, narrow cells), in place."""
    assert store.dtype == torch.int32 and store.dim() == 2 and store.is_contiguous(), "store: contiguous int32 [S, W]"
    assert store.shape[1] == cols.width, f"store rows have {store.shape[1]} cells, the columns {cols.width}"
    assert slot_row.dtype == torch.int32 and slot_row.dim() == 1 and slot_row.is_contiguous(), "slot_row: int32 [b]"
    assert slot_row.device == store.device, "store and slot_row must share a device"
    b = slot_row.shape[0]
    assert out.size == b, f"slot_row has {b} rows, buffers {out.size}"
    assert len(out.block_tables) == len(out.seq_lens) == len(out.write_loc) == len(cols.pools), "one buffer a pool"
    if b == 0:
        return
    consts, num_warps = _launch_config(cols, max_block_w)
    ptrs: dict[str, torch.Tensor] = {}
    for k in range(MAX_POOLS):
        if k < len(cols.pools):
            bt, sl, wl = out.block_tables[k], out.seq_lens[k], out.write_loc[k]
            _check_out(bt, (b, consts[f"W{k}"]), store, f"block_tables[{k}]")
            _check_out(sl, (b,), store, f"seq_lens[{k}]")
            if consts[f"APP{k}"]:
                _check_out(wl, (b,), store, f"write_loc[{k}]")
            else:
                wl = store  # never touched: READ pools write no location
        else:
            bt = sl = wl = store  # never touched: N_POOLS guards it
        ptrs[f"bt{k}"], ptrs[f"sl{k}"], ptrs[f"wl{k}"] = bt, sl, wl
    narrow = {"pos_ptr": ("positions", (b,), "POS_COL"), "rec_ptr": ("recurrent_slots", (b,), "REC_COL"),
              "smp_ptr": ("sampler", (b, cols.sampler_cells), "SMP_COL")}  # fmt: skip
    for arg, (name, shape, col) in narrow.items():
        t = getattr(out, name)
        if consts[col] >= 0:
            _check_out(t, shape, store, name)
            ptrs[arg] = t
        else:
            ptrs[arg] = store  # never touched: the row has no such cell
    _gather_rows_kernel[(b,)](store_ptr=store, slot_ptr=slot_row, **ptrs, **consts, num_warps=num_warps)
