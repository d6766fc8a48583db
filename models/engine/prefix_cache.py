"""The prefix cache of a hybrid model: KV pages shared by the token chain that wrote them, and recurrent-state
checkpoints at chosen stream positions.

Pages. A full page j of a stream is keyed by the chain ``key_j = blake2b(key_{j-1} || tokens of page j)`` (``ROOT``
before page 0), so a key names the whole prefix through that page. ``PageRefs`` counts, for every page of a pool, the
rows and checkpoints that hold it; a page whose count reaches 0 goes back to the free ring unless it is cached, in
which case it waits in an LRU until a pool that needs pages evicts it. A stream's pages are let go last page first, so
a chain's tail is evicted before its head (a lookup walks from the head and stops at the first miss).

Checkpoints. A checkpoint is a recurrent slot (every GDN layer's conv and SSM state) holding the state after the first
P tokens of a stream, keyed by the chain key of its ``P // page_size`` full pages and the bytes of its remaining
tokens (the tail). When P is not on a page boundary, the checkpoint also holds a page of its own with a copy of the
tail's KV, which a request restoring it copies into a page of its own (it will write the rest of that page). A
request restores the deepest checkpoint at P <= its prompt length - 1 (at least one token is prefilled, whose logits
draw its first token) whose full pages are all cached, and prefills from P.

Everything here is host bookkeeping; the device copies (a checkpoint into a request's slot, a tail page) are the
engine's.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import attrs
import numpy as np

ROOT = b"resplan-prefix-root"  # the chain key before page 0


def chain_keys(tokens: np.ndarray, page_size: int, first: int = 0, before: bytes = ROOT) -> list[bytes]:
    """Chain keys of the full pages ``first`` .. of ``tokens`` (``before``: the key of page ``first - 1``)."""
    out, key = [], before
    t = np.ascontiguousarray(tokens, dtype="<i8")
    for j in range(first, len(t) // page_size):
        key = hashlib.blake2b(key + t[j * page_size : (j + 1) * page_size].tobytes(), digest_size=16).digest()
        out.append(key)
    return out


def tail_bytes(tokens, start: int, stop: int) -> bytes:
    """The tokens start .. stop - 1 (of an array or a sequence) as the bytes a checkpoint's tail is matched by."""
    return np.asarray(tokens[start:stop], dtype="<i8").tobytes()


class PageRefs:
    """Reference counts of one pool's pages, the cached pages by chain key, and the LRU of cached pages nobody holds
    (evictable). A page is in exactly one of: the pool's free ring (count 0, not cached), held (count > 0), or the
    LRU (count 0, cached). The counts are Python ints in a list: a request's pages are tens, where a loop over ints
    costs a fraction of numpy's fancy indexing (~0.1 against ~2 us an operation on this project's hosts)."""

    def __init__(self, num_pages: int) -> None:
        self.count = [0] * num_pages  # [num_pages] each page's holders
        self.page_of: dict[bytes, int] = {}  # chain key -> cached page
        self.key_of: dict[int, bytes] = {}  # cached page -> chain key
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached pages with count 0, least recently let go first

    @property
    def evictable(self) -> int:
        return len(self.idle)

    def cached_run(self, keys: list[bytes]) -> list[int]:
        """The cached pages of the longest run of ``keys`` from the first."""
        out = []
        for k in keys:
            p = self.page_of.get(k)
            if p is None:
                break
            out.append(p)
        return out

    def held(self, pages: np.ndarray) -> int:
        """How many of ``pages`` someone holds."""
        count = self.count
        return sum(1 for p in pages.tolist() if count[p])

    def hold(self, pages: np.ndarray) -> None:
        """Each page gains a holder (a cached page leaves the LRU)."""
        count, idle = self.count, self.idle
        for p in pages.tolist():
            if count[p] == 0 and idle:
                idle.pop(p, None)
            count[p] += 1

    def let_go(self, pages: np.ndarray) -> np.ndarray:
        """Each page loses a holder, in the order given; returns the pages that are free now (count 0, not cached),
        for the ring. Cached ones at 0 join the LRU as its most recent."""
        count, key_of, idle, free = self.count, self.key_of, self.idle, []
        for p in pages.tolist():
            count[p] -= 1
            if count[p] == 0:
                if p in key_of:
                    idle[p] = None
                else:
                    free.append(p)
        return np.array(free, np.int32)

    def cached(self, pages: np.ndarray) -> np.ndarray:
        """[n] bool: the page is cached (under a chain key)."""
        return np.fromiter((p in self.key_of for p in pages.tolist()), bool, pages.size)

    def insert(self, pages: np.ndarray, keys: list[bytes]) -> int:
        """Cache held full pages under their chain keys (a key cached already keeps its page); returns how many were
        added."""
        added = 0
        for p, k in zip(pages.tolist(), keys, strict=True):
            if k in self.page_of or p in self.key_of:
                continue
            self.page_of[k], self.key_of[p] = p, k
            added += 1
        return added

    def evict(self, n: int) -> np.ndarray:
        """The ``n`` least recently let go cached pages, uncached: [n] int32 for the ring."""
        out = np.empty(n, np.int32)
        for i in range(n):
            p, _ = self.idle.popitem(last=False)
            del self.page_of[self.key_of.pop(p)]
            out[i] = p
        return out


