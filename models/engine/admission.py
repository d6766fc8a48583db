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
from models.engine.prefix_cache import ROOT as ROOT_KEY
from models.engine.prefix_cache import Checkpoint, Checkpoints, PageRefs, chain_keys, tail_bytes
from models.engine.requests import Request
from models.engine.scheduler import Chunk, Pending
from models.engine.stats import Counts
from resplan import HostStreams, RowLayout, SamplerCell, float_bits
from resplan.layout import SINK_PAGE

SAVE_GRID = 64  # a pass saves a state where its delta rule's 64-token chunks start (counted from the chunk's start)
_NO_PAGES = np.zeros(0, np.int32)
_NO_PAGES.flags.writeable = False

# an offloaded request's pages: pool -> (count, per-layer copies of the moved ones, [count] the kept page a column or 0)
Saved = dict[str, tuple[int, list[torch.Tensor], np.ndarray]]


@attrs.frozen(eq=False)
class Admitted:
    """A step's admit: the handles of the requests it admitted, in order; or, when a pool refused (``refused``),
    none, with how many requests ahead of the refused one it had admitted before it rolled everything back, and the
    pages the rollback gave back."""

    handles: tuple[int, ...]
    starts: tuple[int, ...] = ()  # each admitted request's first stream position to prefill (a restored checkpoint's)
    refused: AdmitRefusal | None = None
    ahead: int = 0
    given: np.ndarray = _NO_PAGES  # [k] int32


_NOTHING = Admitted(())  # a step's admit that admitted no request (decode rows only)


@attrs.frozen(slots=True)
class CacheCounts(Counts):
    """What the prefix cache did."""

    prefix_hits: int = 0  # requests that restored a checkpoint
    prefix_cached_tokens: int = 0  # prompt tokens they did not prefill (the checkpoints' positions)
    checkpoints_taken: int = 0
    checkpoints_evicted: int = 0
    cached_pages_evicted: int = 0


@attrs.frozen
class PrefixSettings:
    """The prefix cache's place in the pools: ``slots`` recurrent slots more than the requests', from ``first_slot``
    (the checkpoints' at first; a finished stream hands its slot to its checkpoint and takes one of theirs, so the
    two sets mix), a checkpoint every ``interval`` tokens of a prompt (and at its end, and at a finished stream's
    end), and the device copies (``copy_states(src, dst)``: recurrent slots, every layer; ``copy_pages(src, dst)``:
    KV pages of the cached pool, every layer)."""

    pool: str  # the APPEND pool whose pages are shared
    first_slot: int
    slots: int
    interval: int
    copy_states: Callable[[np.ndarray, np.ndarray], None]
    copy_pages: Callable[[np.ndarray, np.ndarray], None]

    @classmethod
    def of(cls, cfg, adapter, state, layout: RowLayout, first_slot: int) -> PrefixSettings:
        """An engine's (``cfg``: its EngineConfig): the checkpoints' slots follow the requests' from ``first_slot``,
        the pages shared are the first APPEND pool's."""
        pool = layout.append_keys[0]
        return cls(pool, first_slot, cfg.checkpoints, cfg.checkpoint_interval,
                   index_copier(adapter.recurrent_pools(state)), index_copier(adapter.kv_pages(state, pool)))


def index_copier(tensors: tuple[torch.Tensor, ...]) -> Callable[[np.ndarray, np.ndarray], None]:
    """``copy(src, dst)``: rows ``dst`` of every tensor take rows ``src`` (slots or pages), on the current stream, as
    device-to-device copies of views (one multi-tensor copy for all pairs): no index goes up from the host, so nothing
    waits for the steps in flight (an H2D from pageable memory would). Its host time grows with the views' count (~5
    us a tensor on the H200's host where their dtypes differ): pools stacked into few tensors copy in few. ``dst``
    are distinct and none of them is in ``src``."""

    def copy(src: np.ndarray, dst: np.ndarray) -> None:
        pairs = list(zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True))
        torch._foreach_copy_([t[d] for _, d in pairs for t in tensors], [t[s] for s, _ in pairs for t in tensors])

    return copy


