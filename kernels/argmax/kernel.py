"""Greedy decoding's draw: ``out[r]`` = the first index of the largest of ``logits[r]``, a NaN counting as the largest
(as ``torch.argmax``), written straight into the step's token buffer: on CUDA a greedy step's draw by default
(``KernelChoices.argmax``). On an H100, 2.8 / 7.2 / 19.0 us a call at 1 / 16 / 64 rows of the 0.8B vocabulary against
torch's argmax and copy's 10.2 / 17.0 / 33.1 (models/bench/results/argmax-h100/).

Two launches, no atomics. ``_tile_kernel``: one program a (row, tile of ``BLOCK`` logits), each storing its tile's
(best value, first index) as a partial; ``_row_kernel``: one program a row, combining the row's partials in tile order
(tile t holds indices below tile t + 1's, so among equal maxima the first tile's wins, and within a tile the first
index) into ``out[r]``. A row of one tile takes the first launch only, which writes ``out`` itself.

Why this form: a first version (one launch; each of a row's chunks counting itself done on the row's counter, the
last combining) measured twice torch's time on an H100 (22 us against 10 at one row of the 0.8B vocabulary; 79
against 33 at 64 rows; models/bench/results/gemv-search/swap-h100/): at one row its 122 programs' acq_rel atomics
met on one address, and at 64 rows each program walked 31 tiles one after another. Here every program reads one tile
and no two touch one address.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait
from kernels.runtime import stream_workspace
from kernels.tiles import load_row_tile

BLOCK = 2048  # logits a program of the first launch reduces
MAX_PARTIALS = 1 << 20  # (value, index) partials a workspace holds: rows x tiles
MAX_INDEX = 2**31 - 1  # vocabularies hold fewer logits than this (indices are int32)
NO_INDEX = tl.constexpr(MAX_INDEX)  # the index of a candidate that does not exist (a padded partial)


@triton.jit
def _best(v, idx, valid):
    """(value, index) of the best of candidates ``v`` at indices ``idx`` (a 1-d block; ``valid`` masks the real ones):
    the first NaN (value NaN) if one is valid, else the largest (-inf where nothing is valid) at its first index."""
    nan = (v != v) & valid
    vm = tl.where(valid & ~nan, v, float("-inf"))
    top = tl.max(vm, axis=0)
    first = tl.min(tl.where(valid & (vm == top), idx, NO_INDEX), axis=0)
    first_nan = tl.min(tl.where(nan, idx, NO_INDEX), axis=0)
    has_nan = first_nan < NO_INDEX
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, first_nan, first)


@triton.jit
def _tile_kernel(
    x_ptr,  # [rows, V] logits
    out_ptr,  # [rows] int64 or int32 (written here when a row is one tile)
    part_v_ptr,  # [rows, TILES] float32: each tile's best value (NaN: the tile holds a NaN)
    part_i_ptr,  # [rows, TILES] int32: its first index
    V,
    x_r,
    TILES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: the logits are the step's lm_head output
    r, at, valid, v = load_row_tile(x_ptr, x_r, V, BLOCK)
    val, idx = _best(v, at, valid)
    if TILES == 1:
        tl.store(out_ptr + r, idx.to(out_ptr.dtype.element_ty))
    else:
        t = tl.program_id(1)
        tl.store(part_v_ptr + r * TILES + t, val)
        tl.store(part_i_ptr + r * TILES + t, idx)


@triton.jit
def _row_kernel(
    out_ptr,  # [rows] int64 or int32
    part_v_ptr,  # [rows, TILES] float32
    part_i_ptr,  # [rows, TILES] int32
    TILES: tl.constexpr,
    TILES_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # the partials are the first launch's
    r = tl.program_id(0)
    ts = tl.arange(0, TILES_PAD)
    valid = ts < TILES
    v = tl.load(part_v_ptr + r * TILES + ts, mask=valid, other=float("-inf"))
    i = tl.load(part_i_ptr + r * TILES + ts, mask=valid, other=NO_INDEX)
    _, idx = _best(v, i, valid)  # (tiles in index order: the first tile among equal maxima holds the first index)
    tl.store(out_ptr + r, idx.to(out_ptr.dtype.element_ty))


def _partials(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Values [MAX_PARTIALS] float32, indices [MAX_PARTIALS] int32. Every launch writes what it reads: nothing carries
    over."""
    return (torch.empty(MAX_PARTIALS, dtype=torch.float32, device=device),
            torch.empty(MAX_PARTIALS, dtype=torch.int32, device=device))  # fmt: skip


_workspace = stream_workspace("argmax workspace", _partials)  # (kernels.runtime: one a stream, made before capture)


def argmax_rows(
    logits: torch.Tensor,  # [rows, V], unit stride in V
    out: torch.Tensor,  # [rows] int64 or int32
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """out[r] = argmax(logits[r]) (the first index of the largest; NaN the largest), as torch.argmax; see module doc."""
    rows, V = logits.shape
    assert logits.stride(-1) == 1 and out.shape == (rows,) and out.dtype in (torch.int64, torch.int32), (
        logits.shape, out.shape, out.dtype)  # fmt: skip
    assert 0 < V < MAX_INDEX, f"a vocabulary of {V} logits: indices must fit int32"
    if rows == 0:
        return out
    tiles = triton.cdiv(V, BLOCK)
    assert rows * tiles <= MAX_PARTIALS, f"{rows} rows of {tiles} tiles: more partials than the workspace holds"
    part_v, part_i = _workspace(logits.device)
    opts = launch_options(pdl)
    _tile_kernel[(rows, tiles)](logits, out, part_v, part_i, V, logits.stride(0), TILES=tiles, BLOCK=BLOCK,
                                num_warps=4, **opts)  # fmt: skip
    if tiles > 1:
        _row_kernel[(rows,)](out, part_v, part_i, TILES=tiles, TILES_PAD=triton.next_power_of_2(tiles), num_warps=4,
                             **opts)  # fmt: skip
    return out
