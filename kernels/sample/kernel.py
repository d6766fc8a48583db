"""A sampled step's draw over the whole vocabulary in three launches: each row's head (its ``K`` largest scaled
logits, ordered by value descending then id ascending, a NaN the largest) found exactly without sorting the
vocabulary, then top-k, top-p and the Gumbel-max draw on the head, as ``naive.sample_rows_ref``.

Every logit is mapped to a key whose unsigned order is the value's (float32 logits scaled first: logits / temperature,
a temperature of 0 dividing by 1, keyed by 32 bits; bf16 logits keyed unscaled by their own 16 bits, since a positive
temperature keeps their order and their ties; a row's banned stop ids -inf). Then:

1. ``_group_max_kernel``, one program a (row, tile of ``BLOCK`` logits): the tile's keys in groups (``tiling``: 16
   groups of 256 logits a tile of Qwen3.5's vocabulary, more where a row would hold too few), each group's largest
   key. K disjoint groups whose maxima are >= b hold K keys >= b, so the K-th largest group
   maximum of a row, ``low``, is at most its K-th largest key: the head lies among the keys >= ``low``. On a row of
   ~1000 groups only ~300 keys reach it (random logits, normal or heavy-tailed). The row's last program to finish
   (a count, fenced as the split-K streams' is) selects ``low`` from the row's maxima by a radix select (8-bit digits
   from the top, each a 256-bin histogram of the keys still tied with the threshold's digits so far). Where asked
   (``lse``, a logprobs step's), each tile also keeps its largest raw logit and its sum of exp(logit - that), and
   the last program combines them into the row's log-sum-exp.
2. ``_tile_head_kernel``, one program a (row, tile): the tile's keys >= ``low``, in index order, into the tile's K
   slots; a tile holding more than K of them keeps its K largest by the same select over the tile (ties at the
   threshold to the first indices).
3. ``_draw_row_kernel``, one program a row: where every tile of the row kept at most ``FAST_W`` keys (``FAST_SLOTS``
   over the tiles), the select of the head reads those few slots a tile, else every tile's K slots; either in index
   order, so that ties go to the first ids. It sorts the head (K keys, each packed with its id) and draws.

Why: the torch sampler (``topk`` of 256 over 248,320 logits, then ~20 small ops) cost 238 / 324 / 605 us at 1 / 16 /
64 rows on an H100, a quarter of a sampled decode step; the two-launch form before this one (every tile's K largest by
the radix select over the whole tile: ~40 us a program, one program an SM) 55 / 133 / 448 us on bf16 logits; this one
25 / 43 / 127 (float32: 37 / 64 / 177), and 430 at 256 rows against torch's 1582. Where a row's head clusters in one
tile (its 400 largest logits on consecutive ids) that tile selects its K largest and the row reads every tile's slots:
91 us at one row (models/bench/results/sampler-three-launches/).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fence import release_fence
from kernels.pdl import launch_options, pdl_wait
from kernels.runtime import interpreted, stream_workspace
from kernels.sample.naive import CellColumns
from kernels.tiles import load_row_tile

# (the tile, groups, warps and fast slots: the fastest of 11 sweeps at 1, 16 and 64 rows on an H200, bf16)
BLOCK = 4096  # logits a tile
GROUPS_A_TILE = 16  # groups a tile's logits are split in for the lower bound, at least (``tiling``)
GROUPS_A_HEAD = 3  # groups a row holds, at least, per logit of its head: the bound's looseness (~300 keys for 256)
GROUP_WARPS = 8  # warps a program of the first launch
TILE_WARPS = 4  # of the second
ROW_WARPS = 8  # of the third
FAST_SLOTS = 1024  # candidates a row's select reads where each tile kept <= FAST_SLOTS / tiles (tiles to 2^n)
MAX_CANDIDATES = 1 << 22  # (key, id) candidates the workspace holds: rows x tiles x K of one launch group
MAX_ROWS = 4096  # rows one launch group draws at most (each row's bound and count)
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
def _radix(k, valid, need, BITS: tl.constexpr):
    """(the mask of the valid keys equal to the ``need``-th largest of keys ``k``, how many valid keys are larger):
    a radix select over ``k`` (a 1-d block of uint32 below 2^BITS; ``valid`` masks the real ones). Where fewer than
    ``need`` are valid the mask is empty."""
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
    return match, above


@triton.jit
def _kth_key(k, valid, need, BITS: tl.constexpr):
    """The ``need``-th largest of the valid keys ``k`` (``_radix``), 0 where fewer are valid."""
    match, above = _radix(k, valid, need, BITS)
    return tl.max(tl.where(match, k, 0), axis=0)


@triton.jit
def _select(k, valid, need, BITS: tl.constexpr):
    """The mask of the ``need`` largest of keys ``k`` (a 1-d block of uint32 below 2^BITS; ``valid`` masks the real
    ones), ties at the threshold going to the first positions; every valid key where fewer than ``need`` are valid."""
    ties, above = _radix(k, valid, need, BITS)  # (ties: the keys equal to the threshold)
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
def _keys(v, at, r, cells_ptr, pos_ptr, WIDTH: tl.constexpr, TEMPERATURE: tl.constexpr, MIN_POSITION: tl.constexpr,
          STOP_0: tl.constexpr, STOPS: tl.constexpr, BITS: tl.constexpr):  # fmt: skip
    """The keys (uint32 below 2^BITS) of row r's logits ``v`` (float32, any shape) at ids ``at``, as the module doc
    says: a banned stop id's logit -inf."""
    cell = cells_ptr + r * WIDTH
    if BITS == 32:  # (bf16 logits are keyed unscaled: a positive temperature keeps their order and their ties)
        temp = tl.load(cell + TEMPERATURE).to(tl.float32, bitcast=True)
        v = tl.div_rn(v, tl.where(temp > 0, temp, 1.0))  # (IEEE-rounded, as torch divides)
    if tl.load(pos_ptr + r).to(tl.int64) < tl.load(cell + MIN_POSITION).to(tl.int64):  # (the row's stops banned)
        for j in tl.static_range(STOPS):
            v = tl.where(at == tl.load(cell + STOP_0 + j), float("-inf"), v)
    return _key(v) >> (32 - BITS)  # (a bf16 value's float32 bits end in 16 zeros: its key in the top 16)