class Admission:
    def __init__(
        self,
        layout: RowLayout,
        page_counts: dict[str, int],
        capacity: int,
        rec_slots: int | None,  # None: the model keeps no recurrent state
        kv_caches: Callable[[str], tuple[torch.Tensor, ...]],  # a pool's caches, one a layer (offload copies)
        device: torch.device,
        prefix: PrefixSettings | None = None,  # the prefix cache (recurrent models), None: off
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
        self.prefix = prefix
        self.refs = PageRefs(page_counts[prefix.pool]) if prefix is not None else None
        self.checkpoints = Checkpoints(prefix.first_slot, prefix.slots, self.page_size) if prefix is not None else None
        self.keys: dict[int, list[bytes]] = {}  # an admitted handle's prompt chain keys (prefix cache on)
        self.cache_counts: list[CacheCounts] = []  # what the cache did since the driver last took them
        self.in_flight: list[tuple[Checkpoint, int]] = []  # the saves of the pass in flight (one at a time) and the
        # pages their tails are copied from when it lands; not indexed yet
        self.tails = 0  # pages the checkpoints hold for their tails (not in use by requests)
        self.prompt_ends: dict[int, tuple[bytes, bytes]] = {}  # a handle's prompt-end checkpoint (its key)

    def free(self) -> dict[str, int]:
        """Pages each pool can hand out: its free ring, the cached pages nobody holds and the checkpoints' tail pages
        (evicted on demand)."""
        out = {k: p.free for k, p in self.page_pools.items()}
        if self.refs is not None:
            saving = sum(1 for ck, _ in self.in_flight if ck.tail_page)  # (tails of saves in flight stay)
            out[self.prefix.pool] += self.refs.evictable + self.tails - saving
        return out

    def pages_in_use(self) -> tuple[int, int]:
        """(pages held, pages that can be held) of the APPEND pools, summed (page 0, the sink, is never held; a cached
        page nobody holds, or a checkpoint's tail page, is not in use)."""
        total = sum(self.page_pools[k].capacity for k in self.append_keys)
        idle = self.refs.evictable + self.tails if self.refs is not None else 0
        return total - sum(self.page_pools[k].free for k in self.append_keys) - idle, total

    def pages_needed(self, prompt_len: int, context: dict[str, int]) -> tuple[tuple[str, int], ...]:
        """Pages a request takes at admission, by pool: its whole prompt in each APPEND pool, its context (tokens by
        READ pool) in each READ pool."""
        return tuple((k, int(p.pages_for(prompt_len if k in self.append_keys else context[k])))
                     for k, p in self.page_pools.items())  # fmt: skip

    def take_counts(self) -> list[CacheCounts] | tuple[()]:
        """What the cache did since the last call (nothing allocated when it did nothing: every step asks)."""
        if not self.cache_counts:
            return ()
        out, self.cache_counts = self.cache_counts, []
        return out

    def _take_pages(self, k: str, n: int) -> np.ndarray:
        """[n] int32 pages of pool k, each now held once; when the ring is short, cached pages nobody holds are
        evicted (least recently let go first), then checkpoints with a tail page (least recently used first).
        AdmitRefused(NO_PAGES) when even that is not enough."""
        pool = self.page_pools[k]
        if self.refs is None or k != self.prefix.pool:
            return pool.take(n)
        short = n - pool.free
        if short > 0:
            if short > self.free()[k]:
                raise AdmitRefused(AdmitRefusal.NO_PAGES, f"pool {k!r}: {n} pages asked, {pool.free} free, "
                                                          f"{self.refs.evictable} cached, {self.tails} checkpoints' "
                                                          f"tails")  # fmt: skip
            cached = min(short, self.refs.evictable)
            if cached:
                pool.give(self.refs.evict(cached))
                self.cache_counts.append(CacheCounts(cached_pages_evicted=cached))
            for _ in range(short - cached):
                self._drop_tail(self.checkpoints.evict_tailed())
                self.cache_counts.append(CacheCounts(checkpoints_evicted=1))
        pages = pool.take(n)
        self.refs.hold(pages)
        return pages

    def _give_pages(self, k: str, pages: np.ndarray) -> None:
        """Pages of pool k lose their holder (in the order given): those nobody holds and no key caches go back."""
        if self.refs is None or k != self.prefix.pool:
            self.page_pools[k].give(pages)
        else:
            self.page_pools[k].give(self.refs.let_go(pages))

    # -- a step's admit transaction ------------------------------------------------------------------------------
    def crossings(self, rows: np.ndarray, tokens: int = 1) -> tuple[tuple[str, np.ndarray, np.ndarray], ...]:
        """The rows one of whose next ``tokens`` tokens (at most a page's) opens a page, by APPEND pool: (pool, [m]
        handles, [m] page columns), only the pools with some (vectorised per pool)."""
        found = []
        for k in self.append_keys:
            L = self.streams.kv[k].lengths[rows]
            col = (L if tokens == 1 else L + (tokens - 1)) // self.page_size
            need = col >= self.n_pages[k][rows]
            if np.count_nonzero(need):
                found.append((k, rows[need], col[need]))
        return tuple(found)

    def room_for(self, rows: np.ndarray, tokens: int) -> bool:
        """Whether each of ``rows`` can write ``tokens`` more tokens: within its APPEND pools' context (positions below
        each pool's max_seq_len, no position past what the model and its pages are sized for), and with a free page
        for each page they open."""
        if any(int(self.streams.kv[p.key].lengths[rows].max()) + tokens > p.max_seq_len
               for p in self.layout.append_pools):  # fmt: skip
            return False
        return self.crossings_fit(self.crossings(rows, tokens))

    def crossings_fit(self, found: tuple[tuple[str, np.ndarray, np.ndarray], ...]) -> bool:
        """Whether every APPEND pool has a free page for each crossing ``found`` (``crossings``)."""
        if not found:
            return True
        free = self.free()
        return all(h.size <= free[k] for k, h, _ in found)

    def take_crossings(self, found: tuple[tuple[str, np.ndarray, np.ndarray], ...], txn: AdmitTxn) -> None:
        """A page for each crossing ``found`` (``crossings``), in ``txn``."""
        for k, h, c in found:
            pages = self._take_pages(k, h.size)
            self.streams.kv[k].pages[h, c] = pages
            self.n_pages[k][h] += 1
            txn.crossings.append(Crossing(k, h, c, pages))

    def admit(self, rows: np.ndarray, admits: Sequence[tuple[Pending, int]], txn: AdmitTxn,
              tokens: int = 1) -> Admitted:  # fmt: skip
        """The step's admit as one transaction: the decode rows' crossing pages (for ``tokens`` tokens a row), then for
        each admitted request a handle, its prompt's (and context's) pages and a recurrent slot. When a pool refuses,
        everything the transaction took (``txn``'s crossings taken early included) is given back."""
        ahead, starts = 0, []
        try:
            self.take_crossings(self.crossings(rows, tokens), txn)
            for pend, _ in admits:
                h = self.handles.take()
                txn.admitted.append(h)
                starts.append(self._take(h, pend))
                ahead += 1
        except AdmitRefused as e:
            return Admitted((), (), e.reason, ahead, self._rollback(txn))
        return Admitted(tuple(txn.admitted), tuple(starts)) if txn.admitted else _NOTHING

    def _take(self, h: int, pend: Pending) -> int:
        """Handle h's prompt (and context) pages and recurrent slot, each of which may refuse (AdmitRefused). Its
        streams start empty, or (prefix cache) at the deepest checkpoint its prompt hits: cached pages shared, the
        checkpoint's state and tail page copied in. Its sampler cells hold the request's (with ``min_tokens``: the
        position its stop tokens are banned below, and those tokens). Returns the first position to prefill."""
        st = self.streams
        ck, shared = self._restore_point(h, pend)
        start = ck.position if ck is not None else 0
        for k, n in pend.pages:
            lead = shared if ck is not None and k == self.prefix.pool else _NO_PAGES
            if lead.size:  # held first: a cached page nobody holds could be evicted for the new ones
                self.refs.hold(lead)
            try:
                pages = self._take_pages(k, n - lead.size)
            except AdmitRefused:
                self._give_pages(k, lead[::-1])
                raise
            if lead.size:
                pages = np.concatenate([lead, pages])
            st.kv[k].pages[h, :n] = pages
            self.n_pages[k][h] = n
        if self.rec is not None:
            st.recurrent_slot[h] = self.rec.take()
        for s in st.kv.values():
            s.lengths[h] = 0
            s.epoch[h] += 1
        if ck is not None:
            self._restore(h, ck, shared.size)
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
        return start

    # -- the prefix cache --------------------------------------------------------------------------------------------
    def _restore_point(self, h: int, pend: Pending) -> tuple[Checkpoint | None, np.ndarray]:
        """The checkpoint handle h's prompt restores (None: none) and the cached pages below it it shares."""
        if self.refs is None:
            return None, _NO_PAGES
        self.keys[h] = list(pend.keys)
        return self._lookup(pend, touch=True)

    def _lookup(self, pend: Pending, touch: bool) -> tuple[Checkpoint | None, np.ndarray]:
        """The deepest checkpoint on ``pend``'s prompt whose pages are cached (``touch``: it counts as used), and
        those pages; none for a request that asks for its prompt's logprobs (every position computed)."""
        prompt = pend.request.prompt
        if pend.request.sampling.prompt_logprobs is not None:
            return None, _NO_PAGES
        run = self.refs.cached_run(pend.keys)
        ck = self.checkpoints.deepest(prompt, pend.keys, len(run), len(prompt) - 1, touch)
        if ck is None:
            return None, _NO_PAGES
        return ck, np.asarray(run[: ck.position // self.page_size], np.int32)

    def cached(self, pend: Pending) -> tuple[str, int, int]:
        """(pool, position, pages): what ``pend`` would restore if admitted now (the scheduler's estimate): the
        position it would prefill from, and the pages it would not take from ``free()`` (the shared pages someone
        holds; one nobody holds is counted free, and holding it takes it from there)."""
        ck, pages = self._lookup(pend, touch=False)
        held = self.refs.held(pages)
        return self.prefix.pool, ck.position if ck is not None else 0, held

    def _restore(self, h: int, ck: Checkpoint, shared: int) -> None:
        """Handle h starts at checkpoint ``ck``: its state copied into h's slot, its tail page into h's page after
        the ``shared`` ones; h's APPEND lengths at its position."""
        st, k = self.streams, self.prefix.pool
        self.prefix.copy_states(np.array([ck.slot]), np.array([st.recurrent_slot[h]]))
        if ck.tail_page:
            self.prefix.copy_pages(np.array([ck.tail_page]), st.kv[k].pages[h, shared : shared + 1].copy())
        for key in self.append_keys:
            st.kv[key].lengths[h] = ck.position
        self.cache_counts.append(CacheCounts(prefix_hits=1, prefix_cached_tokens=ck.position))

    def _checkpoint(self, h: int, position: int, base: bytes, tail: bytes) -> tuple[Checkpoint, int] | None:
        """A checkpoint of handle h's stream at ``position`` in a slot reserved now (a least recently used checkpoint
        evicted if none is free), with a page of its own for its tail, and the page of h's it copies the tail from
        (0: no tail); None when every slot is a save in flight, or no page is left for the tail. Not indexed."""
        slot = self._reserve()
        if slot is None:
            return None
        tail_page = src = 0
        if position % self.page_size:
            try:
                tail_page = int(self._take_pages(self.prefix.pool, 1)[0])
            except AdmitRefused:
                self.checkpoints.unreserve(slot)
                return None
            src = int(self.streams.kv[self.prefix.pool].pages[h, position // self.page_size])
            self.tails += 1
        return Checkpoint(slot, position, base, tail, tail_page), src

    def _drop_tail(self, ck: Checkpoint) -> None:
        """A checkpoint that goes lets its tail page go."""
        if ck.tail_page:
            self._give_pages(self.prefix.pool, np.array([ck.tail_page], np.int32))
            self.tails -= 1

    def _reserve(self) -> int | None:
        """A checkpoint slot (an evicted checkpoint's tail page let go); None when every slot is a save in flight."""
        if not self.checkpoints.free and not len(self.checkpoints):
            return None
        slot, old = self.checkpoints.reserve()
        if old is not None:
            self._drop_tail(old)
            self.cache_counts.append(CacheCounts(checkpoints_evicted=1))
        return slot

    def keep(self, h: int, tokens: np.ndarray) -> None:
        """Handle h's stream is done: its full pages cached under their chain keys, and its state (the slot's, after
        its ``lengths`` tokens, the first of ``tokens``) checkpointed, unless one is there already; its prompt's end
        checkpoint, which a next turn passes, becomes the first to evict. Nothing is copied: h's recurrent slot becomes
        the checkpoint's (h's release gives the reserved checkpoint slot to the requests' pool instead) and h's last
        page, if partly filled, its tail page (held once more, so h's release does not free it). A step still in
        flight with h in it completes the slot and page before anything enqueued later reads them. A stream that ran
        past its last token (a launch of k tokens a row, ``EngineConfig.tokens_per_launch``) has its full pages up to
        that token cached and no checkpoint: its state is past it."""
        if self.refs is None:
            return
        st, k, ps = self.streams, self.prefix.pool, self.page_size
        n = int(st.kv[k].lengths[h])
        past = n > len(tokens)
        n = min(n, len(tokens))
        if n == 0:
            return
        prompt_keys = self.keys.get(h, [])[: n // ps]  # (its prompt's full pages: cached when their pass landed)
        keys = chain_keys(tokens[:n], ps, len(prompt_keys), prompt_keys[-1] if prompt_keys else ROOT_KEY)
        self.refs.insert(st.kv[k].pages[h, len(prompt_keys) : n // ps].astype(np.int32), keys)
        if past:
            return
        keys = prompt_keys + keys
        base = keys[-1] if n >= ps else ROOT_KEY
        tail = tail_bytes(tokens, (n // ps) * ps, n)
        if self.checkpoints.has(base, tail):
            return
        end = self.prompt_ends.pop(h, None)  # its prompt's end, now behind this one: the first to evict
        if end is not None and end in self.checkpoints.lru:
            self.checkpoints.lru.move_to_end(end, last=False)
        slot = self._reserve()
        if slot is None:
            return
        tail_page = 0
        if n % ps:
            tail_page = int(st.kv[k].pages[h, n // ps])
            self.refs.hold(np.array([tail_page], np.int32))
            self.tails += 1
        self.checkpoints.add(Checkpoint(int(st.recurrent_slot[h]), n, base, tail, tail_page))
        st.recurrent_slot[h] = slot
        self.cache_counts.append(CacheCounts(checkpoints_taken=1))

    def saves(self, chunks: Sequence[Chunk], requests: Sequence[Request]) -> list[list[tuple[int, int]]]:
        """Each chunk's recurrent-state saves in its pass (``requests[i]``: chunk i's; none without the prefix
        cache)."""
        if self.refs is None:
            return []
        return [self._saves(c, r.prompt) for c, r in zip(chunks, requests, strict=True)]

    def _saves(self, chunk: Chunk, prompt) -> list[tuple[int, int]]:
        """The checkpoints a pass takes of ``chunk``: every ``interval`` tokens of its prompt (where the pass's
        64-token grid from the chunk's start meets them) and the prompt's end, less those already there. Returns the
        pass's (position, slot) saves; their checkpoints are indexed when the pass lands (``landed``)."""
        h, ps, iv = chunk.handle, self.page_size, self.prefix.interval
        end = chunk.start + chunk.n
        at = [p for p in range(-(-(chunk.start + 1) // iv) * iv, end + 1, iv)
              if (p - chunk.start) % SAVE_GRID == 0 or p == end]  # fmt: skip
        if chunk.last and end not in at:
            at.append(end)
        keys = self.keys[h]
        out = []
        for p in at:
            base = keys[p // ps - 1] if p >= ps else ROOT_KEY
            tail = tail_bytes(prompt, (p // ps) * ps, p)
            if self.checkpoints.has(base, tail):
                continue
            taken = self._checkpoint(h, p, base, tail)
            if taken is None:
                break  # every slot is a save in flight (a pool smaller than one pass's saves), or no page is left
            out.append((p, taken[0].slot))
            self.in_flight.append(taken)
            if p == len(prompt):
                self.prompt_ends[h] = (base, tail)
        return out

    def landed(self, chunks: Sequence[Chunk]) -> None:
        """A pass landed: the full pages its chunks completed are cached, its checkpoints (``saves``) indexed."""
        if self.refs is None:
            return
        cks, self.in_flight = self.in_flight, []
        k, ps = self.prefix.pool, self.page_size
        for c in chunks:
            keys = self.keys.get(c.handle)
            if keys is None:  # (the request ended meanwhile)
                continue
            lo, hi = c.start // ps, min((c.start + c.n) // ps, len(keys))
            self.refs.insert(self.streams.kv[k].pages[c.handle, lo:hi].astype(np.int32), keys[lo:hi])
        tails = [(src, ck.tail_page) for ck, src in cks if src]  # (after the pass wrote them: it has landed)
        if tails:
            self.prefix.copy_pages(*(np.array(x) for x in zip(*tails, strict=True)))
        for ck, _ in cks:
            if self.checkpoints.has(ck.base, ck.tail):  # (another took it meanwhile)
                self._drop_tail(ck)
                self.checkpoints.unreserve(ck.slot)
                continue
            self.checkpoints.add(ck)
        if cks:
            self.cache_counts.append(CacheCounts(checkpoints_taken=len(cks)))

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
            self._give_pages(c.pool, c.pages[still])
            given.append(c.pages[still])
        return np.concatenate(given) if given else _NO_PAGES

    def _free_pages(self, h: int) -> np.ndarray:
        """Every page of handle h goes back to its pool; its streams keep their lengths. Returns the pages."""
        given = []
        for k, held in self.n_pages.items():
            pages = self.streams.kv[k].pages[h, : held[h]].copy()
            self._empty_row(k, h, pages)
            given.append(pages)
        return np.concatenate(given)

    def _empty_row(self, k: str, h: int, pages: np.ndarray) -> None:
        """Handle h holds no page of pool k any more: ``pages`` (those of its row it lets go) go back, the last first
        (a chain's tail is evicted before its head), and its row points at the sink."""
        s = self.streams.kv[k]
        self._give_pages(k, pages[::-1])
        s.pages[h] = SINK_PAGE
        self.n_pages[k][h] = 0
        s.epoch[h] += 1

    # -- lengths -------------------------------------------------------------------------------------------------
    def advance(self, rows: np.ndarray, tokens: int = 1) -> None:
        """The rows ran ``tokens`` decode tokens: their APPEND lengths + that, the rule the resident graph's commit
        follows (+1 a sub-step)."""
        for k in self.append_keys:
            self.streams.kv[k].lengths[rows] += tokens

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
        given = [self._free_pages(h)]
        for k, (_, _, kept) in self.saved.pop(h, {}).items():  # an offloaded request's kept pages
            kept = kept[kept > 0]
            self._give_pages(k, kept[::-1])
            given.append(kept)
        self.keys.pop(h, None)
        self.prompt_ends.pop(h, None)
        for s in self.streams.kv.values():
            s.lengths[h] = 0
        if self.rec is not None:
            self.rec.give(int(self.streams.recurrent_slot[h]))
            self.streams.recurrent_slot[h] = 0
        self.handles.give(h)
        return np.concatenate(given)

    # -- KV pressure ---------------------------------------------------------------------------------------------
    def offload(self, h: int) -> np.ndarray:
        """Copy handle h's KV pages to the host and give them back; returns the pages given back. A cached page (the
        prefix cache's: full, read-only) is not copied: h keeps its reference, and it comes back as it is."""
        saved, given = {}, []
        for k, held in self.n_pages.items():
            n = int(held[h])
            row = self.streams.kv[k].pages[h, :n].astype(np.int32)
            kept = np.zeros(n, np.int32)  # [n] the page kept at each column, 0 where the page was copied
            if self.refs is not None and k == self.prefix.pool:
                cached = self.refs.cached(row)
                kept[cached] = row[cached]
            moved = row[kept == 0]
            idx = torch.from_numpy(moved.astype(np.int64)).to(self.device)
            saved[k] = (n, [c[idx].to("cpu", copy=True) for c in self.kv_caches(k)], kept)
            self._empty_row(k, h, moved)
            given.append(moved)
        self.saved[h] = saved
        return np.concatenate(given)

    def reload_fits(self, h: int, watermark: int) -> bool:
        """Whether offloaded handle h's pages fit, and the page its next token opens (if it does), with ``watermark``
        pages left free in each APPEND pool (else the step after the reload would offload it again)."""
        free = self.free()
        return all(int(np.count_nonzero(kept == 0)) + (watermark + self._opens(k, h, n) if k in self.append_keys
                                                        else 0) <= free[k]
                   for k, (n, _, kept) in self.saved[h].items())  # fmt: skip

    def _opens(self, k: str, h: int, n: int) -> int:
        """1 if handle h's next token, written at its APPEND length in pool k, opens a page past the n it holds."""
        return int(int(self.streams.kv[k].lengths[h]) // self.page_size >= n)

    def spill_until_fits(self, h: int, offloaded: Sequence[int], watermark: int) -> tuple[int, int]:
        """Offloaded handles, in ``offloaded``'s order, spill their kept pages (``spill``) until h's reload fits beside
        ``watermark``; returns (handles that spilled, pages they let go)."""
        spills = pages = 0
        for o in offloaded:
            if self.reload_fits(h, watermark):
                break
            spills, pages = spills + 1, pages + self.spill(o)
        return spills, pages

    def spill(self, h: int) -> int:
        """Offloaded handle h lets go of the cached pages it kept: they are copied to the host beside its other pages
        and come back on new pages like them (a reload may then find the pages that offloaded requests pinned).
        Returns how many pages it let go."""
        let_go = 0
        for k, (n, copies, kept) in self.saved[h].items():
            pinned = kept > 0
            if not pinned.any():
                continue
            moved_at, pinned_at = torch.from_numpy(~pinned), torch.from_numpy(pinned)
            idx = torch.from_numpy(kept[pinned].astype(np.int64)).to(self.device)
            whole = []
            for c, t in zip(self.kv_caches(k), copies, strict=True):
                w = torch.empty((n, *c.shape[1:]), dtype=c.dtype)  # [n, ...] every column's page, in column order
                w[moved_at] = t
                w[pinned_at] = c[idx].to("cpu")
                whole.append(w)
            self._give_pages(k, kept[pinned][::-1])
            self.saved[h][k] = (n, whole, np.zeros(n, np.int32))
            let_go += int(pinned.sum())
        return let_go

    def reload(self, h: int) -> None:
        """Handle h's pages back: the kept ones as they were, the others from the host copies, on new pages."""
        for k, (n, copies, kept) in self.saved.pop(h).items():
            pages = kept.copy()
            moved = kept == 0
            new = self._take_pages(k, int(moved.sum()))
            pages[moved] = new
            self.streams.kv[k].pages[h, :n] = pages
            self.streams.kv[k].epoch[h] += 1
            self.n_pages[k][h] = n
            idx = torch.from_numpy(new.astype(np.int64)).to(self.device)
            for c, t in zip(self.kv_caches(k), copies, strict=True):
                c[idx] = t.to(self.device)
