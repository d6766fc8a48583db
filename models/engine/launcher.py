"""The launcher: a step's input ids, its graph replay, and the readback of its sampled tokens.

A step's sampled tokens stay on the device (``tokens_all``); a graph that takes its input ids from the device takes
each row's id from there when the row ran in the last replayed step (``src`` = its position), else from a host id (a
row that prefilled, or last ran earlier). The host copies ``(ids, src)`` only when they change: a steady step copies
none. Pinned host buffers come in two sets used by alternate launches: a buffer is rewritten only after the launch
before last has landed, so one step may be in flight while the next is launched (overlap). A step's graphs come in
a pair (``graphs.Pair``): the one a launch replays reads its sampled tokens back into that launch's set itself. The
replay and the record of the readback's event go through ``resplan.held``, so a steady launch makes no call that lets
the interpreter go (on a busy host each such call hands it to another thread, which may keep it for a millisecond;
torch's replay and record each let it go). A LOGPROBS graph also writes every row's logprobs (``logprobs``), read
back with the tokens on the same event.
"""

from __future__ import annotations

import time

import attrs
import numpy as np
import torch

from models.engine.requests import MAX_LOGPROBS, TokenLogprobs
from models.engine.stats import Counts
from resplan import Graph
from resplan.held import HeldCuda, current_raw_stream, device_index
from resplan.pinned import PinnedRing, host_zeros, made_events


@attrs.frozen(eq=False, slots=False)  # (per-step records are dict classes: a frozen one's __init__ is cheaper)
class InFlight:
    """A launched step whose sampled tokens the host has not read yet."""

    rows: np.ndarray  # [n] handles, in the step's row order
    serial: np.ndarray  # [n] their admissions' serials at launch: a row whose serial changed since is dropped
    bucket: int
    parity: int  # which pinned readback buffer and events it uses
    decode: bool  # a pure decode step (its phases count in the stats)
    logprobs: bool = False  # its graph wrote the rows' logprobs, read back with the tokens
    tokens: int = 1  # tokens each row ran (a graph of that many sub-steps)


@attrs.frozen(slots=False)
class Launched(Counts):
    """What a launch did. A host-planned step's launch counts only its rows."""

    rows_decoded: int
    padded_rows: int
    launch_ns: int = 0  # decode steps: input ids copy (if any) + graph replay launch (its readback in the graph)
    h2d_copies: int = 0
    h2d_bytes: int = 0
    ids_copies: int = 0


@attrs.frozen(slots=False)
class Landed(Counts):
    """What landing a step did: the rows it dropped, and for a decode step the wait for its tokens and its graph's
    GPU time (with timing on)."""

    discarded: int = 0
    wait_ns: int = 0
    gpu_ms: float = 0.0


@attrs.frozen(eq=False)
class _HostIO:
    """One launch's pinned host buffers, by bucket: (host ids, src) [2, b], the sampled tokens read back ([T, b]: a
    row a token of the launch, T the most a launch runs) and their logprobs ([b], [b, 5], [b, 5]), with their numpy
    views (made once: a torch slice costs microseconds of host time)."""

    idsrc: dict[int, torch.Tensor]  # b -> [2, b]
    idsrc_np: dict[int, np.ndarray]
    ids: dict[int, torch.Tensor]  # b -> [b], idsrc[b][0]: a host-planned step's input ids
    ids_np: dict[int, np.ndarray]
    tokens: dict[int, torch.Tensor]  # b -> [T, b] (each row contiguous)
    tokens_np: np.ndarray  # [T, B]
    logprobs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # b -> [b] f32, [b, 5] i64, [b, 5] f32
    logprobs_np: TokenLogprobs  # [B], [B, 5], [B, 5]

    @classmethod
    def make(cls, buckets: tuple[int, ...], tokens: int, pinned: bool) -> _HostIO:
        B, K, T = buckets[-1], MAX_LOGPROBS, tokens
        flat, toks = host_zeros(2 * B, torch.int64, pinned), host_zeros(T * B, torch.int64, pinned).view(T, B)
        lp = (host_zeros(B, torch.float32, pinned), host_zeros(B * K, torch.int64, pinned).view(B, K),
              host_zeros(B * K, torch.float32, pinned).view(B, K))  # fmt: skip
        idsrc = {b: flat[: 2 * b].view(2, b) for b in buckets}
        idsrc_np = {b: v.numpy() for b, v in idsrc.items()}
        return cls(idsrc, idsrc_np, {b: v[0] for b, v in idsrc.items()}, {b: v[0] for b, v in idsrc_np.items()},
                   {b: toks[:, :b] for b in buckets}, toks.numpy(), {b: tuple(t[:b] for t in lp) for b in buckets},
                   TokenLogprobs(*(t.numpy() for t in lp)))  # fmt: skip