@attrs.define(eq=False)
class Checkpoint:
    """A recurrent slot holding a stream's state after its first ``position`` tokens (module doc)."""

    slot: int
    position: int
    base: bytes  # chain key of its position // page_size full pages (ROOT: none)
    tail: bytes  # its tokens past them (tail_bytes)
    tail_page: int  # its own page holding a copy of the tail's KV, 0 when the tail is empty


@attrs.frozen
class Restore:
    """What a request restores: ``pages`` cached full pages to share, and the checkpoint (None: nothing but pages,
    which without a state are of no use, so a Restore always has one)."""

    checkpoint: Checkpoint
    pages: np.ndarray  # [position // page_size] int32 cached pages, shared

    @property
    def position(self) -> int:
        return self.checkpoint.position


class Checkpoints:
    """The checkpoint pool: slots ``first .. first + n - 1`` of the recurrent pools, an index by (base, tail), and an
    LRU. A slot reserved for a save in a pass in flight is in neither the index nor the LRU until the pass lands."""

    def __init__(self, first: int, n: int, page_size: int) -> None:
        self.page_size = page_size
        self.free = list(range(first + n - 1, first - 1, -1))  # a stack, lowest on top
        self.size = n
        self.by_base: dict[bytes, dict[bytes, Checkpoint]] = {}
        self.lru: OrderedDict[tuple[bytes, bytes], Checkpoint] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self.lru)

    def has(self, base: bytes, tail: bytes) -> bool:
        return tail in self.by_base.get(base, {})

    def deepest(self, prompt, keys, cached: int, limit: int, touch: bool = True) -> Checkpoint | None:
        """The checkpoint at the largest position <= ``limit`` on ``prompt``'s chain whose full pages are among its
        first ``cached`` pages (``keys``: the prompt's chain keys); ``touch``: it becomes the most recently used."""
        ps = self.page_size
        for j in range(min(cached, limit // ps), -1, -1):
            found = self.by_base.get(keys[j - 1] if j else ROOT)
            if not found:
                continue
            best = None
            for tail, ck in found.items():
                if ck.position <= limit and (best is None or ck.position > best.position) and (
                        not tail or tail == tail_bytes(prompt, j * ps, ck.position)):  # fmt: skip
                    best = ck
            if best is not None:
                if touch:
                    self.lru.move_to_end((best.base, best.tail))
                return best
        return None

    def reserve(self) -> tuple[int, Checkpoint | None]:
        """A slot for a new checkpoint: a free one, else the least recently used checkpoint's (returned, evicted: its
        tail page is the caller's to let go). Refused (RuntimeError) when every slot is reserved by saves in flight."""
        if self.free:
            return self.free.pop(), None
        if not self.lru:
            raise RuntimeError(f"all {self.size} checkpoint slots are reserved by saves in flight")
        (base, tail), old = self.lru.popitem(last=False)
        del self.by_base[base][tail]
        if not self.by_base[base]:
            del self.by_base[base]
        return old.slot, old

    def evict_tailed(self) -> Checkpoint:
        """Evict the least recently used checkpoint that holds a tail page (its slot freed); returns it."""
        key = next(key for key, ck in self.lru.items() if ck.tail_page)
        ck = self.lru.pop(key)
        del self.by_base[ck.base][ck.tail]
        if not self.by_base[ck.base]:
            del self.by_base[ck.base]
        self.free.append(ck.slot)
        return ck

    def add(self, ck: Checkpoint) -> None:
        """Index a checkpoint whose state is written (a landed save, or a copy on the engine's stream)."""
        self.by_base.setdefault(ck.base, {})[ck.tail] = ck
        self.lru[(ck.base, ck.tail)] = ck

    def unreserve(self, slot: int) -> None:
        """A reserved slot whose save will not be indexed goes back."""
        self.free.append(slot)
