"""A sampled step's draw over the whole vocabulary in two launches: each row's head (its ``K`` largest scaled logits,
ordered by value descending then id ascending, a NaN the largest) found exactly without sorting the vocabulary, then
top-k, top-p and the Gumbel-max draw on the head, as ``naive.sample_rows_ref``.

``_select_tile_kernel``, one program a (row, tile of ``BLOCK`` logits): sets the row's banned stop ids to -inf, maps
each value to a key whose unsigned order is the value's, and keeps the tile's ``K`` largest keys by a radix select
(8-bit digits from the top, each a 256-bin histogram of the keys still tied with the threshold's digits so far; the
threshold's ties go to the first indices), written in index order into the row's candidates. Float32 logits are
scaled first (logits / temperature; a temperature of 0 divides by 1) and keyed by 32 bits, four digits; bf16 logits
are keyed unscaled by their own 16 bits, two digits (a positive temperature keeps their order and their ties, and
the second launch scales the head). ``_draw_row_kernel``, one program a row: the same select
over the row's tiles' candidates (in index order: tile t's before tile t + 1's) gives the head, which it sorts (K keys,
each packed with its id), then draws.

Why: the torch sampler (``topk`` of 256 over 248,320 logits, then ~20 small ops) cost 236 us at one row and 602 at 64
on an H100, a quarter of a sampled decode step; this draw, on bf16 logits, 61 and 453 (``faster_than_torch``;
models/bench/results/sampler-h100/).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.pdl import launch_options, pdl_wait
from kernels.runtime import stream_workspace
from kernels.sample.naive import CellColumns
from kernels.tiles import load_row_tile

BLOCK = 8192  # logits a program of the first launch selects from
TILE_WARPS = 16  # warps a program of the first launch
ROW_WARPS = 16  # and of the second (BLOCK and both warps: the fastest of 4096-16384 x 8-32 at 1, 16 and 64 rows, H100)
MAX_CANDIDATES = 1 << 22  # (key, id) candidates the workspace holds: rows x tiles x K of one launch pair
MAX_ID = 2**31 - 1  # vocabularies hold fewer logits than this (ids are int32)
_NO_ID = tl.constexpr(-1)  # the id of an empty candidate slot
_MAX_ID = tl.constexpr(MAX_ID)


@triton.jit
def _key(v):
    """float32 -> uint32 whose order is the value's: -0.0 as 0.0, every NaN the largest key."""
    v = v + 0.0  # (-0.0 + 0.0 = 0.0)
    u = v.to(tl.uint32, bitcast=True)
    k = tl.where((u >> 31) != 0, u ^ 0xFFFFFFFF, u | 0x80000000)
    return tl.where(v != v, 0xFFFFFFFF, k)


