"""Requests taken in one a turn of the event loop, so that a burst's intake does not hold back the tokens of the
requests already running.

A burst's requests reach the front end together: uvicorn parses each one's headers in the loop's I/O callbacks and
starts a task for each, and all those tasks run in the loop's next turn, one after another, each through the ASGI
stack and its handler (~0.25 ms a request on the development CPU). The engine's first tokens arrive meanwhile, but
the loop reads its socket, and the streams write, only in a later turn: measured on the development CPU over the
stand-in engine (128 requests at once, one client), the first request was with the engine 1-4 ms after its send and
its first token written 15-43 ms after, once the last handler had run; on an H100 the first nine requests' first
tokens reached the client 28-49 ms after the send, against 13-28 ms in-process (``models/bench/results/server-h200``,
call AA); with the turns, the first request's 10-14 ms against 13-15 in-process (call AB).

``TakingTurns`` wraps the ASGI app: a POST (a request the engine will serve, or a tokenizer's) starts at once when
no other did in this turn of the loop, else it queues; each turn of the loop lets the next one in line start. Between
two intakes the loop runs one turn of everything else that is ready: the engine's tokens delivered, the streams
written. The cost is one future and one extra turn of the loop (a ``select`` with no wait) a queued request: a few
microseconds against its intake.

An idle front end (``idle()``: no request of its own in flight) waits one turn before its first intake: uvicorn parses
the rest of a burst in that turn's I/O callbacks, so those requests queue behind the first and follow it to the engine
a turn apart, where without the turn the parse falls between the first and the second: on an H100's host the engine
saw 1.1 ms between a burst's first two requests without the turn and 0.2-0.7 ms with it (``models/bench/results/
server-h200``, call AD; 1.2-2.2 ms on another, call AE; 0.2-2.1 ms on an H200's, call AG), inside the wait of an idle
engine gathering a burst (``EngineSpec.burst_wait_ms``). A lone request pays one turn of an idle loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

GATED_METHODS = ("POST",)  # the requests that do work: generation, tokenization, transcription


class IntakeTurns:
    """At most one intake starts in a turn of the event loop; the others wait in arrival order (module doc)."""

    def __init__(self, idle: Callable[[], bool] | None = None) -> None:
        self.waiting: deque[asyncio.Future] = deque()
        self.taken = False  # an intake started in this turn of the loop
        self.idle = idle  # the front end has no request in flight: its first intake waits a turn (module doc)

    async def take(self) -> None:
        """Return once this caller may start its intake: at once if none started in this turn and none waits (after
        one turn of the loop where the front end is ``idle``)."""
        loop = asyncio.get_running_loop()
        if not self.taken and not self.waiting and self.idle is not None and self.idle():
            await asyncio.sleep(0)  # (the loop's I/O callbacks parse what else arrived; callers before it go first)
        if not self.taken and not self.waiting:
            self.taken = True
            loop.call_soon(self._next_turn)
            return
        turn = loop.create_future()
        self.waiting.append(turn)
        await turn  # (set by _next_turn, this caller's intake counted as its turn's one)

    def _next_turn(self) -> None:
        """Runs once in each turn of the loop after one that started an intake: lets the next in line start."""
        while self.waiting:
            turn = self.waiting.popleft()
            if not turn.done():  # (a caller cancelled while it waited left its future done)
                turn.set_result(None)
                asyncio.get_running_loop().call_soon(self._next_turn)
                return
        self.taken = False


class TakingTurns:
    """The ASGI app ``app``, each POST's intake started one a turn of the loop (``IntakeTurns``, module doc)."""

    def __init__(self, app, idle: Callable[[], bool] | None = None) -> None:
        self.app = app
        self.turns = IntakeTurns(idle)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] in GATED_METHODS:
            await self.turns.take()
        await self.app(scope, receive, send)