@triton.jit
def _group_max_kernel(
    x_ptr,  # [rows, V] logits
    cells_ptr,  # [rows, WIDTH] int32
    pos_ptr,  # [rows] int: each row's position
    gmax_ptr,  # [rows, TILES, GROUPS] uint32: each group's largest key
    low_ptr,  # [rows] uint32: each row's K-th largest group maximum (its last program to finish writes it)
    count_ptr,  # [rows] int32: the row's programs done (0 before and after the launch)
    part_ptr,  # [rows, TILES, 2] float32: each tile's largest raw logit and its sum of exp(logit - that) (LSE)
    lse_ptr,  # [rows] float32: log(sum(exp(logits))) of each row's raw logits (LSE)
    V,
    x_r,
    TILES: tl.constexpr,
    TILES_PAD: tl.constexpr,  # >= TILES, a power of two
    GROUPS: tl.constexpr,  # groups a tile (a power of two dividing BLOCK)
    G_PAD: tl.constexpr,  # >= TILES * GROUPS, a power of two
    K: tl.constexpr,  # the head's length: min(V, candidates)
    BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,  # the cells' columns (CellColumns)
    TEMPERATURE: tl.constexpr,
    MIN_POSITION: tl.constexpr,
    STOP_0: tl.constexpr,
    STOPS: tl.constexpr,
    BITS: tl.constexpr,  # 16: bf16 logits, keyed by their own 16 bits; 32: the scaled float32 values
    FENCE: tl.constexpr,  # compiled: each thread's maxima (and parts) stored GPU-wide before the count
    LSE: tl.constexpr,  # the rows' log-sum-exp too (a logprobs step's)
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: the logits are the step's lm_head output
    r = tl.program_id(0)
    # the tile as [GROUPS, BLOCK // GROUPS]: a group a line
    at = tl.program_id(1) * BLOCK + tl.arange(0, GROUPS)[:, None] * (BLOCK // GROUPS) + tl.arange(0, BLOCK // GROUPS)
    valid = at < V
    v = tl.load(x_ptr + r.to(tl.int64) * x_r + at, mask=valid, other=0.0).to(tl.float32)
    if LSE:  # the tile's part of its row's log-sum-exp (raw logits: no temperature, no bans); a NaN or +inf gives NaN
        raw = tl.where(valid, v, float("-inf"))
        top = tl.max(tl.max(raw, axis=1), axis=0)
        tile_sum = tl.sum(tl.sum(tl.exp(raw - tl.where(top == float("-inf"), 0.0, top)), axis=1), axis=0)
        part = part_ptr + (r * TILES + tl.program_id(1)) * 2
        tl.store(part, top)
        tl.store(part + 1, tile_sum)
    k = tl.where(valid, _keys(v, at, r, cells_ptr, pos_ptr, WIDTH, TEMPERATURE, MIN_POSITION, STOP_0, STOPS, BITS), 0)
    g = tl.arange(0, GROUPS)
    tl.store(gmax_ptr + (r * TILES + tl.program_id(1)) * GROUPS + g, tl.max(k, axis=1))
    if FENCE:  # the asm's value is never stored (no lane passes the mask); the store keeps the fence in place
        f = release_fence(g)
        tl.store(count_ptr + r + g, f, mask=f < 0)
    tl.debug_barrier()  # every thread's maxima (and parts) stored (and fenced) before the count
    if tl.atomic_add(count_ptr + r, 1, sem="acq_rel") == TILES - 1:  # the row's last program: its bound
        c = tl.arange(0, G_PAD)
        groups = c < TILES * GROUPS
        gmax = tl.load(gmax_ptr + r * (TILES * GROUPS) + c, mask=groups, other=0, cache_modifier=".cg")  # (from L2)
        tl.store(low_ptr + r, _kth_key(gmax, groups, K, BITS))
        if LSE:  # lse = m + log(sum_t s_t exp(m_t - m)), m the largest m_t (a row all -inf: -inf)
            t = tl.arange(0, TILES_PAD)
            tops = tl.load(part_ptr + (r * TILES + t) * 2, mask=t < TILES, other=float("-inf"), cache_modifier=".cg")
            sums = tl.load(part_ptr + (r * TILES + t) * 2 + 1, mask=t < TILES, other=0.0, cache_modifier=".cg")
            m = tl.max(tops, axis=0)
            m = tl.where(m == float("-inf"), 0.0, m)
            total = tl.sum(sums * tl.exp(tops - m), axis=0)  # (0: every logit -inf; NaN: a NaN or +inf among them)
            lse = tl.where(total > 0, m + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
            tl.store(lse_ptr + r, tl.where(total != total, total, lse))
        tl.store(count_ptr + r, 0)


@triton.jit
def _tile_head_kernel(
    x_ptr,  # [rows, V] logits
    cells_ptr,  # [rows, WIDTH] int32
    pos_ptr,  # [rows] int
    low_ptr,  # [rows] uint32
    cand_k_ptr,  # [rows, TILES, K] uint32 keys
    cand_i_ptr,  # [rows, TILES, K] int32 ids (-1: empty)
    V,
    x_r,
    TILES: tl.constexpr,
    K: tl.constexpr,  # the head's length: min(V, candidates)
    K_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
    TEMPERATURE: tl.constexpr,
    MIN_POSITION: tl.constexpr,
    STOP_0: tl.constexpr,
    STOPS: tl.constexpr,
    BITS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # the bounds are the first launch's
    r, at, valid, v = load_row_tile(x_ptr, x_r, V, BLOCK)
    k = _keys(v, at, r, cells_ptr, pos_ptr, WIDTH, TEMPERATURE, MIN_POSITION, STOP_0, STOPS, BITS)
    take = valid & (k >= tl.load(low_ptr + r))  # (every key of the row's head; ~300 a row of random logits)
    if tl.sum(take.to(tl.int32), axis=0) > K:  # (the tile's own K largest hold all of the head it has)
        take = _select(k, take, K, BITS)
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
def _head(cand_k_ptr, cand_i_ptr, at, inside, head_k_ptr, head_i_ptr, K: tl.constexpr, K_PAD: tl.constexpr,
          BITS: tl.constexpr):  # fmt: skip
    """The ``K`` largest of the candidates at ``at`` (a 1-d block in id order; ``inside`` masks the real slots, an
    empty one holds id -1), ties to the first, stored in index order in the head's ``K_PAD`` slots."""
    k = tl.load(cand_k_ptr + at, mask=inside, other=0)
    ids = tl.load(cand_i_ptr + at, mask=inside, other=_NO_ID)
    take = _select(k, ids >= 0, K, BITS)
    _compact(take, k, ids, head_k_ptr, head_i_ptr, K_PAD, K_PAD)


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
    TILES_PAD: tl.constexpr,  # >= TILES, a power of two
    FAST_W: tl.constexpr,  # slots a tile the fast select reads (<= K)
    FAST_W_PAD: tl.constexpr,  # >= FAST_W, a power of two
    TOP: tl.constexpr,
    WIDTH: tl.constexpr,  # the cells' columns (CellColumns)
    TEMPERATURE: tl.constexpr,
    TOP_P: tl.constexpr,
    TOP_K: tl.constexpr,
    SEED: tl.constexpr,
    BITS: tl.constexpr,  # the first launch's keys (16: unscaled bf16 values)
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # the candidates are the second launch's
    r = tl.program_id(0)
    row = r * (TILES * K)
    if FAST_W < K:  # a tile that kept more than FAST_W keys has its slot FAST_W filled
        t = tl.arange(0, TILES_PAD)
        over = tl.load(cand_i_ptr + row + t * K + FAST_W, mask=t < TILES, other=_NO_ID) >= 0
        spilled = tl.sum(over.to(tl.int32), axis=0)
    else:
        spilled = 0
    # either way the candidates are read in id order (tile t's before tile t + 1's): ties at the threshold go to the
    # first ids
    # (the branches name their blocks apart: a name both assign must keep one shape across them)
    if spilled == 0:
        few = tl.arange(0, TILES_PAD * FAST_W_PAD)
        _head(cand_k_ptr, cand_i_ptr, row + (few // FAST_W_PAD) * K + few % FAST_W_PAD,
              (few // FAST_W_PAD < TILES) & (few % FAST_W_PAD < FAST_W), head_k_ptr + r * K_PAD,
              head_i_ptr + r * K_PAD, K, K_PAD, BITS)  # fmt: skip
    else:
        every = tl.arange(0, N_PAD)
        _head(cand_k_ptr, cand_i_ptr, row + every, every < TILES * K, head_k_ptr + r * K_PAD, head_i_ptr + r * K_PAD,
              K, K_PAD, BITS)  # fmt: skip
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


def tiling(V: int, K: int) -> tuple[int, int, int]:
    """(logits a tile, tiles a row, groups a tile) for a vocabulary of V and a head of K: tiles of ``BLOCK`` (or the
    vocabulary's next power of two), each split in ``GROUPS_A_TILE`` groups, or more where the row would hold fewer
    than ``GROUPS_A_HEAD`` x K of them (a smaller vocabulary: 51,866 logits, 64 groups of 64 a tile), so that the
    K-th largest group maximum stays close to the K-th largest logit. The 248,320 logits of Qwen3.5: 61 tiles of 16
    groups of 256."""
    block = min(BLOCK, triton.next_power_of_2(V))
    tiles = triton.cdiv(V, block)
    return block, tiles, min(block, max(GROUPS_A_TILE, triton.next_power_of_2(triton.cdiv(GROUPS_A_HEAD * K, tiles))))


def _buffers(device: torch.device) -> tuple[torch.Tensor, ...]:
    """Candidate keys and ids [MAX_CANDIDATES], head keys and ids [MAX_CANDIDATES // 8], group maxima
    [MAX_CANDIDATES // 8], rows' bounds and counts [MAX_ROWS], tiles' log-sum-exp parts [MAX_CANDIDATES // 8]. Every
    launch writes what it reads, but for the counts, which start at 0 and which each row's last program sets back to
    0."""
    return (torch.empty(MAX_CANDIDATES, dtype=torch.uint32, device=device),
            torch.empty(MAX_CANDIDATES, dtype=torch.int32, device=device),
            torch.empty(MAX_CANDIDATES // 8, dtype=torch.uint32, device=device),
            torch.empty(MAX_CANDIDATES // 8, dtype=torch.int32, device=device),
            torch.empty(MAX_CANDIDATES // 8, dtype=torch.uint32, device=device),
            torch.empty(MAX_ROWS, dtype=torch.uint32, device=device),
            torch.zeros(MAX_ROWS, dtype=torch.int32, device=device),
            torch.empty(MAX_CANDIDATES // 8, dtype=torch.float32, device=device))  # fmt: skip


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
    rows_a_launch: int | None = None,  # rows one launch group draws; None: as many as the workspace holds
    fast_slots: int = FAST_SLOTS,  # candidates a row's fast select reads (tests set it small to take the other path)
    lse: torch.Tensor | None = None,  # [rows] float32: log(sum(exp(logits))) of each row's raw logits, where given
) -> torch.Tensor:
    """out[r] = the token row r draws (``naive.sample_rows_ref``: its head of ``candidates`` by top-k, top-p and
    Gumbel-max; the head's first at temperature 0); ``head`` its head's ids, largest first; ``lse`` its raw logits'
    log-sum-exp (as ``torch.logsumexp`` of them in float32, summed by tiles: a logprob is a logit less it). See the
    module doc. Rows beyond what the workspace holds at once (268 of a 248k vocabulary) are drawn by further launch
    groups."""
    rows, V = logits.shape
    K = min(V, candidates)
    assert logits.stride(-1) == 1 and cells.shape == (rows, cols.width) and cells.dtype == torch.int32, (
        logits.shape, cells.shape, cells.dtype)  # fmt: skip
    assert cells.is_contiguous() and positions.is_contiguous() and out.is_contiguous(), "cells, positions, out: dense"
    assert head is None or head.is_contiguous(), "head: dense"
    assert lse is None or (lse.shape == (rows,) and lse.dtype == torch.float32 and lse.is_contiguous()), (
        None if lse is None else (lse.shape, lse.dtype))  # fmt: skip
    assert out.shape == (rows,) and out.dtype in (torch.int64, torch.int32) and positions.shape == (rows,), (
        out.shape, out.dtype, positions.shape)  # fmt: skip
    assert head is None or (head.shape == (rows, K) and head.dtype == torch.int64), (
        None if head is None else (head.shape, head.dtype))  # fmt: skip
    assert 0 < V < MAX_ID, f"a vocabulary of {V} logits: ids must fit int32"
    assert 0 < candidates <= 1024, f"candidates {candidates}: the head is sorted in one program, of at most 1024"
    if rows == 0:
        return out
    block, tiles, groups = tiling(V, K)
    K_PAD = triton.next_power_of_2(K)
    tiles_pad = triton.next_power_of_2(tiles)
    fast_w = min(K, max(1, fast_slots // tiles_pad))
    cand_k, cand_i, head_k, head_i, gmax, low, count, parts = _workspace(logits.device)
    fits = min(cand_k.numel() // (tiles * K), head_k.numel() // K_PAD, gmax.numel() // (tiles * groups), MAX_ROWS,
               parts.numel() // (tiles * 2))  # fmt: skip
    assert fits > 0, f"a row of {tiles} tiles of {K} candidates: more than the sampler's workspace holds"
    step = min(fits, rows_a_launch or fits)
    bits = 16 if logits.dtype == torch.bfloat16 else 32
    opts = launch_options(pdl)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        x, c, p, o = logits[r0 : r0 + n], cells[r0 : r0 + n], positions[r0 : r0 + n], out[r0 : r0 + n]
        h = head[r0 : r0 + n] if head is not None else o
        s = lse[r0 : r0 + n] if lse is not None else parts
        keyed = dict(BLOCK=block, WIDTH=cols.width, TEMPERATURE=cols.temperature, MIN_POSITION=cols.min_position,
                     STOP_0=cols.stop_0, STOPS=cols.stops, BITS=bits)  # fmt: skip
        _group_max_kernel[(n, tiles)](x, c, p, gmax, low, count, parts, s, V, x.stride(0), TILES=tiles,
                                      TILES_PAD=tiles_pad, GROUPS=groups, G_PAD=triton.next_power_of_2(tiles * groups),
                                      K=K, **keyed, FENCE=not interpreted(), LSE=lse is not None,
                                      num_warps=GROUP_WARPS, **opts)  # fmt: skip
        _tile_head_kernel[(n, tiles)](x, c, p, low, cand_k, cand_i, V, x.stride(0), TILES=tiles, K=K, K_PAD=K_PAD,
                                      **keyed, num_warps=TILE_WARPS, **opts)  # fmt: skip
        _draw_row_kernel[(n,)](cand_k, cand_i, head_k, head_i, c, p, o, h, TILES=tiles, K=K, K_PAD=K_PAD,
                               N_PAD=triton.next_power_of_2(tiles * K), TILES_PAD=tiles_pad, FAST_W=fast_w,
                               FAST_W_PAD=triton.next_power_of_2(fast_w), TOP=head is not None, WIDTH=cols.width,
                               TEMPERATURE=cols.temperature, TOP_P=cols.top_p, TOP_K=cols.top_k, SEED=cols.seed,
                               BITS=bits, num_warps=ROW_WARPS, **opts)  # fmt: skip
    return out
