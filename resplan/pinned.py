"""The pinned staging ring: ``n`` entries of host buffers (pinned on CUDA, so copies from them are asynchronous), used
in turn. An entry is handed out again only once the copies that last read it (or wrote it) have completed: an event
recorded after them, waited on when the entry comes round. With ``n`` >= 2 and steps that land in order, that wait
is for work long done; off CUDA there is nothing to wait for.

Its users: the executor's stager (a flush program's slot row, whole rows and staged cells), the host arm's fill (a
bucket's StepBuffers), the launcher (input ids, and the sampled tokens read back) and fa2's schedule (its CSR tables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import torch

from resplan.held import HeldCuda, current_raw_stream

T = TypeVar("T")


def made_events(events: list[torch.cuda.Event], device: int) -> list[int]:
    """The raw handles of CUDA ``events``, each made (torch makes an event at its first record: recorded once here, on
    the device's current stream), for records through resplan.held."""
    stream = torch.cuda.current_stream(device)
    for ev in events:
        ev.record(stream)
    return [ev.cuda_event for ev in events]


def host_zeros(n: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """[n] zeros in host memory, pinned when ``pinned`` (a CUDA device's staging)."""
    return torch.zeros(n, dtype=dtype, pin_memory=pinned)


class PinnedRing(Generic[T]):
    """``take()`` the next entry (after its last copies completed), fill it, enqueue the copies, ``done()``."""

    def __init__(self, n: int, make: Callable[[bool], T], cuda: bool, held: HeldCuda | None = None) -> None:
        """``held``: mark completions through it (resplan.held: the interpreter kept), not torch's record."""
        if n < 1:
            raise ValueError(f"a ring needs at least one entry, got {n}")
        self.entries: list[T] = [make(cuda) for _ in range(n)]  # make(pinned) builds one entry's buffers
        self._events = [torch.cuda.Event() if cuda else None for _ in range(n)]
        # (an index, not None: torch.cuda.current_stream(None) looks the device up through is_available, ~5 us a call)
        self._device = torch.cuda.current_device() if cuda else None
        self._next = 0
        self.last = 0  # the entry taken last
        self._held = held if cuda else None
        self._handles = made_events(self._events, self._device) if self._held is not None else []

    def take(self) -> tuple[int, T]:
        """The next entry and its index, once the copies that last used it have completed."""
        i = self._next
        self._next = (i + 1) % len(self.entries)
        self.last = i
        self.wait(i)
        return i, self.entries[i]

    def done(self, stream: torch.cuda.Stream | None = None) -> None:
        """The copies that use the last entry taken are enqueued on ``stream`` (None: the current stream): mark their
        completion."""
        ev = self._events[self.last]
        if ev is None:
            return
        if self._held is not None:
            self.done_on(stream.cuda_stream if stream is not None else current_raw_stream(self._device))
        else:
            ev.record(stream if stream is not None else torch.cuda.current_stream(self._device))

    def done_on(self, stream: int) -> None:
        """``done`` for a ring made with ``held``, the stream given by its raw ``cudaStream_t`` handle (off CUDA:
        nothing to mark)."""
        if self._held is not None:
            self._held.record(self._handles[self.last], stream)

    def wait(self, i: int) -> None:
        """Block until the copies marked on entry ``i`` have completed (at once if none were, or off CUDA). An event
        already complete is only queried: ``synchronize`` lets the interpreter go, and on a busy host another thread
        takes it and keeps it for as long as it runs (``query`` keeps it)."""
        ev = self._events[i]
        if ev is not None and not ev.query():
            ev.synchronize()

    def __len__(self) -> int:
        return len(self.entries)
