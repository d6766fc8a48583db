"""The front end's side of the engine core: it starts the engine process (or, for debugging, a thread), sends it
requests and aborts, and hands each request's tokens to the coroutine serving it (``RequestStream``).

One reader task takes the engine's STEP messages off the socket and appends each token to its request's stream, then
wakes the streams it touched once; a stream whose client went away is aborted in the engine and forgotten.

A server may run several front ends (processes) over one engine: the first starts the engine and tells it every
front end's ``Link``; each front end binds its own two sockets, sends its requests on one, and gets every engine
message on the other (the engine publishes each once; a front end skips the tokens of requests it does not hold)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable

import attrs
import numpy as np
import zmq

from models.server.engine_core import (
    EngineSpec,
    Kind,
    ServedModel,
    main,
    pack,
    pack_features,
    parent_gone,
    unpack,
)


def _logprobs(streams: dict[str, RequestStream], rids: list[str], lp: tuple[bytes, bytes, bytes]) -> None:
    """A STEP message's logprobs to the streams of the tokens that have them (a logprob that is not NaN)."""
    logprob = np.frombuffer(lp[0], np.float32)
    top_ids = np.frombuffer(lp[1], np.int32).reshape(len(rids), -1)
    top_lps = np.frombuffer(lp[2], np.float32).reshape(len(rids), -1)
    for i in np.flatnonzero(~np.isnan(logprob)).tolist():
        s = streams.get(rids[i])
        if s is not None:
            s.logprobs.append((float(logprob[i]), top_ids[i], top_lps[i]))


def _prompt_logprobs(streams: dict[str, RequestStream], scored: list) -> None:
    """A STEP message's prompt logprobs to their streams: (logprob [P-1], top ids [P-1, 5], top logprobs [P-1, 5])."""
    for rid, lp, ids, tops in scored:
        s = streams.get(rid)
        if s is not None:
            n = len(lp) // 4
            s.prompt_logprobs = (np.frombuffer(lp, np.float32), np.frombuffer(ids, np.int32).reshape(n, -1),
                                 np.frombuffer(tops, np.float32).reshape(n, -1))  # fmt: skip


# messages the front end holds for the engine before it sends them: a burst's handlers run one after another in one
# turn of the loop, and a batch held to the turn's end held its first request for the whole turn (intake ms, below)
MAX_SEND_BATCH = 8


@attrs.frozen
class Link:
    """One front end's sockets' addresses: where it sends to the engine, where the engine publishes to it."""

    to_engine: str
    from_engine: str


class EngineFailed(RuntimeError):
    """The engine core could not start, or stopped with an error (its traceback is the message)."""


@attrs.define(eq=False)
class RequestStream:
    """One engine request's tokens as they come: ``tokens`` grows, ``finish`` is set once (a FinishReason value, or
    "rejected" / "failed" with ``error``), ``wake`` is set whenever either changes."""

    rid: str
    tokens: list[int] = attrs.Factory(list)
    token_times: list[float] = attrs.Factory(list)
    logprobs: list[tuple[float, np.ndarray, np.ndarray]] = attrs.Factory(list)  # per token, when it asked: (logprob,
    # top ids [5], top logprobs [5])
    # its prompt's tokens 1 .. P-1, when it asked (SamplingParams.prompt_logprobs): logprob [P-1], top ids and top
    # logprobs [P-1, 5]; they come with its first token
    prompt_logprobs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    finish: str | None = None
    error: str | None = None
    error_field: str | None = None
    wake: asyncio.Event = attrs.Factory(asyncio.Event)


@attrs.define
class Load:
    """The engine's load and step counters as its last STEP message said (``waiting`` also counts what the front end
    has sent since)."""

    waiting: int = 0
    running: int = 0
    pages_used: int = 0
    pages_total: int = 0
    steps: int = 0  # the engine's steps so far
    decode_steps: int = 0  # of which decode steps
    decode_ns: int = 0  # their wall time in the engine's step(), summed
    decode_beside_pass: int = 0  # of the decode steps, those launched while a prefill pass ran beside them
    prefix_hits: int = 0  # requests that restored a prefix cache checkpoint
    prefix_cached_tokens: int = 0  # prompt tokens they did not compute
    gc_seconds: float = 0.0  # the engine process's time in garbage collections since it served
    prefill_passes: int = 0  # the engine's prefill passes so far
    prefill_tokens: int = 0  # prompt tokens they ran
    prefill_ns: int = 0  # their wall time, summed (EngineStats.prefill_ns)


