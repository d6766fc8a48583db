"""fla's varlen chunk index for a pass whose shape is fixed in advance (a captured graph's).

fla's chunked delta rule splits each sequence into 64-token chunks and launches one program per (chunk, head):
``chunk_indices[i] = (sequence, chunk of that sequence)``, ``chunk_offsets[s]`` = chunks before sequence s. A graph
captured at ``rows`` chunk rows replays any composition of at most ``rows`` chunks when the unused rows name a chunk
of an empty sequence: every fla kernel returns at once (or stores nothing) for a chunk past its sequence's end.
"""

from __future__ import annotations

import numpy as np

CHUNK = 64  # fla's chunk size for the gated delta rule


def chunk_rows(tokens: int, seqs: int) -> int:
    """The most chunks ``seqs`` sequences of ``tokens`` tokens in all can make: sum ceil(T_s / 64) <= tokens / 64 +
    seqs."""
    return tokens // CHUNK + seqs


def chunk_index(lens: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """lens [S] (the last sequence empty when rows exceed the chunks) -> chunk_indices [rows, 2] and chunk_offsets
    [S + 1], int32. Unused rows are (S - 1, 0), which must be an empty sequence."""
    lens = np.asarray(lens, np.int64)
    counts = -(-lens // CHUNK)  # [S]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    used = int(offsets[-1])
    if used > rows:
        raise ValueError(f"{used} chunks do not fit {rows} chunk rows")
    if used < rows and (lens.size == 0 or lens[-1] != 0):
        raise ValueError("unused chunk rows need an empty last sequence to point at")
    seq = np.repeat(np.arange(lens.size), counts)
    within = np.arange(used) - offsets[:-1][seq]
    idx = np.zeros((rows, 2), np.int32)
    idx[:used, 0], idx[:used, 1] = seq, within
    idx[used:, 0] = lens.size - 1
    return idx, offsets.astype(np.int32)