class Launcher:
    def __init__(self, buckets: tuple[int, ...], capacity: int, device: torch.device, timing: bool,
                 tokens: int = 1) -> None:  # fmt: skip
        """``tokens``: the most tokens a row runs in one launch (the readback holds a row of tokens each)."""
        B, cuda = buckets[-1], device.type == "cuda"
        self.timing = timing
        i64 = dict(dtype=torch.int64, device=device)
        self.tokens_all = torch.zeros(B, **i64)  # [B] the last replayed step's sampled tokens, in its row order
        self.tokens = {b: self.tokens_all[:b] for b in buckets}  # [b] written by bucket b's graphs
        lp = (torch.zeros(B, dtype=torch.float32, device=device), torch.zeros(B, MAX_LOGPROBS, **i64),
              torch.zeros(B, MAX_LOGPROBS, dtype=torch.float32, device=device))  # fmt: skip
        self.logprobs = {b: tuple(t[:b] for t in lp) for b in buckets}  # [b], [b, 5], [b, 5]: LOGPROBS graphs'
        self.idsrc = {b: torch.zeros(2, b, **i64) for b in buckets}  # [2, b]: host ids; src (-1: host id)
        self.ids = {b: self.idsrc[b][0] for b in buckets}  # [b] a host-planned graph's input ids
        self._idsrc_now = {b: np.zeros((2, b), np.int64) for b in buckets}  # what idsrc[b] holds
        self._idsrc_now_ids = {b: self._idsrc_now[b][0] for b in buckets}  # views made once (hot path)
        self._arange = np.arange(B, dtype=np.int64)
        # idsrc[b] holds (0, arange(b)): a full step of the rows last launched takes every id from the device
        self._idsrc_steady = {b: bool(np.array_equal(self._idsrc_now[b][1], self._arange[:b])) for b in buckets}
        self._last_key: bytes | None = None  # the last launch's rows (tobytes) while each still has its position
        # two entries, used by alternate launches: an entry's completion is its sampled tokens' readback
        # its index (torch.cuda.current_stream(None) looks the device up through is_available: ~5 us a call)
        self._device = device_index(device) if cuda else None
        # a launch's replay and records keep the interpreter (resplan.held); torch's replay makes the graph's device
        # current first and the held calls do not, so an engine built off the current device launches through torch's
        held = cuda and self._device == torch.cuda.current_device()
        self._held = HeldCuda.load() if held else None
        self._ring = PinnedRing(2, lambda pinned: _HostIO.make(buckets, tokens, pinned), cuda, self._held)
        self._timers = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda
                        else None for _ in range(2)]  # fmt: skip
        self._timer_handles = ([made_events(list(t), self._device) for t in self._timers]
                               if self._held is not None else None)  # fmt: skip
        self._tok_pos = np.full(capacity, -1, np.int64)  # each handle's position in tokens_all, -1 when not there
        self._last_rows = np.zeros(0, np.int64)  # the rows of the step that wrote tokens_all
        self._inflight: InFlight | None = None  # the step launched and not landed (overlap)

    @property
    def inflight(self) -> InFlight | None:
        """The step launched and not landed (overlap), if any."""
        return self._inflight

    def hold(self, f: InFlight) -> InFlight | None:
        """Keep ``f`` in flight (overlap); returns the step that was in flight before it, to be landed now."""
        prev, self._inflight = self._inflight, f
        return prev

    def take_inflight(self) -> InFlight | None:
        """The step in flight, if any, which the caller lands now."""
        f, self._inflight = self._inflight, None
        return f

    def forget(self, h: int | np.ndarray) -> None:
        """Handle(s) h serve a new request, or none, or took their last token outside a graph: their next id is the
        host's, not a token in ``tokens_all``."""
        self._tok_pos[h] = -1
        self._last_key = None

    def readback(self, k: int, b: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Pinned entry k's buffers that bucket b's graph of parity k reads its tokens ([T, b]: row j the launch's
        j-th token) and logprobs ([b], [b, 5], [b, 5]) back into."""
        io = self._ring.entries[k]
        return io.tokens[b], io.logprobs[b]

    def launch(self, graphs: tuple[Graph, Graph], b: int, rows: np.ndarray, serial: np.ndarray,
               last_token: np.ndarray, device_ids: bool, decode: bool, logprobs: bool = False,
               tokens: int = 1) -> tuple[InFlight, Launched]:  # fmt: skip
        """Copy the step's input ids (the rows' ``last_token``, [H] by handle; a graph that takes them from the device
        copies them only if they changed), replay the graph of the pinned entry taken, which reads the sampled tokens
        back into it (``logprobs``: a LOGPROBS graph, and its logprobs too). ``serial``: [n] the rows' admission
        serials. ``decode``: a pure decode step, whose phases (launch, wait, GPU time) the stats count. ``tokens``:
        the tokens each row runs in the graph."""
        n = rows.size
        t0 = time.perf_counter_ns()
        k, io = self._ring.take()  # (the launch before last has landed: its readback is done)
        copies = nbytes = ids_copies = 0
        if device_ids:
            copies = ids_copies = self._stage_idsrc(b, rows, last_token, io)
            nbytes = 16 * b * copies
        else:
            assert self._inflight is None, "a host-planned step's ids are the host's: land the step in flight first"
            a = io.ids_np[b]
            a[:n] = last_token[rows]
            a[n:] = 0
            self._idsrc_now_ids[b][:] = a
            self._idsrc_steady[b] = False
            self.ids[b].copy_(io.ids[b], non_blocking=True)
            if decode:
                copies, nbytes = 1, 8 * b
        timed = self.timing and decode
        if self._held is None:  # (a CPU's eager replay; or torch's calls, which let the interpreter go)
            stream = torch.cuda.current_stream(self._device) if self._device is not None else None
            timer = self._timers[k] if timed else None
            if timer is not None:
                timer[0].record(stream)
            graphs[k].replay()
            if timer is not None:
                timer[1].record(stream)
            self._ring.done(stream)
        else:
            s = current_raw_stream(self._device)
            if timed:
                self._held.record(self._timer_handles[k][0], s)
            graphs[k].launch(self._held, s)
            if timed:
                self._held.record(self._timer_handles[k][1], s)
            self._ring.done_on(s)
        key = rows.tobytes()
        if key != self._last_key:  # (the same rows keep their positions)
            self._tok_pos[self._last_rows] = -1  # tokens_all now holds this step's tokens
            self._tok_pos[rows] = self._arange[:n]
            self._last_rows, self._last_key = rows, key
        launch_ns = time.perf_counter_ns() - t0 if decode else 0
        f = InFlight(rows, serial, b, k, decode, logprobs, tokens)
        return f, Launched(n * tokens, (b - n) * tokens, launch_ns, copies, nbytes, ids_copies)

    def _stage_idsrc(self, b: int, rows: np.ndarray, last_token: np.ndarray, io: _HostIO) -> int:
        """A device-ids step's (host ids, src): src = each row's position in the last replayed step's tokens, -1 for
        a row not in it, whose id the host knows (it prefilled, or last ran in a step already read back). Copied to
        the device only when it differs from what idsrc[b] holds; returns the copies made (0 or 1)."""
        n = rows.size
        if n == b and self._idsrc_steady[b] and rows.tobytes() == self._last_key:
            return 0  # steady: every row takes the token the last step sampled for it, as the device already has
        src = self._tok_pos[rows]
        now = self._idsrc_now[b]
        new = io.idsrc_np[b]
        new[1, :n] = src
        new[1, n:] = -1
        new[0, :n] = np.where(src < 0, last_token[rows], 0)
        new[0, n:] = 0
        if np.array_equal(now, new):
            return 0
        now[:] = new
        self._idsrc_steady[b] = n == b and bool(np.array_equal(src, self._arange[:b]))
        self.idsrc[b].copy_(io.idsrc[b], non_blocking=True)
        return 1

    def land(self, f: InFlight, serial: np.ndarray) -> tuple[np.ndarray, np.ndarray, TokenLogprobs | None, Landed]:
        """Wait for a launched step's tokens: its rows ([m], the launch's row order) and their tokens ([t, m] int64,
        row j the launch's j-th token) with their logprobs (a LOGPROBS graph's; else None), without the rows whose
        admission serial (``serial``, [H] by handle) changed since the launch (their request finished meanwhile), and
        what landing did."""
        t0 = time.perf_counter_ns()
        self._ring.wait(f.parity)
        io, n = self._ring.entries[f.parity], f.rows.size
        tokens = io.tokens_np[: f.tokens, :n].copy()
        lp = io.logprobs_np[:n].copy() if f.logprobs else None
        wait_ns = time.perf_counter_ns() - t0
        rows, now = f.rows, serial[f.rows]
        dropped = 0
        if now.tobytes() != f.serial.tobytes():  # (a request ended meanwhile)
            keep = now == f.serial
            dropped = int(np.count_nonzero(~keep))
            rows, tokens, lp = rows[keep], tokens[:, keep], (lp[keep] if lp is not None else None)
        if not f.decode:
            return rows, tokens, lp, Landed(dropped)
        timer = self._timers[f.parity] if self.timing else None
        gpu_ms = timer[0].elapsed_time(timer[1]) if timer is not None else 0.0
        return rows, tokens, lp, Landed(dropped, wait_ns, gpu_ms)
