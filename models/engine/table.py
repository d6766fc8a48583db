"""The request table: every request the engine knows, by handle while it is admitted and by id until its result is
handed over. Per-handle state is numpy arrays a step reads with vectorised ops (tokens so far and their times, limits,
stop tokens, the serial of each admission); a finished request's result waits in ``results`` until ``pop_result`` (or
goes straight to ``on_finish``), and its id is forgotten then, so nothing per finished request stays behind."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import attrs
import numpy as np
import torch

from models.engine.requests import FinishReason, InvalidRequest, Request, Result
from models.engine.scheduler import Pending


@attrs.define(eq=False)
class Live:
    """An admitted request."""

    pend: Pending
    saved: dict[str, tuple[int, list[torch.Tensor]]] | None = None  # offloaded: pool -> (pages, per-layer copies)


@attrs.frozen(eq=False)
class Emitted:
    """What one step's tokens did: their count, the gaps since each row's last token (with timing), and which rows
    are done, by stop token or by running out of tokens or context."""

    n: int
    itl: np.ndarray | None  # [k] seconds, the rows that had a token before
    done: np.ndarray  # [n] bool
    stopped: np.ndarray  # [n] bool: done by a stop token


class RequestTable:
    def __init__(self, capacity: int, max_seq_len: int) -> None:
        H = capacity
        self.max_seq_len = max_seq_len
        self.gen = np.zeros(H, np.int64)  # tokens generated
        self.t_first = np.zeros(H)  # wall clock of each handle's first token
        self.t_last = np.zeros(H)  # and of its latest
        self.max_tokens = np.zeros(H, np.int64)
        self.sampling = np.zeros(H, bool)  # temperature > 0: the step replays the sampling graph
        self.prompt_len = np.zeros(H, np.int64)
        self.last_token = np.zeros(H, np.int64)
        self.out = np.zeros((H, max_seq_len), np.int32)  # generated tokens by handle
        self.stop = np.full((H, 1), -1, np.int64)  # stop tokens by handle, -1 padded
        self.serial = np.zeros(H, np.int64)  # bumped by every admit and finish of a handle
        self.issued = np.zeros(H, np.int64)  # tokens launched (generated or in flight)
        self.live: dict[int, Live] = {}
        self.results: dict[str, Result] = {}
        self.rids: set[str] = set()  # ids submitted whose results have not been handed over
        self.t_submit: dict[str, float] = {}
        self.on_finish: Callable[[Result], None] | None = None
        self._auto_ids = itertools.count()
        self.emitted = 0  # tokens emitted in all
        self.digest = 0  # sum of each emitted token id times its index in its request + 1, mod 2^61 (ranks compare)

    # -- submission ----------------------------------------------------------------------------------------------
    def register(self, request: Request, arrived: float | None) -> str:
        """The request's id (its own, or the next free ``req-N``), now in use; InvalidRequest if it already is."""
        rid = request.request_id
        if rid is None:
            rid = f"req-{next(self._auto_ids)}"
            while rid in self.rids:
                rid = f"req-{next(self._auto_ids)}"
        elif rid in self.rids:
            raise InvalidRequest("request_id", f"{rid!r} is in use (submitted, and its result not handed over)")
        self.rids.add(rid)
        self.t_submit[rid] = time.perf_counter() if arrived is None else arrived
        return rid

    # -- admitted requests ---------------------------------------------------------------------------------------
    def admit(self, h: int, pend: Pending, eos: tuple[int, ...]) -> None:
        """Handle h now serves ``pend``: its limits, sampling mode and stop tokens (its own, and ``eos`` unless it
        ignores them)."""
        sp = pend.request.sampling
        self.serial[h] += 1
        self.issued[h] = 0
        self.live[h] = Live(pend)
        self.sampling[h] = sp.temperature > 0
        self.gen[h] = 0
        self.max_tokens[h] = sp.max_tokens
        self.prompt_len[h] = len(pend.request.prompt)
        self.last_token[h] = pend.request.prompt[-1]
        stops = sp.stop_token_ids if sp.ignore_eos else tuple(dict.fromkeys(sp.stop_token_ids + eos))
        if len(stops) > self.stop.shape[1]:
            self.stop = np.pad(self.stop, ((0, 0), (0, len(stops) - self.stop.shape[1])), constant_values=-1)
        self.stop[h] = -1
        self.stop[h, : len(stops)] = stops

    def unadmit(self, h: int) -> Pending:
        """Undo ``admit`` (a refused admit is rolled back): the pending request it served."""
        return self.live.pop(h).pend

    def emit(self, rows: np.ndarray, tokens: np.ndarray, timing: bool) -> Emitted:
        """Record each row's token ([n] handles, [n] tokens) and say which rows are done."""
        g = self.gen[rows]
        now = time.perf_counter()
        first = g == 0
        if first.any():
            self.t_first[rows[first]] = now
        itl = now - self.t_last[rows[~first]] if timing and not first.all() else None
        self.t_last[rows] = now
        self.out[rows, g] = tokens
        g += 1
        self.emitted += rows.size
        self.digest = (self.digest + int((tokens.astype(np.int64) * g).sum())) % (1 << 61)
        self.gen[rows] = g
        self.last_token[rows] = tokens
        stopped = (self.stop[rows] == tokens[:, None]).any(1)
        return Emitted(rows.size, itl, stopped | self.out_of_room(rows, g), stopped)

    def out_of_room(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """[n] bool: with ``tokens`` generated, the row has no token left (max_tokens) or no context left."""
        return (tokens >= self.max_tokens[rows]) | (self.prompt_len[rows] + tokens >= self.max_seq_len)

    def finish(self, h: int, reason: FinishReason) -> tuple[Result, Live]:
        """Handle h's request ends: its result, and what it held (the other parts give it back). A step in flight
        that ran it drops its token (the serial changed)."""
        live = self.live.pop(h)
        rid = live.pend.rid
        n = int(self.gen[h])
        ttft = self.t_first[h] - self.t_submit.pop(rid, float("nan"))
        itl = (self.t_last[h] - self.t_first[h]) / (n - 1) if n > 1 else float("nan")
        self.serial[h] += 1
        return Result(rid, int(self.prompt_len[h]), tuple(self.out[h, :n].tolist()), reason, ttft, itl), live

    def handle_of(self, request_id: str) -> int | None:
        return next((h for h, live in self.live.items() if live.pend.rid == request_id), None)

    # -- results -------------------------------------------------------------------------------------------------
    def hand_over(self, result: Result) -> None:
        """A finished request's result goes to ``on_finish`` (and its id is forgotten), or waits in ``results``."""
        if self.on_finish is not None:
            self.rids.discard(result.request_id)
            self.on_finish(result)
        else:
            self.results[result.request_id] = result

    def pop_result(self, request_id: str) -> Result:
        """Hand a finished request's result over and forget its id (it may be submitted again). KeyError when it
        has no result waiting: unknown, not finished yet, or already handed over."""
        try:
            result = self.results.pop(request_id)
        except KeyError:
            state = "has not finished" if request_id in self.rids else "is not known to this engine"
            raise KeyError(f"request {request_id!r} {state}: no result to hand over") from None
        self.rids.discard(request_id)
        return result

    def output(self, request_id: str) -> tuple[int, ...]:
        """The tokens a request has so far (for streaming): none while it waits, its result's once it finished."""
        if request_id in self.results:
            return self.results[request_id].tokens
        h = self.handle_of(request_id)
        if h is not None:
            return tuple(self.out[h, : self.gen[h]].tolist())
        if request_id in self.rids:
            return ()
        raise KeyError(f"request {request_id!r} is not known to this engine (never submitted, or handed over)")
