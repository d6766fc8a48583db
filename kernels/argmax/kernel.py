"""Greedy decoding's draw: ``out[r]`` = the first index of the largest of ``logits[r]``, a NaN counting as the largest
(as ``torch.argmax``), in one launch written straight into the step's token buffer.

torch's argmax reduces each row of the vocabulary in few programs and its int64 result is copied again into the
step's tokens (on an H100 at the 0.8B shape: ~9 us at one row, 13 at 16, 28 at 64 rows, for 0.5-32 MB, and a copy).
Here a grid of (rows, chunks) programs each reduces a contiguous chunk of its row, ``BLOCK`` logits a tile, to its
(best value, first index), stores it as a partial and counts itself done on the row's counter; the row's last chunk to
finish reads the row's partials in chunk order (chunk c holds indices below chunk c + 1's, so the first index among
equal maxima is the smallest) and writes ``out[r]``, then sets the counter back to 0 for the next launch. Which chunk
finished last never changes the result.

The chunk count is a function of the row count only (fixed per captured bucket): about ``PROGRAMS_PER_SM`` programs
an SM, each at least one tile.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.fence import release_fence
from kernels.pdl import launch_options, pdl_wait
from kernels.runtime import interpreted

BLOCK = 2048  # logits a program reduces a tile
PROGRAMS_PER_SM = 2  # chunks a row: about this many programs an SM over the rows
CPU_SMS = 66  # the "SM count" off the GPU (the interpreter), so CPU tests run rows of several chunks
MAX_PARTIALS = 1 << 16  # (value, index) partials a workspace holds: rows x chunks
MAX_ROWS = 1 << 13  # rows a workspace counts
MAX_INDEX = 2**31 - 1  # vocabularies hold fewer logits than this (indices are int32)
NO_INDEX = tl.constexpr(MAX_INDEX)  # a tile's index where none of its logits is valid


@triton.jit
def _tile_best(v, offs, mask):
    """(value, first index) of one tile's best logit: the first NaN (value NaN) if the tile has one, else the largest
    (-inf where nothing is valid) at its first index (NO_INDEX where nothing is valid)."""
    nan = (v != v) & mask
    vm = tl.where(mask & ~nan, v, float("-inf"))
    top = tl.max(vm, axis=0)
    first = tl.min(tl.where(mask & (vm == top), offs, NO_INDEX), axis=0)
    first_nan = tl.min(tl.where(nan, offs, NO_INDEX), axis=0)
    has_nan = first_nan < NO_INDEX
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, first_nan, first)


@triton.jit
def _later_wins(best, best_i, val, idx):
    """Whether a later candidate (val, idx) replaces the best so far: it exists and the best does not, or the best is
    not NaN and the candidate is NaN or strictly larger (equal: the earlier index stays)."""
    val_nan = val != val
    return (idx < NO_INDEX) & ((best_i == NO_INDEX) | ((best == best) & (val_nan | (val > best))))


@triton.jit
def _argmax_kernel(
    x_ptr,  # [rows, V] logits
    out_ptr,  # [rows] int64 or int32
    part_v_ptr,  # [rows * CHUNKS] float32 partial maxima (NaN: the chunk holds a NaN)
    part_i_ptr,  # [rows * CHUNKS] int32 their first indices
    count_ptr,  # [rows] int32, zero between launches: the chunks done per row
    V,
    x_r,
    chunk,  # logits a chunk: a multiple of BLOCK
    CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    FENCE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)  # kernels/pdl.py: the logits are the step's lm_head output
    r = tl.program_id(0)
    c = tl.program_id(1)
    row = x_ptr + r.to(tl.int64) * x_r
    offs = tl.arange(0, BLOCK)
    best = tl.full((), float("-inf"), tl.float32)
    best_i = tl.full((), NO_INDEX, tl.int32)
    start = c * chunk
    for t in range(0, chunk, BLOCK):
        at = start + t + offs
        mask = at < V
        val, idx = _tile_best(tl.load(row + at, mask=mask, other=0.0).to(tl.float32), at, mask)
        win = _later_wins(best, best_i, val, idx)
        best = tl.where(win, val, best)
        best_i = tl.where(win, idx, best_i)
    if CHUNKS == 1:
        tl.store(out_ptr + r, best_i.to(out_ptr.dtype.element_ty))
    else:
        tl.store(part_v_ptr + r * CHUNKS + c, best)
        tl.store(part_i_ptr + r * CHUNKS + c, best_i)
        if FENCE:  # the asm's value is never stored (no lane passes the mask); the store keeps the fence in place
            f = release_fence(offs)
            tl.store(count_ptr + offs, f, mask=f < 0)
        tl.debug_barrier()  # every thread's partial stored (and fenced) before the count
        done = tl.atomic_add(count_ptr + r, 1, sem="acq_rel")
        if done == CHUNKS - 1:  # the row's last chunk: its partials in chunk order, from L2
            cs = tl.arange(0, CHUNKS_PAD)
            cm = cs < CHUNKS
            pv = tl.load(part_v_ptr + r * CHUNKS + cs, mask=cm, other=float("-inf"), cache_modifier=".cg")
            pi = tl.load(part_i_ptr + r * CHUNKS + cs, mask=cm, other=NO_INDEX, cache_modifier=".cg")
            nan = (pv != pv) & cm
            vm = tl.where(cm & ~nan, pv, float("-inf"))
            top = tl.max(vm, axis=0)
            first = tl.min(tl.where(cm & (vm == top), pi, NO_INDEX), axis=0)
            first_nan = tl.min(tl.where(nan, pi, NO_INDEX), axis=0)
            pick = tl.where(first_nan < NO_INDEX, first_nan, first)
            tl.store(out_ptr + r, pick.to(out_ptr.dtype.element_ty))
            tl.store(count_ptr + r, 0)


def chunks_for(rows: int, vocab: int, sms: int) -> int:
    """Chunks a row: about PROGRAMS_PER_SM * sms programs over the rows, each at least one BLOCK tile."""
    return max(1, min(triton.cdiv(vocab, BLOCK), PROGRAMS_PER_SM * sms // max(rows, 1)))


@functools.cache
def _workspace(device: torch.device, stream: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The argmax workspace of the launches on one stream (as kernels.gemv's split-K workspace: shared by the launches
    of a stream, which run one after another; made before any capture, kept for the process): partial values
    [MAX_PARTIALS] float32, their indices [MAX_PARTIALS] int32, counts [MAX_ROWS] int32 at zero."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the argmax workspace of a stream is made before a capture on that stream, not during it: "
                           "run the work once on the capture stream first (resplan.Graph's warm-up, run_on)")
    return (torch.empty(MAX_PARTIALS, dtype=torch.float32, device=device),
            torch.empty(MAX_PARTIALS, dtype=torch.int32, device=device),
            torch.zeros(MAX_ROWS, dtype=torch.int32, device=device))  # fmt: skip


def _sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SMS


def argmax_rows(
    logits: torch.Tensor,  # [rows, V], unit stride in V
    out: torch.Tensor,  # [rows] int64 or int32
    chunks: int | None = None,  # chunks a row (default: chunks_for)
    pdl: bool | None = None,  # launch with PDL (kernels.pdl); None reads the process default: an engine passes a bool
) -> torch.Tensor:
    """out[r] = argmax(logits[r]) (the first index of the largest; NaN the largest), as torch.argmax; see module doc."""
    rows, V = logits.shape
    assert logits.stride(-1) == 1 and out.shape == (rows,) and out.dtype in (torch.int64, torch.int32), (
        logits.shape, out.shape, out.dtype)  # fmt: skip
    assert V < MAX_INDEX, f"a vocabulary of {V} logits: indices must fit int32"
    if rows == 0:
        return out
    chunks = chunks or chunks_for(rows, V, _sms(logits.device))
    chunk = triton.cdiv(triton.cdiv(V, chunks), BLOCK) * BLOCK  # logits a chunk, whole tiles
    chunks = triton.cdiv(V, chunk)  # (none empty)
    assert rows * chunks <= MAX_PARTIALS and rows <= MAX_ROWS, (rows, chunks)
    stream = torch.cuda.current_stream(logits.device).cuda_stream if logits.device.type == "cuda" else 0
    part_v, part_i, counts = _workspace(logits.device, stream)
    _argmax_kernel[(rows, chunks)](
        logits, out, part_v, part_i, counts, V, logits.stride(0), chunk, CHUNKS=chunks,
        CHUNKS_PAD=triton.next_power_of_2(chunks), BLOCK=BLOCK, FENCE=chunks > 1 and not interpreted(),
        num_warps=4, **launch_options(pdl),
    )  # fmt: skip
    return out
