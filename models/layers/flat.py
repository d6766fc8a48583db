"""A prefill pass as one flat token stream: every chunk's tokens back to back, no padding to the longest chunk.

Sequences, in order: the pass's R chunks (one a request), then the padding sequence (the tokens that fill the stream
up to the pass's token count; its slot the sink, its K/V on the sink page), then empty sequences up to the pass's
sequence count (the last always empty: unused rows of fla's chunk index point at it). A pass of a fixed ``PassShape``
(a token bucket's) is one CUDA graph that replays any composition of chunks that fits it.

``flat_layout`` is the pure host function from the chunks to the pass's index arrays; the model turns them into its
device record.

Saves (a prefix cache's checkpoints of a recurrent model): a chunk's ``(p, slot)`` asks that ``slot`` hold, once the
pass has run, the recurrent state its own slot would hold after stream positions 0 .. p - 1. p is either an entry of
one of the delta rule's 64-token chunks counted from the chunk's start (``(p - start) % 64 == 0``, start < p < start +
T), saved from inside the pass (``save_slot``, ``save_at``: one a chunk row), or the chunk's end p = start + T
(``final_slot``: one a sequence). So a pass of ``PassShape`` holds at most ``chunk_rows`` interior saves and
``max_chunks`` final ones whatever its composition, and its save arrays have those fixed sizes; unused entries are 0,
the sink slot (which only padding reads).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch

from kernels.gdn_prefill import CHUNK, chunk_index, chunk_rows
from resplan.layout import SINK_PAGE  # padding tokens write their K/V on the sink page, run on the sink slot (0)
from resplan.pinned import PinnedRing, host_zeros


def host_array(x: torch.Tensor | Sequence[int] | np.ndarray) -> np.ndarray:
    """A chunk's token ids or pages as a flat host int64 array (what ``flat_layout`` takes)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, np.int64).reshape(-1)


def device_array(a: np.ndarray, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A pass's host array on the device (in ``dtype`` when given), copied asynchronously: a blocking copy would hold
    the host until the GPU had run everything queued before it."""
    return torch.from_numpy(np.ascontiguousarray(a)).to(device, dtype, non_blocking=True)


class HostStaging:
    """A pass's host arrays to the device as one copy: packed (8-byte aligned) into a pinned buffer, copied up whole
    on the current stream, and returned as typed views of the device copy. The buffers are a ``PinnedRing`` of two
    (each reused once the copy that last read it has completed), an entry grown when a pass needs more. Against one
    pageable copy an array (~20 us of host each, 16 a Qwen3.5 pass), a pass pays one. Off CUDA the buffers are plain
    memory and there is nothing to wait for (the same packing, which the CPU tests check)."""

    ALIGN = 8

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._pinned = self.device.type == "cuda"
        # each entry a one-item list: its buffer (pinned on CUDA), replaced by a larger one when a pass needs more
        self._ring = PinnedRing(2, lambda pinned: [host_zeros(0, torch.uint8, pinned)], self._pinned)

    def up(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """The arrays on the device, in order, each of its own dtype and shape (views of one fresh device buffer)."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += -(-a.nbytes // self.ALIGN) * self.ALIGN
        _, entry = self._ring.take()  # (its last copy, two passes ago, long done)
        if entry[0].numel() < total:
            entry[0] = host_zeros(max(total, 2 * entry[0].numel()), torch.uint8, self._pinned)
        buf = entry[0]
        host = buf.numpy()
        for a, off in zip(arrays, offsets, strict=True):
            host[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
        dev = torch.empty(total, dtype=torch.uint8, device=self.device)
        dev.copy_(buf[:total], non_blocking=True)
        self._ring.done()
        return [dev[off : off + a.nbytes].view(_TORCH_DTYPES[a.dtype]).view(a.shape)
                for a, off in zip(arrays, offsets, strict=True)]  # fmt: skip


_TORCH_DTYPES = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.bool_): torch.bool,
                 np.dtype(np.float32): torch.float32}  # fmt: skip


@attrs.frozen
class PassShape:
    """What fixes a pass's shapes (a captured graph's key): N tokens, S sequences, fla's chunk rows, P page-list
    entries."""

    tokens: int
    seqs: int
    chunk_rows: int
    pages: int

    @property
    def max_chunks(self) -> int:
        """Chunks (requests) it holds: S minus the padding sequence and the empty last one."""
        return self.seqs - 2


