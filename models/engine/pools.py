"""The finite things a request holds: KV pages (one PagePool per KV pool, page 0 the sink), a recurrent-state slot
(slot 0 the sink) and a handle (its row index in the host streams). Each refuses, with a typed reason, when it has
none left; an AdmitTxn records what one step's admit took so that a refusal can give all of it back."""

from __future__ import annotations

import bisect
import enum
import math
import operator

import attrs
import numpy as np

from models.layers.specs import KVPoolSpec
from resplan import RowLayout, StreamMode


def pool_layout(
    specs: tuple[KVPoolSpec, ...],
    page_size: int,
    max_running: int,
    max_seq_len: int,
    num_pages: int | None,
    positions_pool: str,
    recurrent: bool,
) -> tuple[RowLayout, dict[str, int]]:
    """The row layout of a model's pools and each pool's page count (sink included). An APPEND pool's streams hold up
    to ``max_seq_len`` tokens, a READ pool's up to its own limit; an APPEND pool has ``num_pages`` pages, or by
    default room for every running request at its longest stream, a READ pool always that. ValueError when a pool
    cannot hold one request's longest stream."""
    pools, counts = [], {}
    for spec in specs:
        append = spec.mode is StreamMode.APPEND
        longest = max_seq_len if append else spec.max_seq_len
        width = math.ceil(longest / page_size)
        n = num_pages if append and num_pages is not None else max_running * width + 1
        if n - 1 < width:
            raise ValueError(f"pool {spec.key!r}: {n - 1} usable pages cannot hold one request of {longest} tokens "
                             f"({width} pages of {page_size}); raise num_pages or lower max_seq_len")  # fmt: skip
        pools.append(spec.layout_pool(page_size, n, longest))
        counts[spec.key] = n
    return RowLayout(tuple(pools), positions_pool, recurrent=recurrent, sampler=True), counts


class AdmitRefusal(enum.Enum):
    NO_PAGES = "the KV pool has too few free pages"
    NO_RECURRENT_SLOT = "the recurrent-state pool has no free slot"
    NO_HANDLE = "every request handle is in use"


class AdmitRefused(Exception):
    """A pool refused what a step's admit asked of it; the admit is rolled back whole."""

    def __init__(self, reason: AdmitRefusal, detail: str) -> None:
        super().__init__(f"{reason.name}: {reason.value}: {detail}")
        self.reason = reason


class PagePool:
    """Pages 1 .. num_pages-1 of one KV pool in a FIFO ring: ``take`` from the head, ``give`` to the tail, both
    vectorised. Page 0 is the sink page that padding rows read and write; it is never handed out."""

    def __init__(self, key: str, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"pool {key!r}: num_pages must be >= 2 (page 0 is the sink), got {num_pages}")
        self.key = key
        self.num_pages = num_pages
        self.page_size = page_size
        self.capacity = num_pages - 1
        self._ring = np.arange(1, num_pages, dtype=np.int32)  # [capacity]
        self._head = 0
        self.free = self.capacity  # free pages

    def pages_for(self, tokens: int | np.ndarray) -> int | np.ndarray:
        """Pages that hold ``tokens`` tokens."""
        return -(-tokens // self.page_size)

    def take(self, k: int) -> np.ndarray:
        """[k] int32 pages off the head of the ring; AdmitRefused(NO_PAGES) when fewer than k are free."""
        if k > self.free:
            raise AdmitRefused(AdmitRefusal.NO_PAGES, f"pool {self.key!r}: {k} pages asked, {self.free} free")
        head = self._head
        out = (self._ring[head : head + k].copy() if head + k <= self.capacity
               else self._ring[(head + np.arange(k)) % self.capacity])  # fmt: skip
        self._head = (head + k) % self.capacity
        self.free -= k
        return out

    def give(self, pages: np.ndarray) -> None:
        """Pages back to the tail of the ring (a page given back is handed out again last)."""
        n = pages.size
        if n == 0:
            return
        tail = (self._head + self.free) % self.capacity
        if tail + n <= self.capacity:
            self._ring[tail : tail + n] = pages
        else:
            self._ring[(tail + np.arange(n)) % self.capacity] = pages
        self.free += n

    def free_pages(self) -> np.ndarray:
        """[free] the free pages in the order they will be handed out (tests and debugging)."""
        return self._ring[(self._head + np.arange(self.free)) % self.capacity]


class SlotPool:
    """Slots 1 .. n-1 (0 is the sink) or handles 0 .. n-1, lowest free first; refuses with ``reason`` when empty."""

    def __init__(self, n: int, first: int, reason: AdmitRefusal, what: str) -> None:
        self._free = list(range(n - 1, first - 1, -1))  # a stack with the lowest on top
        self.reason = reason
        self.what = what
        self.size = n - first

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self) -> int:
        if not self._free:
            raise AdmitRefused(self.reason, f"all {self.size} {self.what} are held")
        return self._free.pop()

    def give(self, i: int) -> None:
        bisect.insort(self._free, i, key=operator.neg)  # (descending: the lowest stays on top)

    def free_slots(self) -> list[int]:
        """The free slots (or handles), the next one handed out last (tests and debugging)."""
        return list(self._free)


def recurrent_pool(num_slots: int) -> SlotPool:
    """Recurrent-state slots 1 .. num_slots-1; slot 0 is the sink slot padding rows read and write."""
    if num_slots < 2:
        raise ValueError(f"a recurrent pool needs >= 2 slots (slot 0 is the sink), got {num_slots}")
    return SlotPool(num_slots, 1, AdmitRefusal.NO_RECURRENT_SLOT, "recurrent slots")


def handle_pool(capacity: int) -> SlotPool:
    """Request handles 0 .. capacity-1 (rows of the host streams)."""
    return SlotPool(capacity, 0, AdmitRefusal.NO_HANDLE, "handles")


@attrs.define(eq=False)
class Crossing:
    """Pages one step gave its decode rows whose next token opens a page: pages[i] at column cols[i] of handles[i]."""

    pool: str
    handles: np.ndarray  # [k] int64
    cols: np.ndarray  # [k] int64
    pages: np.ndarray  # [k] int32


@attrs.define(eq=False)
class AdmitTxn:
    """What one step's admit took, in order: crossing pages of its decode rows (some taken early, with the
    early plan), then each admitted request's handle, pages and slot. A refusal gives all of it back."""

    crossings: list[Crossing] = attrs.Factory(list)
    admitted: list[int] = attrs.Factory(list)  # handles admitted this step (their pages/slots are on the streams)
