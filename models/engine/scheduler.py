"""Which requests a step runs: decode rows in a bucket, prefill chunks under a token budget, and admissions.

A request is waiting (submitted), then admitted (it holds a handle, a recurrent slot and the pages of its whole prompt)
and PREFILLING in chunks, then DECODING one token a step until it finishes; under KV pressure it may be OFFLOADED
(its pages copied to the host and given back) and later reloaded. An overlapped engine RETIRES a request whose last
token is in a launched step whose tokens it has not read yet: no later step runs it. Per-handle state is numpy, so
choosing a steady step's rows is a few vectorised ops, never a Python loop over rows.

Decode order: ARRIVAL fills the bucket with the oldest decoding requests, which run to completion; TURNS runs the least
recently run first, so rows take turns and (with fewer slots than requests) displace each other. A step with any
prefill work runs a pass (prefill chunks, plus the decode rows as a mixed step); a step of decode rows only is a
decode step in a bucket. (An engine that runs its prefill passes on a stream of their own composes no prefill work
while one is in flight, and runs a step's decode rows as a decode step beside the pass it launches.) ``compose`` only
looks: it changes nothing, so the next step can be prepared early.
"""

from __future__ import annotations

import enum
import functools
from collections import deque
from collections.abc import Callable

import attrs
import numpy as np

from models.engine.prefix_cache import chain_keys
from models.engine.requests import Request

DEFAULT_BUCKETS = (1, 2, 4, 8, *range(16, 129, 8))  # 1, 2, 4, 8, 16, 24, 32, ..., 128


def decode_buckets(max_bucket: int) -> tuple[int, ...]:
    """The default buckets up to ``max_bucket``, which is always the last one."""
    if max_bucket <= 0:
        raise ValueError(f"max_bucket must be > 0, got {max_bucket}")
    return tuple(b for b in DEFAULT_BUCKETS if b < max_bucket) + (max_bucket,)


class Order(enum.Enum):
    ARRIVAL = "arrival"  # the oldest decoding requests fill the bucket and run to completion
    TURNS = "turns"  # the least recently run go first: rows take turns


class Status(enum.IntEnum):
    FREE = 0
    PREFILLING = 1
    DECODING = 2
    OFFLOADED = 3
    RETIRING = 4  # its last token is in a step still in flight: it runs no more, and finishes when that step lands


_DECODING = int(Status.DECODING)  # the step path compares the status array with a plain int: 5x faster than the enum
_RETIRING = int(Status.RETIRING)


@attrs.frozen(eq=False)
class Pending:
    """A validated request waiting for admission."""

    rid: str
    request: Request
    arrival: int
    pages: tuple[tuple[str, int], ...]  # (pool, pages it takes at admission): its whole prompt, its context
    stops: tuple[int, ...]  # the tokens that end it (requests.stop_set, once at submission): what min_tokens bans
    page_size: int = 0  # with the prefix cache on, its pages' tokens (0: off, no chain keys)

    @functools.cached_property
    def keys(self) -> tuple[bytes, ...]:
        """Its prompt's full pages' chain keys (``prefix_cache.chain_keys``; none with the cache off), hashed when a
        step first considers admitting it: a burst's submissions do not hash every prompt at once (~35 us a prompt of
        512 tokens, half a submission)."""
        return tuple(chain_keys(self.request.prompt, self.page_size)) if self.page_size else ()


@attrs.frozen
class Chunk:
    """A prefill chunk: tokens start .. start+n-1 of an admitted request's prompt."""

    handle: int
    start: int
    n: int
    last: bool  # the chunk ends the prompt: its last logits sample the first token


def handles_of(chunks: tuple[Chunk, ...]) -> np.ndarray:
    """[n] int64: the chunks' handles, in order."""
    return np.array([c.handle for c in chunks], np.int64)


@attrs.frozen(eq=False)
class Batch:
    """What one step runs."""

    rows: np.ndarray  # [n] int64 handles decoding this step, in arrival order
    bucket: int  # the captured bucket the rows run in, 0 when there are none
    chunks: tuple[Chunk, ...]  # prefill chunks of requests admitted in earlier steps
    admits: tuple[tuple[Pending, int], ...]  # waiting requests admitted this step, with their first chunk's tokens

    @property
    def has_prefill(self) -> bool:
        """The step has prefill work (a mixed step when it also has decode rows)."""
        return bool(self.chunks or self.admits)

    def decode_only(self) -> Batch:
        """The step's decode rows alone (its prefill work runs beside them)."""
        return Batch(self.rows, self.bucket, (), ())

    @property
    def empty(self) -> bool:
        return self.rows.size == 0 and not self.chunks and not self.admits


