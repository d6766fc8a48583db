"""The host-planned arm: rebuild a bucket's StepBuffers from the host streams every step, in numpy, into one host
array laid out exactly like ``StepBuffers.flat``, then ONE copy to the device (pinned and asynchronous on CUDA).

No per-row Python: each buffer is a vectorised gather from the handle-indexed streams. Padding rows get the trash
row's reading (block table 0, APPEND seq_len 1, write_loc 0, position 0, recurrent slot 0, sampler cells 0) from a
template copied in first. This is the baseline the resident arm is measured against, so it is kept as lean as the
resident path: the only per-step allocations are numpy temporaries of the step's own size.
"""

from __future__ import annotations

import numpy as np
import torch

from resplan import HostStreams, RowLayout, StepBuffers, StreamMode
from resplan.pinned import PinnedRing, host_zeros


def _offset(view: torch.Tensor, flat: torch.Tensor) -> int:
    return view.storage_offset() - flat.storage_offset()


class HostFill:
    """Fills one bucket's StepBuffers from the streams: ``fill(streams, handles)``; one H2D per call.

    ``exact_pages``: the owner of the streams guarantees that a row's stream holds no page past the columns the step
    uses (``pages[h, j] == 0`` for ``j >= ceil(seq_len / page_size)``), as an engine that allocates a page exactly
    when a token opens it does; the block table is then a straight gather of the rows' page lists. Otherwise the
    unused columns are masked to 0.
    """

    def __init__(self, layout: RowLayout, bufs: StepBuffers, exact_pages: bool = False, ring: int = 2) -> None:
        if bufs.flat is None:
            raise ValueError("HostFill needs StepBuffers built by StepBuffers.allocate (views of one flat tensor)")
        self.bufs = bufs
        self.exact_pages = exact_pages
        self.size = b = bufs.size
        self.device = bufs.flat.device
        flat = bufs.flat
        n = flat.numel()
        self.nbytes = n * 4
        self._ring = PinnedRing(ring, lambda pinned: host_zeros(n, torch.int32, pinned), self.device.type == "cuda")
        template = np.zeros(n, np.int32)
        for p in layout.append_pools:
            o = _offset(bufs.seq_lens[p.key], flat)
            template[o : o + b] = 1
        self._template = template
        self._rows = np.arange(b)
        # per ring entry, numpy views of every buffer: (pool, page size, width, append, bt, sl, wl, col * ps,
        # L // ps and L % ps by stored length L)
        self._views = []
        for t in self._ring.entries:
            a = t.numpy()

            def view(x: torch.Tensor, a=a) -> np.ndarray:
                o = _offset(x, flat)
                return a[o : o + x.numel()].reshape(tuple(x.shape))

            pools = []
            for p in layout.pools:
                sp = layout.span(p.key)
                append = p.mode is StreamMode.APPEND
                pools.append((
                    p.key, p.page_size, sp.width, append, view(bufs.block_tables[p.key]), view(bufs.seq_lens[p.key]),
                    view(bufs.write_loc[p.key]) if append else None, np.arange(sp.width) * p.page_size,
                    np.arange(sp.width * p.page_size) // p.page_size, np.arange(sp.width * p.page_size) % p.page_size,
                ))
            narrow = (
                None if bufs.positions is None else view(bufs.positions),
                None if bufs.recurrent_slots is None else view(bufs.recurrent_slots),
                None if bufs.sampler is None else view(bufs.sampler),
            )
            self._views.append((t, a, pools, narrow))
        self._pos_pool = layout.positions_pool
        self._bases: dict[tuple[int, int], np.ndarray] = {}

    def _row_base(self, pages: np.ndarray) -> np.ndarray:
        """[H] flat index of each handle's first page cell in a [H, Wh] page table (cached by shape)."""
        key = pages.shape
        base = self._bases.get(key)
        if base is None:
            base = self._bases[key] = np.arange(key[0], dtype=np.int64) * key[1]
        return base

    def fill(self, streams: HostStreams, h: np.ndarray) -> None:
        """Write the buffers for rows ``h`` ([n] int64 handles, n <= size) and issue the copy."""
        t = self.build(streams, h)
        self.bufs.flat.copy_(t, non_blocking=True)
        self._ring.done()

    def tables(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """The last build's block table [b, W] and seq_lens [b] of pool ``key`` (numpy views; what fa2 plans on)."""
        for pool in self._views[self._ring.last][2]:
            if pool[0] == key:
                return pool[4], pool[5]
        raise KeyError(f"no pool {key!r}")

    def build(self, streams: HostStreams, h: np.ndarray) -> torch.Tensor:
        """Write the buffers for rows ``h`` into the next host buffer of the ring (no copy); returns it."""
        i, _ = self._ring.take()  # once the copy that last read this host buffer has finished
        t, host, pools, (pos, rec, smp) = self._views[i]
        np.copyto(host, self._template)
        n = h.size
        L_pos = None
        for key, ps, W, append, bt, sl, wl, first, page_col, page_off in pools:
            s = streams.kv[key]
            L = s.lengths.take(h)  # [n] int64
            seq = L + 1 if append else L
            sl[:n] = seq
            Wh = s.pages.shape[1]
            if self.exact_pages and Wh == W:
                bt[:n] = s.pages.take(h, axis=0)  # the streams hold no page past a row's used columns
            else:
                np.multiply(s.pages.take(h, axis=0)[:, :W], first < seq[:, None], out=bt[:n])  # used: j * ps < seq
            if append:  # write_loc = pages[h, L // ps] * ps + L % ps, through the flat page table
                base = self._row_base(s.pages)
                wl[:n] = s.pages.reshape(-1).take(base.take(h) + page_col.take(L)) * ps + page_off.take(L)
            if key == self._pos_pool:
                L_pos = L
        if pos is not None:
            pos[:n] = L_pos + streams.pos_offset.take(h)
        if rec is not None:
            rec[:n] = streams.recurrent_slot.take(h)
        if smp is not None:
            smp[:n] = streams.sampler.take(h, axis=0)
        return t
