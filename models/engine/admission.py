"""Admission: the finite things a request holds and the host streams that say where they are. KV pages (a PagePool
per pool, and how many each handle holds), request handles and recurrent-state slots; a step's admit as one
transaction (its decode rows' crossing pages, then each admitted request's handle, pages and slot) rolled back whole
when a pool refuses; and offload and reload of a request's pages under KV pressure.

Whatever gives pages back calls ``on_give(pages)``: a pre-plan whose program names one of them is stale, else a
retried step with the same rows would reuse it and write its token into a page the row no longer holds (the seed's
refused-admit bug).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from models.engine.pools import AdmitTxn, Crossing, PagePool, handle_pool, recurrent_pool
from models.engine.scheduler import Batch, Pending, Scheduler, Status
from resplan import HostStreams, RowLayout, SamplerCell, float_bits


class Admission:
    def __init__(
        self,
        layout: RowLayout,
        page_counts: dict[str, int],
        capacity: int,
        rec_slots: int | None,  # None: the model keeps no recurrent state
        scheduler: Scheduler,
        kv_caches: Callable[[str], tuple[torch.Tensor, ...]],  # a pool's caches, one a layer (offload copies)
        device: torch.device,
    ) -> None:
        self.layout = layout
        self.page_size = layout.pools[0].page_size
        self.page_pools = {k: PagePool(k, n, self.page_size) for k, n in page_counts.items()}
        self.append_keys = tuple(p.key for p in layout.append_pools)
        self.streams = HostStreams.zeros(layout, capacity)
        self.n_pages = {k: np.zeros(capacity, np.int64) for k in self.page_pools}  # pages each handle holds
        self.handles = handle_pool(capacity)
        self.rec = recurrent_pool(rec_slots) if rec_slots is not None else None
        self.scheduler = scheduler
        self.kv_caches = kv_caches
        self.device = device
        self.on_give: Callable[[np.ndarray], None] | None = None

    def free(self) -> dict[str, int]:
        return {k: p.free for k, p in self.page_pools.items()}

    # -- a step's admit transaction ------------------------------------------------------------------------------
    def crossing_need(self, rows: np.ndarray) -> dict[str, int]:
        """Pages the rows' next tokens open, by APPEND pool."""
        need = {}
        for k in self.append_keys:
            col = self.streams.kv[k].lengths[rows] // self.page_size
            need[k] = int(np.count_nonzero(col >= self.n_pages[k][rows]))
        return need

    def crossings_fit(self, rows: np.ndarray) -> bool:
        """Whether every APPEND pool has a free page for each of the rows' next tokens that opens one."""
        need = self.crossing_need(rows)
        return all(need[k] <= self.page_pools[k].free for k in need)

    def take_crossings(self, rows: np.ndarray, txn: AdmitTxn) -> None:
        """A page for each row whose next token opens one (vectorised per pool)."""
        for k in self.append_keys:
            s, held = self.streams.kv[k], self.n_pages[k]
            col = s.lengths[rows] // self.page_size
            need = col >= held[rows]
            if not need.any():
                continue
            h, c = rows[need], col[need]
            pages = self.page_pools[k].take(h.size)
            s.pages[h, c] = pages
            held[h] += 1
            txn.crossings.append(Crossing(k, h, c, pages))

    def take_handle(self, txn: AdmitTxn) -> int:
        """A handle for the next admitted request (AdmitRefused when none is free), recorded in the transaction."""
        h = self.handles.take()
        txn.admitted.append(h)
        return h

    def admit(self, h: int, pend: Pending) -> None:
        """Handle h's prompt (and context) pages and recurrent slot, each of which may refuse (AdmitRefused; the
        transaction's rollback gives back what was taken). Its streams start empty, its sampler cells hold the
        request's."""
        st = self.streams
        for k, n in pend.pages:
            pages = self.page_pools[k].take(n)
            st.kv[k].pages[h, :n] = pages
            self.n_pages[k][h] = n
        if self.rec is not None:
            st.recurrent_slot[h] = self.rec.take()
        for s in st.kv.values():
            s.lengths[h] = 0
            s.epoch[h] += 1
        st.pos_offset[h] = 0
        sp = pend.request.sampling
        st.sampler[h, SamplerCell.TEMPERATURE] = float_bits(sp.temperature)
        st.sampler[h, SamplerCell.TOP_P] = float_bits(sp.top_p)
        st.sampler[h, SamplerCell.TOP_K] = sp.top_k
        st.sampler[h, SamplerCell.SEED] = sp.seed

    def rollback(self, txn: AdmitTxn) -> list[int]:
        """Give back everything a refused admit took, newest first; returns the handles it had taken, newest first
        (the caller puts their requests back at the queue's head in that order)."""
        undone = []
        for h in reversed(txn.admitted):
            self.free_pages(h)
            if self.rec is not None and self.streams.recurrent_slot[h]:
                self.rec.give(int(self.streams.recurrent_slot[h]))
                self.streams.recurrent_slot[h] = 0
            self.handles.give(h)
            undone.append(h)
        for c in reversed(txn.crossings):
            s, held = self.streams.kv[c.pool], self.n_pages[c.pool]
            still = (s.pages[c.handles, c.cols] == c.pages) & (held[c.handles] == c.cols + 1)  # not offloaded since
            h = c.handles[still]
            s.pages[h, c.cols[still]] = 0
            held[h] -= 1
            self._give_pages(c.pool, c.pages[still])
        return undone

    def _give_pages(self, key: str, pages: np.ndarray) -> None:
        self.page_pools[key].give(pages)
        if self.on_give is not None and pages.size:
            self.on_give(pages)

    def free_pages(self, h: int) -> None:
        """Every page of handle h goes back to its pool; its streams keep their lengths."""
        for k, held in self.n_pages.items():
            s = self.streams.kv[k]
            self._give_pages(k, s.pages[h, : held[h]].copy())
            s.pages[h] = 0
            held[h] = 0
            s.epoch[h] += 1

    def release(self, h: int) -> None:
        """Handle h's request ended: its pages, recurrent slot and handle come back, its streams empty."""
        self.free_pages(h)
        for s in self.streams.kv.values():
            s.lengths[h] = 0
        if self.rec is not None:
            self.rec.give(int(self.streams.recurrent_slot[h]))
            self.streams.recurrent_slot[h] = 0
        self.handles.give(h)

    # -- KV pressure ---------------------------------------------------------------------------------------------
    def victim(self, batch: Batch) -> int | None:
        """The request to offload so the decode rows' crossings find pages, or None when they fit: the least recently
        run request outside the step, else the least recently run of its rows."""
        if self.crossings_fit(batch.rows):
            return None
        sch = self.scheduler
        in_step = np.concatenate([batch.rows, np.array([c.handle for c in batch.chunks], np.int64)])
        victims = sch.victims(in_step)
        if victims.size == 0:  # only this step's rows hold pages: the least recently run of them goes
            r = batch.rows
            victims = r[np.lexsort((sch.arrival[r], sch.last_run[r]))]
        return int(victims[0])

    def offload(self, h: int) -> dict[str, tuple[int, list[torch.Tensor]]]:
        """Copy handle h's KV pages to the host and give them back; returns the copies, by pool."""
        saved = {}
        for k, held in self.n_pages.items():
            n = int(held[h])
            idx = torch.from_numpy(self.streams.kv[k].pages[h, :n].astype(np.int64)).to(self.device)
            saved[k] = (n, [c[idx].to("cpu", copy=True) for c in self.kv_caches(k)])
        self.free_pages(h)
        return saved

    def reload_fits(self, saved: dict[str, tuple[int, list[torch.Tensor]]]) -> bool:
        """Whether an offloaded request's pages fit beside a watermark: a page for each decoding request's next
        crossing (none when nothing else is resident)."""
        sch = self.scheduler
        resident = np.count_nonzero((sch.status == Status.DECODING) | (sch.status == Status.PREFILLING))
        watermark = np.count_nonzero(sch.status == Status.DECODING) if resident else 0
        return all(n + (watermark if k in self.append_keys else 0) <= self.page_pools[k].free
                   for k, (n, _) in saved.items())  # fmt: skip

    def reload(self, h: int, saved: dict[str, tuple[int, list[torch.Tensor]]]) -> None:
        """Handle h's pages back from the host copies, on new pages."""
        for k, (n, copies) in saved.items():
            pages = self.page_pools[k].take(n)
            self.streams.kv[k].pages[h, :n] = pages
            self.streams.kv[k].epoch[h] += 1
            self.n_pages[k][h] = n
            idx = torch.from_numpy(pages.astype(np.int64)).to(self.device)
            for c, t in zip(self.kv_caches(k), copies, strict=True):
                c[idx] = t.to(self.device)