def exact_shape(lens: Sequence[int], n_pages: Sequence[int]) -> PassShape:
    """The smallest shape of these chunks (an eager pass): no padding tokens, one empty sequence."""
    R, N = len(lens), int(sum(lens))
    seqs = R + 2
    return PassShape(N, seqs, chunk_rows(N, seqs), int(sum(n_pages)) + 2)


def bucket_shape(tokens: int, max_chunks: int, max_pages: int, page_size: int) -> PassShape:
    """The shape of a token bucket: any <= max_chunks chunks of <= tokens tokens holding <= max_pages pages in all."""
    seqs = max_chunks + 2
    return PassShape(tokens, seqs, chunk_rows(tokens, seqs), max_pages + -(-tokens // page_size) + seqs)


@attrs.frozen
class FlatLayout:
    """A pass's host arrays (numpy). N = shape.tokens, S = shape.seqs, R = the chunks."""

    ids: np.ndarray  # [N] int64 token ids, 0 for padding
    pos: np.ndarray  # [N] int64 rotary position: offset + stream position (0 for padding)
    write_loc: np.ndarray  # [N] int64 flat K/V slot: page * page_size + position % page_size
    seq_of: np.ndarray  # [N] int32 each token's sequence
    cu_seqlens: np.ndarray  # [S + 1] int32
    slots: np.ndarray  # [S] int64 recurrent slot (0, the sink, past the chunks)
    fresh: np.ndarray  # [S] bool: starts its stream (reads zero state)
    last: np.ndarray  # [S - 2] int64 each chunk's last token (0 past the chunks)
    chunk_indices: np.ndarray  # [chunk_rows, 2] int32 (kernels.gdn_prefill.chunk_index)
    chunk_offsets: np.ndarray  # [S + 1] int32
    kv_indptr: np.ndarray  # [S + 1] int32 each sequence's pages in kv_indices
    kv_indices: np.ndarray  # [P] int32 pages in order (0 past the used entries)
    kv_last_page_len: np.ndarray  # [S] int32 tokens on each sequence's last page (1..page_size)
    kv_lens: np.ndarray  # [S] int32 tokens each sequence attends over (its stream through this chunk; 1 if empty)
    chunks: int  # R
    save_slot: np.ndarray  # [chunk_rows] int64 slot that receives the state entering each chunk row (0: none)
    save_at: np.ndarray  # [chunk_rows] int64 flat index of that row's first token (position p of the save; 0: none)
    final_slot: np.ndarray  # [S] int64 slot that receives the sequence's final state too (0: none)


def check_saves(saves: Sequence[Sequence[tuple[int, int]]], starts: Sequence[int], lens: Sequence[int],
                slots: Sequence[int], chunk: int = 64) -> None:  # fmt: skip
    """The chunks' saves (module doc), refused with the reason: p an entry of a 64-token chunk of its chunk or its
    end, slots >= 1, none a chunk's recurrent slot, no slot saved into twice."""
    if len(saves) != len(starts):
        raise ValueError(f"{len(saves)} chunks' saves for {len(starts)} chunks")
    taken = {int(s): "the recurrent slot of a chunk of the pass" for s in slots}
    for r, (chunk_saves, start, T) in enumerate(zip(saves, starts, lens, strict=True)):
        for p, slot in chunk_saves:
            p, slot, end = int(p), int(slot), int(start) + int(T)
            if not (start < p <= end and ((p - start) % chunk == 0 or p == end)):
                raise ValueError(f"chunk {r} (positions {start}..{end - 1}): a save at p={p} is neither start + a "
                                 f"multiple of {chunk} in ({start}, {end}] nor its end {end}")  # fmt: skip
            if slot < 1:
                raise ValueError(f"chunk {r}: a save into slot {slot} (0 is the sink; slots are >= 1)")
            if slot in taken:
                raise ValueError(f"chunk {r}: a save at p={p} into slot {slot}, {taken[slot]}")
            taken[slot] = f"which a save at p={p} of chunk {r} takes already"


def flat_layout(
    ids: Sequence[np.ndarray],  # R arrays [T_r] of token ids
    starts: Sequence[int],  # each chunk's first stream position
    offsets: Sequence[int],  # each request's rotary position offset
    slots: Sequence[int],  # each request's recurrent slot (>= 1)
    pages: Sequence[np.ndarray],  # each request's pages in order (at least ceil((start + T) / page_size))
    page_size: int,
    shape: PassShape,
    saves: Sequence[Sequence[tuple[int, int]]] | None = None,  # each chunk's (p, slot) saves (module doc); None: none
) -> FlatLayout:
    """The chunks laid out in ``shape`` (module doc): refused with the reason if they do not fit it."""
    R = len(ids)
    lens = np.array([len(t) for t in ids], np.int64)
    starts_a = np.asarray(starts, np.int64)
    n_real = int(lens.sum())
    N, S = shape.tokens, shape.seqs
    if shape.max_chunks < R or n_real > N or R == 0 or lens.min() < 1:
        raise ValueError(f"{R} chunks of {n_real} tokens (each >= 1) do not fit a pass of {shape}")
    kv_lens_real = starts_a + lens  # [R]
    n_pages_real = -(-kv_lens_real // page_size)
    pad = N - n_real
    seq_lens = np.zeros(S, np.int64)
    seq_lens[:R], seq_lens[R] = lens, pad
    cu = np.concatenate([[0], np.cumsum(seq_lens)])
    seq_of = np.repeat(np.arange(S), seq_lens).astype(np.int32)
    within = np.arange(N) - cu[:-1][seq_of]  # [N] position in its chunk
    stream = within.copy()  # [N] stream position: start + i (the padding's own index)
    stream[:n_real] += np.repeat(starts_a, lens)
    pos = np.zeros(N, np.int64)
    pos[:n_real] = stream[:n_real] + np.repeat(np.asarray(offsets, np.int64), lens)
    seq_pages = np.ones(S, np.int64)  # an empty sequence attends over one token of the sink page
    seq_pages[:R] = n_pages_real
    seq_pages[R] = max(1, -(-pad // page_size))
    kv_indptr = np.concatenate([[0], np.cumsum(seq_pages)])
    if kv_indptr[-1] > shape.pages:
        raise ValueError(f"{int(kv_indptr[-1])} pages do not fit a pass of {shape}")
    kv_indices = np.full(shape.pages, SINK_PAGE, np.int64)
    for r in range(R):  # one slice a chunk (R <= max_running): the page lists are the request table's rows
        kv_indices[kv_indptr[r] : kv_indptr[r] + n_pages_real[r]] = pages[r][: n_pages_real[r]]
    page_of = kv_indices[kv_indptr[:-1][seq_of] + stream // page_size]  # [N] (padding: the sink page)
    write_loc = page_of * page_size + stream % page_size
    kv_lens = np.ones(S, np.int64)
    kv_lens[:R], kv_lens[R] = kv_lens_real, max(pad, 1)
    slots_a = np.zeros(S, np.int64)
    slots_a[:R] = slots
    fresh = np.ones(S, bool)
    fresh[:R] = starts_a == 0
    last = np.zeros(S - 2, np.int64)
    last[:R] = cu[1 : R + 1] - 1
    chunk_indices, chunk_offsets = chunk_index(seq_lens, shape.chunk_rows)
    save_slot, save_at = np.zeros(shape.chunk_rows, np.int64), np.zeros(shape.chunk_rows, np.int64)
    final_slot = np.zeros(S, np.int64)
    if saves is not None:
        check_saves(saves, starts_a.tolist(), lens.tolist(), slots, CHUNK)
        for r, chunk_saves in enumerate(saves):
            for p, slot in chunk_saves:
                i = int(p) - int(starts_a[r])  # tokens of the chunk before the save
                if i == lens[r]:
                    final_slot[r] = slot
                else:
                    save_slot[chunk_offsets[r] + i // CHUNK] = slot
                    save_at[chunk_offsets[r] + i // CHUNK] = cu[r] + i
    return FlatLayout(
        ids=np.concatenate([*(np.asarray(t, np.int64) for t in ids), np.zeros(pad, np.int64)]),
        pos=pos, write_loc=write_loc, seq_of=seq_of, cu_seqlens=cu.astype(np.int32), slots=slots_a, fresh=fresh,
        last=last, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, kv_indptr=kv_indptr.astype(np.int32),
        kv_indices=kv_indices.astype(np.int32), kv_last_page_len=((kv_lens - 1) % page_size + 1).astype(np.int32),
        kv_lens=kv_lens.astype(np.int32), chunks=R, save_slot=save_slot, save_at=save_at, final_slot=final_slot,
    )  # fmt: skip