class EngineClient:
    """Starts and drives the engine core (module doc). ``start`` blocks until it is ready; ``run_reader`` is the
    task that delivers its outputs; ``add`` / ``abort`` / ``shutdown`` talk to it.

    The first front end's client (no ``link``) makes the links of all ``front_ends`` and launches the engine; another
    front end's (``link``: one of ``links``, ``owner``: the first front end's pid) only binds its own and waits for
    the engine the first one launched."""

    def __init__(self, spec: EngineSpec, in_process: bool = False, engine_main: Callable = main,
                 front_ends: int = 1, link: Link | None = None, owner: int | None = None) -> None:  # fmt: skip
        assert front_ends == 1 or not in_process, "an engine in a thread serves one front end"
        self.spec = spec
        self.in_process = in_process
        self.engine_main = engine_main  # the engine side's body (engine_core.main; a stand-in's in the front-end bench)
        self.owner = owner  # another front end's client: the pid of the first front end, which runs the engine
        self.ctx = zmq.Context()
        if link is None:
            base = f"resplan-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            where = "inproc://" if in_process else f"ipc://{tempfile.gettempdir()}/"
            self.links = tuple(Link(f"{where}{base}-in{k}", f"{where}{base}-out{k}") for k in range(front_ends))
            link = self.links[0]
        self.to_engine_addr, self.from_engine_addr = link.to_engine, link.from_engine
        self.to_engine = self.ctx.socket(zmq.PUSH)
        self.to_engine.bind(self.to_engine_addr)
        self.from_engine = self.ctx.socket(zmq.SUB)
        self.from_engine.setsockopt(zmq.RCVHWM, 0)  # (no message of the engine's is ever dropped)
        self.from_engine.setsockopt(zmq.SUBSCRIBE, b"")
        self.from_engine.bind(self.from_engine_addr)
        self.streams: dict[str, RequestStream] = {}
        self._outbox: list[bytes] = []  # messages queued for the engine in this loop iteration (``_send``)
        self.load = Load()
        self.served: ServedModel | None = None
        self.failed: str | None = None
        self._proc = None
        self.launched_at = 0.0  # time.time() at launch
        # metrics: the lags (s) of the STEP messages one wake-up of the reader delivered, from the engine's send, and
        # the intakes (s) those messages carried: each request's time from its arrival here to its submission there
        self.on_delivery: Callable[[list[float], list[float]], None] | None = None
        self._lags: list[float] = []
        self._intakes: list[float] = []

    # -- start and stop ------------------------------------------------------------------------------------------
    def start(self, on_progress: Callable[[str, float], None] = lambda stage, t: None,
              timeout_s: float = 1800.0) -> ServedModel:  # fmt: skip
        """Start the engine core and wait until it is ready (``on_progress(stage, seconds since the launch)`` as it
        goes)."""
        self.launch()
        return self.wait_ready(on_progress, timeout_s)

    def launch(self) -> None:
        """Start the engine core (it loads and builds while the caller goes on)."""
        self.launched_at = time.time()
        args = (self.spec, self.links, None if self.in_process else os.getpid())
        if self.in_process:
            self._proc = threading.Thread(target=self.engine_main, args=(*args, self.ctx), name="engine-core",
                                          daemon=True)  # fmt: skip
        else:
            self._proc = multiprocessing.get_context("spawn").Process(target=self.engine_main, args=args,
                                                                      name="engine-core", daemon=True)  # fmt: skip
        self._proc.start()

    def wait_ready(self, on_progress: Callable[[str, float], None] = lambda stage, t: None,
                   timeout_s: float = 1800.0, check: Callable[[], None] = lambda: None) -> ServedModel:  # fmt: skip
        """Wait until the launched engine core is ready (``on_progress(stage, seconds since the launch)`` as it
        goes; ``check()`` between messages, and at least every 0.1 s: the caller's own start, which may raise)."""
        deadline = time.monotonic() + timeout_s
        while True:
            check()
            if not self.from_engine.poll(100):
                if self._proc is not None and not self._proc.is_alive():
                    raise EngineFailed(f"the engine process exited (code {getattr(self._proc, 'exitcode', '?')}) "
                                       "before it was ready")  # fmt: skip
                if parent_gone(self.owner):
                    raise EngineFailed("the server's first process, which runs the engine, exited")
                if time.monotonic() > deadline:
                    raise EngineFailed(f"the engine was not ready after {timeout_s:.0f} s")
                continue
            msg = unpack(self.from_engine.recv())
            if msg[0] == Kind.PROGRESS:
                on_progress(msg[1], msg[2] - self.launched_at)
            elif msg[0] == Kind.FAILED:
                raise EngineFailed(msg[1])
            elif msg[0] == Kind.READY:
                d = msg[1]
                d["eos_token_ids"], d["notes"] = tuple(d["eos_token_ids"]), tuple(d["notes"])
                self.served = ServedModel(**d)
                on_progress("engine ready", msg[2] - self.launched_at)
                return self.served

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Tell the engine core to stop, and wait for it (then end it); another front end's client only closes."""
        if self._proc is not None and self._proc.is_alive():
            self.to_engine.send(pack(Kind.SHUTDOWN))  # (an engine still building reads it only once it serves)
            self._proc.join(timeout_s if self.served is not None or self.in_process else 0.1)
            if self._proc.is_alive() and not self.in_process:
                self._proc.terminate()
                self._proc.join(5)
        self.to_engine.close(linger=0)
        self.from_engine.close(linger=0)
        self.ctx.term()

    def check_engine(self) -> None:
        """An engine process that ended without a FAILED message (killed: the OOM killer, a signal) fails as one that
        sent it does: its streams end with the error. What it sent before it ended is delivered first."""
        if self.failed is not None or self.in_process or self._proc is None or self._proc.is_alive():
            return
        while self.failed is None:
            try:
                msg = unpack(self.from_engine.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            self._deliver(msg)
        if self.failed is None:
            self._deliver([Kind.FAILED, f"the engine process exited (code {self._proc.exitcode}) without a word"])

    # -- requests ------------------------------------------------------------------------------------------------
    def add(self, rid: str, prompt: list[int], sampling: dict, features=None,
            arrived: float | None = None) -> RequestStream:  # fmt: skip
        """Send a request to the engine (``features``: Whisper's log-mel features, a tensor; ``arrived``: its arrival
        at the server, perf_counter seconds, default now); its stream."""
        if self.failed is not None:
            raise EngineFailed(self.failed)
        stream = self.streams[rid] = RequestStream(rid)
        self.load.waiting += 1  # (the engine's next STEP message says the truth again)
        arrived = time.perf_counter() if arrived is None else arrived
        self._send(pack(Kind.ADD, rid, prompt, sampling, pack_features(features), arrived))
        return stream

    def abort(self, rid: str) -> None:
        """End a request in the engine (a client went away, or a stop string ended it); its stream is forgotten."""
        if self.streams.pop(rid, None) is not None:
            self._send(pack(Kind.ABORT, rid))

    def _send(self, msg: bytes) -> None:
        """A message to the engine. Within the server's loop it is queued, and the queue goes out as one multipart
        message once the loop's ready callbacks have run or it holds MAX_SEND_BATCH messages: a burst of requests
        wakes the engine's socket once every few requests, not once a request (a wake-up is a syscall that costs the
        sender tens of microseconds and more on a busy host), and its first requests do not wait for the rest of the
        burst's handlers (128 at once over the stand-in engine: their mean intake 10.5 -> 2.2 ms on the development
        CPU, models/bench/results/front-end-cpu/send-batch.md)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # (no loop: before serving, or the in-process thread's shutdown)
            self.to_engine.send(msg)
            return
        if not self._outbox:
            loop.call_soon(self._flush)
        self._outbox.append(msg)
        if len(self._outbox) >= MAX_SEND_BATCH:
            self._flush()

    def _flush(self) -> None:
        frames, self._outbox = self._outbox, []
        if frames:
            self.to_engine.send_multipart(frames)

    def forget(self, rid: str) -> None:
        """A finished request's stream is no longer wanted."""
        self.streams.pop(rid, None)

    async def run_reader(self) -> None:
        """Deliver the engine's outputs to the streams until the engine fails (a task of the server's loop): the
        socket's descriptor is watched by the loop, and each time it signals, every message waiting is taken."""
        loop = asyncio.get_running_loop()
        failed = loop.create_future()
        sock, fd = self.from_engine, self.from_engine.getsockopt(zmq.FD)

        def readable() -> None:
            while not failed.done():
                try:
                    msg = unpack(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                except Exception as e:  # noqa: BLE001 (the task ends with it)
                    failed.set_exception(e)
                    break
                if not self._deliver(msg):
                    failed.set_result(None)
            if self._lags:
                if self.on_delivery is not None:
                    self.on_delivery(self._lags, self._intakes)
                self._lags, self._intakes = [], []

        loop.add_reader(fd, readable)
        try:
            readable()  # what came before the descriptor was watched (it signals only new arrivals)
            await failed
        finally:
            loop.remove_reader(fd)

    def _deliver(self, msg: list) -> bool:
        """One engine message to the streams; False once the engine has failed."""
        streams = self.streams
        kind = msg[0]
        if kind == Kind.STEP:
            _, rids, tokens, finished, load, lp, prompt_lp, sent, intakes = msg
            now = time.perf_counter()
            self._lags.append(now - sent)  # (one monotonic clock on the host: CLOCK_MONOTONIC in both processes)
            self._intakes += intakes
            touched = {}  # (a dict: the streams wake in the engine's row order, the same from step to step)
            for rid, tok in zip(rids, tokens, strict=True):
                s = streams.get(rid)
                if s is not None:
                    s.tokens.append(tok)
                    s.token_times.append(now)
                    touched[s] = None
            if lp is not None:
                _logprobs(streams, rids, lp)
            if prompt_lp:
                _prompt_logprobs(streams, prompt_lp)
            for rid, reason in finished:
                s = streams.get(rid)
                if s is not None:
                    s.finish = reason
                    touched[s] = None
            for s in touched:
                s.wake.set()
            self.load = Load(*load)
        elif kind == Kind.REJECTED:
            s = streams.pop(msg[1], None)
            if s is not None:
                s.finish, s.error_field, s.error = "rejected", msg[2], msg[3]
                s.wake.set()
        elif kind == Kind.FAILED:
            self.failed = msg[1]
            for s in list(streams.values()):
                s.finish, s.error = "failed", "the engine failed"
                s.wake.set()
            streams.clear()
            return False
        return True
