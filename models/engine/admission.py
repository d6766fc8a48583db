"""Admission: the finite things a request holds and the host streams that say where they are. KV pages (a PagePool
per pool, and how many each handle holds), request handles and recurrent-state slots; a step's admit as one
transaction (its decode rows' crossing pages, then each admitted request's handle, pages and slot) rolled back whole
when a pool refuses; offload and reload of a request's pages under KV pressure; and the lengths a step or a pass
adds. Admission is the only writer of the host streams.

Whatever gives pages back returns them: a plan made early whose program names one of them is void (else a retried
step with the same rows would reuse it and write its token into a page the row no longer holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np
import torch

from models.engine.pools import AdmitRefusal, AdmitRefused, AdmitTxn, Crossing, PagePool, handle_pool, recurrent_pool
from models.engine.scheduler import Chunk, Pending
from resplan import HostStreams, RowLayout, SamplerCell, float_bits
from resplan.layout import SINK_PAGE

_NO_PAGES = np.zeros(0, np.int32)
_NO_PAGES.flags.writeable = False

Saved = dict[str, tuple[int, list[torch.Tensor]]]  # an offloaded request's pages: pool -> (count, per-layer copies)


@attrs.frozen(eq=False)
class Admitted:
    """A step's admit: the handles of the requests it admitted, in order; or, when a pool refused (``refused``),
    none, with how many requests ahead of the refused one it had admitted before it rolled everything back, and the
    pages the rollback gave back."""

    handles: tuple[int, ...]
    refused: AdmitRefusal | None = None
    ahead: int = 0
    given: np.ndarray = _NO_PAGES  # [k] int32


_NOTHING = Admitted(())  # a step's admit that admitted no request (decode rows only)


class Admission:
    def __init__(
        self,
        layout: RowLayout,
        page_counts: dict[str, int],
        capacity: int,
        rec_slots: int | None,  # None: the model keeps no recurrent state
        kv_caches: Callable[[str], tuple[torch.Tensor, ...]],  # a pool's caches, one a layer (offload copies)
        device: torch.device,
    ) -> None:
        self.layout = layout
        self.page_size = layout.pools[0].page_size
        self.page_pools = {k: PagePool(k, n, self.page_size) for k, n in page_counts.items()}
        self.append_keys = tuple(p.key for p in layout.append_pools)
        self.read_keys = tuple(p.key for p in layout.read_pools)
        self.streams = HostStreams.zeros(layout, capacity)
        self.n_pages = {k: np.zeros(capacity, np.int64) for k in self.page_pools}  # pages each handle holds
        self.handles = handle_pool(capacity)
        self.rec = recurrent_pool(rec_slots) if rec_slots is not None else None
        self.saved: dict[int, Saved] = {}  # offloaded handles' page copies
        self.kv_caches = kv_caches
        self.device = device

    def free(self) -> dict[str, int]:
        return {k: p.free for k, p in self.page_pools.items()}

    def pages_in_use(self) -> tuple[int, int]:
        """(pages held, pages that can be held) of the APPEND pools, summed (page 0, the sink, is never held)."""
        pools = [self.page_pools[k] for k in self.append_keys]
        total = sum(p.capacity for p in pools)
        return total - sum(p.free for p in pools), total

    def pages_needed(self, prompt_len: int, context: dict[str, int]) -> tuple[tuple[str, int], ...]:
        """Pages a request takes at admission, by pool: its whole prompt in each APPEND pool, its context (tokens by
        READ pool) in each READ pool."""
        return tuple((k, int(p.pages_for(prompt_len if k in self.append_keys else context[k])))
                     for k, p in self.page_pools.items())  # fmt: skip

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

    def admit(self, rows: np.ndarray, admits: Sequence[tuple[Pending, int]], txn: AdmitTxn) -> Admitted:
        """The step's admit as one transaction: the decode rows' crossing pages, then for each admitted request a
        handle, its prompt's (and context's) pages and a recurrent slot. When a pool refuses, everything the
        transaction took (``txn``'s crossings taken early included) is given back."""
        ahead = 0
        try:
            self.take_crossings(rows, txn)
            for pend, _ in admits:
                h = self.handles.take()
                txn.admitted.append(h)
                self._take(h, pend)
                ahead += 1
        except AdmitRefused as e:
            return Admitted((), e.reason, ahead, self._rollback(txn))
        return Admitted(tuple(txn.admitted)) if txn.admitted else _NOTHING

    def _take(self, h: int, pend: Pending) -> None:
        """Handle h's prompt (and context) pages and recurrent slot, each of which may refuse (AdmitRefused). Its
        streams start empty, its sampler cells hold the request's (with ``min_tokens``: the position its stop tokens
        are banned below, and those tokens)."""
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
        banned = pend.stops if sp.min_tokens else ()  # (its output's token j is drawn at position prompt + j - 1)
        st.sampler[h, SamplerCell.MIN_POSITION] = len(pend.request.prompt) - 1 + sp.min_tokens if banned else 0
        st.sampler[h, SamplerCell.STOP_0 :] = -1
        st.sampler[h, SamplerCell.STOP_0 : SamplerCell.STOP_0 + len(banned)] = banned

    def _rollback(self, txn: AdmitTxn) -> np.ndarray:
        """Give back everything a refused admit took, newest first; returns the pages given back."""
        given = []
        for h in reversed(txn.admitted):
            given.append(self._free_pages(h))
            if self.rec is not None and self.streams.recurrent_slot[h]:
                self.rec.give(int(self.streams.recurrent_slot[h]))
                self.streams.recurrent_slot[h] = 0
            self.handles.give(h)
        for c in reversed(txn.crossings):
            s, held = self.streams.kv[c.pool], self.n_pages[c.pool]
            still = (s.pages[c.handles, c.cols] == c.pages) & (held[c.handles] == c.cols + 1)  # not offloaded since
            h = c.handles[still]
            s.pages[h, c.cols[still]] = SINK_PAGE
            held[h] -= 1
            self.page_pools[c.pool].give(c.pages[still])
            given.append(c.pages[still])
        return np.concatenate(given) if given else _NO_PAGES

    def _free_pages(self, h: int) -> np.ndarray:
        """Every page of handle h goes back to its pool; its streams keep their lengths. Returns the pages."""
        given = []
        for k, held in self.n_pages.items():
            s = self.streams.kv[k]
            pages = s.pages[h, : held[h]].copy()
            self.page_pools[k].give(pages)
            given.append(pages)
            s.pages[h] = SINK_PAGE
            held[h] = 0
            s.epoch[h] += 1
        return np.concatenate(given)

    # -- lengths -------------------------------------------------------------------------------------------------
    def advance(self, rows: np.ndarray) -> None:
        """The rows ran a decode token: their APPEND lengths +1, the rule the resident graph's commit follows."""
        for k in self.append_keys:
            self.streams.kv[k].lengths[rows] += 1

    def prefilled(self, chunks: Sequence[Chunk], contexts: Sequence[dict[str, int]]) -> None:
        """A pass was launched over ``chunks``: each chunk's APPEND lengths cover what it ran, and a request's first
        chunk, which encoded its context, sets its READ lengths (``contexts[i]``: chunk i's tokens by READ pool)."""
        st = self.streams
        for chunk, ctx in zip(chunks, contexts, strict=True):
            h = chunk.handle
            if chunk.start == 0:
                for k in self.read_keys:
                    st.kv[k].lengths[h] = ctx[k]
                    st.kv[k].epoch[h] += 1
            for k in self.append_keys:
                st.kv[k].lengths[h] = chunk.start + chunk.n
                st.kv[k].epoch[h] += 1

    # -- a request leaves --------------------------------------------------------------------------------------------
    def release(self, h: int) -> np.ndarray:
        """Handle h's request ended: its pages (or their host copies), recurrent slot and handle come back, its streams
        empty. Returns the pages given back."""
        given = self._free_pages(h)
        self.saved.pop(h, None)
        for s in self.streams.kv.values():
            s.lengths[h] = 0
        if self.rec is not None:
            self.rec.give(int(self.streams.recurrent_slot[h]))
            self.streams.recurrent_slot[h] = 0
        self.handles.give(h)
        return given

    # -- KV pressure ---------------------------------------------------------------------------------------------
    def offload(self, h: int) -> np.ndarray:
        """Copy handle h's KV pages to the host and give them back; returns the pages given back."""
        saved = {}
        for k, held in self.n_pages.items():
            n = int(held[h])
            idx = torch.from_numpy(self.streams.kv[k].pages[h, :n].astype(np.int64)).to(self.device)
            saved[k] = (n, [c[idx].to("cpu", copy=True) for c in self.kv_caches(k)])
        self.saved[h] = saved
        return self._free_pages(h)

    def reload_fits(self, h: int, watermark: int) -> bool:
        """Whether offloaded handle h's pages fit with ``watermark`` pages left free in each APPEND pool."""
        return all(n + (watermark if k in self.append_keys else 0) <= self.page_pools[k].free
                   for k, (n, _) in self.saved[h].items())  # fmt: skip

    def reload(self, h: int) -> None:
        """Handle h's pages back from the host copies, on new pages."""
        for k, (n, copies) in self.saved.pop(h).items():
            pages = self.page_pools[k].take(n)
            self.streams.kv[k].pages[h, :n] = pages
            self.streams.kv[k].epoch[h] += 1
            self.n_pages[k][h] = n
            idx = torch.from_numpy(pages.astype(np.int64)).to(self.device)
            for c, t in zip(self.kv_caches(k), copies, strict=True):
                c[idx] = t.to(self.device)