class Scheduler:
    def __init__(
        self,
        capacity: int,  # requests admitted at once (handles)
        buckets: tuple[int, ...],
        order: Order,
        token_budget: int | None,  # prefill tokens a step, None: whole prompts
        append_pools: tuple[str, ...],
        rows_in_budget: bool = False,  # the decode rows ride in the prefill pass: each takes one token of the budget
    ) -> None:
        self.capacity = capacity
        self.buckets = buckets
        self.max_bucket = buckets[-1]
        self.order = order
        self.token_budget = token_budget
        self.rows_in_budget = rows_in_budget
        self.append_pools = append_pools
        self._bucket_of = np.array([next(b for b in buckets if b >= n) for n in range(1, self.max_bucket + 1)])
        H = capacity
        self.status = np.zeros(H, np.int8)  # Status
        self.resume = np.zeros(H, np.int8)  # Status to resume after a reload
        self.arrival = np.zeros(H, np.int64)
        self.last_run = np.full(H, -1, np.int64)  # seq of the last step that ran the request
        self.prompt_len = np.zeros(H, np.int64)
        self.prefilled = np.zeros(H, np.int64)
        self.waiting: deque[Pending] = deque()
        self.prefilling: list[int] = []  # resident PREFILLING handles, in arrival order
        self.offloaded: list[int] = []  # OFFLOADED handles, oldest offload first
        self.admit_quota: int | None = None  # after a refused admit: admissions left until a request finishes
        self.admitted = 0
        self._rows: np.ndarray | None = None  # decode_rows() until a transition changes what it depends on
        self.version = 0  # bumped by every transition: a batch composed at one version is composed again at another

    # -- choosing a step ---------------------------------------------------------------------------------------------
    def decode_rows(self) -> np.ndarray:
        """[n] handles of the decode rows of the next step, in arrival order (read-only; kept between calls until a
        transition changes the statuses, or under TURNS the last runs, it depends on)."""
        if self._rows is None:
            self._rows = self._compute_decode_rows()
            self._rows.flags.writeable = False
        return self._rows

    def _compute_decode_rows(self) -> np.ndarray:
        dec = np.flatnonzero(self.status == _DECODING)
        if dec.size > self.max_bucket:
            if self.order is Order.ARRIVAL:
                dec = dec[np.argsort(self.arrival[dec], kind="stable")[: self.max_bucket]]
            else:
                dec = dec[np.lexsort((self.arrival[dec], self.last_run[dec]))[: self.max_bucket]]
        return dec[np.argsort(self.arrival[dec], kind="stable")].astype(np.int64, copy=False)

    def has_work(self) -> bool:
        """Requests wait or are admitted."""
        return bool(self.waiting) or self.admitted > 0

    def waits_on_retiring(self) -> bool:
        """A request waits while another is RETIRING (which gives its handle and pages back when its last step
        lands: landing it first admits the waiting one a step earlier)."""
        return bool(self.waiting) and bool((self.status == _RETIRING).any())

    def load(self) -> tuple[int, int]:
        """(requests waiting for admission, requests admitted)."""
        return len(self.waiting), self.admitted

    def describe(self) -> str:
        """How many requests wait, are admitted and offloaded (for an error message)."""
        return f"{len(self.waiting)} waiting, {self.admitted} admitted ({len(self.offloaded)} offloaded)"

    def next_reload(self) -> int | None:
        """The offloaded request to reload first (the oldest offload), or None."""
        return self.offloaded[0] if self.offloaded else None

    def bucket(self, n: int) -> int:
        return int(self._bucket_of[n - 1]) if n else 0

    def compose(self, free: Callable[[], dict[str, int]], prefill: bool = True,
                cached: Callable[[Pending], tuple[str, int, int]] | None = None) -> Batch:  # fmt: skip
        """The next step, given ``free()``: the free pages of each pool (asked only when a request waits); ``prefill``
        False: decode rows only (a prefill pass is still in flight); ``cached(pend)``: (pool, position, pages) a
        waiting request would restore from the prefix cache, so that its first chunk and pages count only what it
        computes. Pure: nothing changes until the engine admits it."""
        rows = self.decode_rows()
        if not prefill:
            return Batch(rows, self.bucket(rows.size), (), ())
        budget = self.token_budget if self.token_budget is not None else 2**62
        if self.rows_in_budget:  # a step's pass holds at most token_budget tokens, its decode rows' included
            budget -= rows.size
        chunks = []
        for h in self.prefilling:
            if budget <= 0:
                break
            start = int(self.prefilled[h])
            n = min(int(self.prompt_len[h]) - start, budget)
            chunks.append(Chunk(h, start, n, start + n == self.prompt_len[h]))
            budget -= n
        admits = []
        if self.admit_quota != 0 and self.waiting and not self.offloaded:  # (an offloaded request came first)
            left = free()
            watermark = int(np.count_nonzero(self.status == _DECODING))  # each may open a page next step
            n_admitted = self.admitted
            for pend in self.waiting:
                if n_admitted >= self.capacity or budget <= 0 or len(admits) == self.admit_quota:
                    break
                idle = n_admitted == 0  # nothing else holds pages: admit without keeping the watermark
                reserve = {k: 0 if idle or k not in self.append_pools else watermark for k in left}
                pool, start, shared = cached(pend) if cached is not None else ("", 0, 0)
                pages = [(k, need - shared if k == pool else need) for k, need in pend.pages]
                if any(left[k] < need + reserve[k] for k, need in pages):
                    break  # first come, first served: no one overtakes the head of the queue
                n = min(len(pend.request.prompt) - start, budget)
                admits.append((pend, n))
                budget -= n
                n_admitted += 1
                for k, need in pages:
                    left[k] -= need
        return Batch(rows, self.bucket(rows.size), tuple(chunks), tuple(admits))

    def victim(self, batch: Batch) -> int:
        """The request to offload so that ``batch``'s decode rows' crossings find pages: the least recently run request
        holding pages outside the step, else the least recently run of its rows."""
        in_step = np.concatenate([batch.rows, np.array([c.handle for c in batch.chunks], np.int64)])
        cand = np.flatnonzero((self.status == Status.DECODING) | (self.status == Status.PREFILLING))
        cand = cand[~np.isin(cand, in_step)]
        if cand.size == 0:  # only this step's rows hold pages: the least recently run of them goes
            cand = batch.rows
        return int(cand[np.lexsort((self.arrival[cand], self.last_run[cand]))][0])

    def reload_watermark(self) -> int:
        """Pages a reload leaves free in each APPEND pool: one for each decoding request's next crossing (none when
        nothing else holds pages)."""
        holding = np.count_nonzero((self.status == _DECODING) | (self.status == Status.PREFILLING))
        return int(np.count_nonzero(self.status == _DECODING)) if holding else 0

    # -- transitions (the engine calls these as it carries a step out) -----------------------------------------------
    def _transition(self) -> None:
        """A transition the decode rows may depend on: forget the kept rows, and move the version."""
        self._rows, self.version = None, self.version + 1

    def admit(self, h: int, pend: Pending, start: int = 0) -> None:
        """A waiting request holds handle h; its prompt is prefilled from ``start`` (a restored checkpoint's)."""
        self._transition()
        self.waiting.remove(pend)
        self.status[h] = Status.PREFILLING
        self.arrival[h] = pend.arrival
        self.last_run[h] = -1
        self.prompt_len[h] = len(pend.request.prompt)
        self.prefilled[h] = start
        self.prefilling.append(h)
        self.admitted += 1
        if self.admit_quota is not None:
            self.admit_quota -= 1

    def enqueue(self, pend: Pending) -> None:
        """A validated request waits for admission, behind every request that came before it."""
        self.version += 1
        self.waiting.append(pend)

    def drop_waiting(self, rid: str) -> Pending | None:
        """Take the waiting request ``rid`` out of the queue (it is aborted); None when it is not waiting."""
        for pend in self.waiting:
            if pend.rid == rid:
                self.version += 1
                self.waiting.remove(pend)
                return pend
        return None

    def refused(self, admitted: int) -> None:
        """A pool refused a step's admit: the retry admits only the ``admitted`` requests ahead of the refused one,
        and no more until a request finishes."""
        self.version += 1
        self.admit_quota = admitted

    def prefilled_chunks(self, chunks: tuple[Chunk, ...], seq: int) -> None:
        """A pass (at step ``seq``) ran ``chunks``: a chunk that ends its prompt makes its request DECODING."""
        self._transition()
        for chunk in chunks:
            h = chunk.handle
            self.prefilled[h] = chunk.start + chunk.n
            self.last_run[h] = seq
            if chunk.last:
                self.prefilling.remove(h)
                self.status[h] = Status.DECODING

    def ran(self, rows: np.ndarray, seq: int) -> None:
        self.last_run[rows] = seq
        if self.order is Order.TURNS:  # ARRIVAL picks rows by arrival alone
            self._transition()

    def retire(self, hs: np.ndarray) -> None:
        """DECODING handles whose last token a step in flight produces: no step after it runs them."""
        if hs.size == 0:
            return
        self._transition()
        self.status[hs] = Status.RETIRING

    def finish(self, h: int) -> None:
        """The request of handle h ended (finished, stopped or aborted), whatever its status."""
        self._transition()
        if self.status[h] == Status.PREFILLING:
            self.prefilling.remove(h)
        elif self.status[h] == Status.OFFLOADED:
            self.offloaded.remove(h)
        self.status[h] = Status.FREE
        self.admitted -= 1
        self.admit_quota = None  # what a refusal waited for may be free now

    def offload(self, h: int) -> None:
        self._transition()
        self.resume[h] = self.status[h]
        if self.status[h] == Status.PREFILLING:
            self.prefilling.remove(h)
        self.status[h] = Status.OFFLOADED
        self.offloaded.append(h)

    def reload(self, h: int) -> None:
        self._transition()
        self.offloaded.remove(h)
        self.status[h] = self.resume[h]
        if self.status[h] == Status.PREFILLING:
            self.prefilling.append(h)
            self.prefilling.sort(key=lambda x: self.arrival[x])