@triton.jit
def _value(k):
    """The inverse of ``_key`` (a NaN's key gives a NaN)."""
    u = tl.where((k >> 31) != 0, k & 0x7FFFFFFF, k ^ 0xFFFFFFFF)
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _select(k, valid, need, BITS: tl.constexpr):
    """The mask of the ``need`` largest of keys ``k`` (a 1-d block of uint32 below 2^BITS; ``valid`` masks the real
    ones), ties at the threshold going to the first positions; every valid key where fewer than ``need`` are valid."""
    bins = tl.arange(0, 512)
    match = valid
    above = need * 0  # keys found above the threshold so far (`match`: those still tied with its digits)
    for r in tl.static_range(BITS // 8):
        shift = BITS - 8 - 8 * r
        digit = ((k >> shift) & 255).to(tl.int32)
        h = tl.histogram(tl.where(match, digit + 256, 0), 512)  # [512]: bins 256 + d count the tied keys' digit d
        h = tl.where(bins >= 256, h, 0)
        s = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # [512] keys still tied whose digit is >= the bin's
        d = tl.sum((s >= need - above).to(tl.int32), axis=0) - 1  # the threshold's digit (+256); -1: too few
        above += tl.sum(tl.where(bins == d, s - h, 0), axis=0)
        match = match & (digit == d - 256)
    ties = match  # keys equal to the threshold
    rank = tl.cumsum(ties.to(tl.int32), axis=0) - 1
    thr = tl.max(tl.where(ties, k, 0), axis=0)
    take = (valid & (k > thr)) | (ties & (rank < need - above))
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    return tl.where(n_valid <= need, valid, take)


@triton.jit
def _compact(take, k, ids, key_ptr, id_ptr, SLOTS: tl.constexpr, SLOTS_PAD: tl.constexpr):
    """Store the taken (key, id) pairs, in block order, in slots [0, n) of ``key_ptr`` / ``id_ptr`` and mark the rest
    of the ``SLOTS`` slots empty (id -1). ``SLOTS_PAD``: a power of two >= SLOTS."""
    at = tl.cumsum(take.to(tl.int32), axis=0) - 1
    tl.store(key_ptr + at, k, mask=take)
    tl.store(id_ptr + at, ids, mask=take)
    n = tl.sum(take.to(tl.int32), axis=0)
    slot = tl.arange(0, SLOTS_PAD)
    empty = (slot >= n) & (slot < SLOTS)
    tl.store(key_ptr + slot, tl.zeros([SLOTS_PAD], tl.uint32), mask=empty)
    tl.store(id_ptr + slot, tl.full([SLOTS_PAD], _NO_ID, tl.int32), mask=empty)


@triton.jit
def _select_tile_kernel(
    x_ptr,  # [rows, V] logits
    cells_ptr,  # [rows, WIDTH] int32
    pos_ptr,  # [rows] int: each row's position
    cand_k_ptr,  # [rows, TILES, K] uint32 keys
    cand_i_ptr,  # [rows, TILES, K] int32 ids (-1: empty)
    V,
    x_r,
    TILES: tl.constexpr,
    K: tl.constexpr,  # the head's length: min(V, candidates)
    K_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,  # the cells' columns (CellColumns)
    TEMPERATURE: tl.constexpr,
    MIN_POSITION: tl.constexpr,
    STOP_0: tl.constexpr,
    STOPS: tl.constexpr,
    BITS: tl.constexpr,  # 16: bf16 logits, keyed by their own 16 bits (two digits); 32: the scaled float32 values
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: the logits are the step's lm_head output
    r, at, valid, v = load_row_tile(x_ptr, x_r, V, BLOCK)
    cell = cells_ptr + r * WIDTH
    temp = tl.load(cell + TEMPERATURE).to(tl.float32, bitcast=True)
    if BITS == 32:  # (bf16 logits are keyed unscaled: a positive temperature keeps their order and their ties)
        v = tl.div_rn(v, tl.where(temp > 0, temp, 1.0))  # (IEEE-rounded, as torch divides)
    banned = tl.load(pos_ptr + r).to(tl.int64) < tl.load(cell + MIN_POSITION).to(tl.int64)
    for j in tl.static_range(STOPS):
        stop = tl.load(cell + STOP_0 + j)
        v = tl.where(banned & (at == stop), float("-inf"), v)
    k = _key(v) >> (32 - BITS)  # (a bf16 value's float32 bits end in 16 zeros: its key in the top 16)
    take = _select(k, valid, K, BITS)
    base = (r * TILES + tl.program_id(1)) * K
    _compact(take, k, at, cand_k_ptr + base, cand_i_ptr + base, K, K_PAD)


@triton.jit
def _hash32(x):
    """lowbias32 on uint32 (``naive.hash32``)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _draw_row_kernel(
    cand_k_ptr,  # [rows, TILES, K] uint32
    cand_i_ptr,  # [rows, TILES, K] int32
    head_k_ptr,  # [rows, K_PAD] uint32: a scratch for the row's head before it is sorted
    head_i_ptr,  # [rows, K_PAD] int32
    cells_ptr,  # [rows, WIDTH] int32
    pos_ptr,  # [rows] int
    out_ptr,  # [rows] int64 or int32: the drawn tokens
    top_ptr,  # [rows, K] int64: the head's ids in order (written where TOP)
    TILES: tl.constexpr,
    K: tl.constexpr,
    K_PAD: tl.constexpr,
    N_PAD: tl.constexpr,  # >= TILES * K, a power of two
    TOP: tl.constexpr,
    WIDTH: tl.constexpr,  # the cells' columns (CellColumns)
    TEMPERATURE: tl.constexpr,
    TOP_P: tl.constexpr,
    TOP_K: tl.constexpr,
    SEED: tl.constexpr,
    BITS: tl.constexpr,  # the first launch's keys (16: unscaled bf16 values)
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # the candidates are the first launch's
    r = tl.program_id(0)
    c = tl.arange(0, N_PAD)
    inside = c < TILES * K
    k = tl.load(cand_k_ptr + r * (TILES * K) + c, mask=inside, other=0)
    ids = tl.load(cand_i_ptr + r * (TILES * K) + c, mask=inside, other=_NO_ID)
    take = _select(k, ids >= 0, K, BITS)  # (candidates in id order: ties at the threshold go to the first ids)
    _compact(take, k, ids, head_k_ptr + r * K_PAD, head_i_ptr + r * K_PAD, K_PAD, K_PAD)
    tl.debug_barrier()  # the head's slots, written above by the program's threads, read below by others
    slot = tl.arange(0, K_PAD)
    hk = tl.load(head_k_ptr + r * K_PAD + slot)
    hi = tl.load(head_i_ptr + r * K_PAD + slot)
    # sort by (key descending, id ascending): an empty slot (id -1) packs below every real one
    top_id = tl.full([K_PAD], _MAX_ID, tl.int32)
    packed = (hk.to(tl.uint64) << 32) | (top_id - hi).to(tl.uint32).to(tl.uint64)
    packed = tl.where(hi >= 0, packed, 0)
    packed = tl.sort(packed, descending=True)
    hk = (packed >> 32).to(tl.uint32)
    hi = top_id - (packed & 0xFFFFFFFF).to(tl.int32)
    real = packed != 0
    hi = tl.where(real, hi, _NO_ID)
    cell = cells_ptr + r * WIDTH
    temp = tl.load(cell + TEMPERATURE).to(tl.float32, bitcast=True)
    full = hk << (32 - BITS)  # the float32 key: a 16-bit key's low half as the value's zero bits were keyed
    if BITS == 16:
        full = full | tl.where((hk >> 15) != 0, 0, 0xFFFF)
    vals = tl.where(real, _value(full), float("-inf"))  # [K_PAD] the head's logits, largest first
    if BITS == 16:
        vals = tl.div_rn(vals, tl.where(temp > 0, temp, 1.0))  # (scaled, IEEE-rounded as torch divides)
    top_p = tl.load(cell + TOP_P).to(tl.float32, bitcast=True)
    top_k = tl.load(cell + TOP_K)
    kk = tl.where(top_k > 0, tl.minimum(top_k, K), K)
    keep = (slot < kk) & real
    m = tl.max(tl.where(keep, vals, float("-inf")), axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # (a row all -inf: no mass anywhere, its head's first drawn)
    e = tl.where(keep, tl.exp(vals - m), 0.0)
    z = tl.sum(e, axis=0)
    probs = e / tl.where(z > 0, z, 1.0)
    before = tl.cumsum(probs, axis=0) - probs
    keep = (keep & (before < top_p)) | (slot == 0)

    seed = tl.load(cell + SEED).to(tl.uint32)
    pos = tl.load(pos_ptr + r).to(tl.uint32)  # (its low 32 bits)
    key = _hash32(_hash32(seed) ^ pos)
    salt = _hash32(hi.to(tl.uint32) * 0x9E3779B9)
    u = ((_hash32(key + salt) >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    score = tl.where(keep, vals - tl.log(-tl.log(u)), float("-inf"))
    best = tl.max(score, axis=0)
    first = tl.min(tl.where(score == best, slot, K_PAD), axis=0)
    drawn = tl.sum(tl.where(slot == first, hi, 0), axis=0)
    greedy = tl.sum(tl.where(slot == 0, hi, 0), axis=0)
    tok = tl.where(temp > 0, drawn, greedy)
    tl.store(out_ptr + r, tok.to(out_ptr.dtype.element_ty))
    if TOP:
        tl.store(top_ptr + r * K + slot, hi.to(tl.int64), mask=slot < K)


def faster_than_torch(rows: int, dtype: torch.dtype) -> bool:
    """Whether this draw was measured faster than the torch sampler's at ``rows`` rows of ``dtype`` logits (an H100,
    the 0.8B vocabulary): bf16 keys of 16 bits at every row count (61 / 138 / 453 us against 236 / 324 / 602 at 1 / 16
    / 64 rows); 32-bit keys (float32 logits) up to 16 rows (94 / 221 us against 236 / 324; 755 against 602 at 64:
    four histograms a program, one program an SM, are the time). models/bench/results/sampler-h100/."""
    return dtype == torch.bfloat16 or rows <= 16


def _buffers(device: torch.device) -> tuple[torch.Tensor, ...]:
    """Candidate keys and ids [MAX_CANDIDATES], head keys and ids [MAX_CANDIDATES // 8]. Every launch writes what it
    reads: nothing carries over."""
    return (torch.empty(MAX_CANDIDATES, dtype=torch.uint32, device=device),
            torch.empty(MAX_CANDIDATES, dtype=torch.int32, device=device),
            torch.empty(MAX_CANDIDATES // 8, dtype=torch.uint32, device=device),
            torch.empty(MAX_CANDIDATES // 8, dtype=torch.int32, device=device))  # fmt: skip


_workspace = stream_workspace("sampler workspace", _buffers)  # (kernels.runtime: one a stream, made before capture)


def sample_rows(
    logits: torch.Tensor,  # [rows, V], unit stride in V
    cells: torch.Tensor,  # [rows, cols.width] int32: the rows' sampler cells
    positions: torch.Tensor,  # [rows] int: the position each row draws at (the noise's counter)
    cols: CellColumns,  # where the cells sit
    out: torch.Tensor,  # [rows] int64 or int32: the drawn tokens
    head: torch.Tensor | None = None,  # [rows, min(V, candidates)] int64: the head's ids in order, where given
    candidates: int = 256,
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
    rows_a_launch: int | None = None,  # rows one launch pair draws; None: as many as the workspace holds
) -> torch.Tensor:
    """out[r] = the token row r draws (``naive.sample_rows_ref``: its head of ``candidates`` by top-k, top-p and
    Gumbel-max; the head's first at temperature 0); ``head`` its head's ids, largest first. See the module doc. Rows
    beyond what the workspace holds at once (~528 of a 248k vocabulary) are drawn by further launch pairs."""
    rows, V = logits.shape
    K = min(V, candidates)
    assert logits.stride(-1) == 1 and cells.shape == (rows, cols.width) and cells.dtype == torch.int32, (
        logits.shape, cells.shape, cells.dtype)  # fmt: skip
    assert cells.is_contiguous() and positions.is_contiguous() and out.is_contiguous(), "cells, positions, out: dense"
    assert head is None or head.is_contiguous(), "head: dense"
    assert out.shape == (rows,) and out.dtype in (torch.int64, torch.int32) and positions.shape == (rows,), (
        out.shape, out.dtype, positions.shape)  # fmt: skip
    assert head is None or (head.shape == (rows, K) and head.dtype == torch.int64), (
        None if head is None else (head.shape, head.dtype))  # fmt: skip
    assert 0 < V < MAX_ID, f"a vocabulary of {V} logits: ids must fit int32"
    assert 0 < candidates <= 1024, f"candidates {candidates}: the head is sorted in one program, of at most 1024"
    if rows == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(V))
    tiles = triton.cdiv(V, block)
    K_PAD = triton.next_power_of_2(K)
    cand_k, cand_i, head_k, head_i = _workspace(logits.device)
    fits = min(cand_k.numel() // (tiles * K), head_k.numel() // K_PAD)
    assert fits > 0, f"a row of {tiles} tiles of {K} candidates: more than the sampler's workspace holds"
    step = min(fits, rows_a_launch or fits)
    bits = 16 if logits.dtype == torch.bfloat16 else 32
    opts = launch_options(pdl)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        x, c, p, o = logits[r0 : r0 + n], cells[r0 : r0 + n], positions[r0 : r0 + n], out[r0 : r0 + n]
        h = head[r0 : r0 + n] if head is not None else o
        _select_tile_kernel[(n, tiles)](x, c, p, cand_k, cand_i, V, x.stride(0), TILES=tiles, K=K, K_PAD=K_PAD,
                                        BLOCK=block, WIDTH=cols.width, TEMPERATURE=cols.temperature,
                                        MIN_POSITION=cols.min_position, STOP_0=cols.stop_0, STOPS=cols.stops, BITS=bits,
                                        num_warps=TILE_WARPS, **opts)  # fmt: skip
        _draw_row_kernel[(n,)](cand_k, cand_i, head_k, head_i, c, p, o, h, TILES=tiles, K=K, K_PAD=K_PAD,
                               N_PAD=triton.next_power_of_2(tiles * K), TOP=head is not None, WIDTH=cols.width,
                               TEMPERATURE=cols.temperature, TOP_P=cols.top_p, TOP_K=cols.top_k, SEED=cols.seed,
                               BITS=bits, num_warps=ROW_WARPS, **opts)  # fmt: skip
    return out
