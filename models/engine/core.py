"""The engine core's interface: what a client drives, whether it is the server's engine process, ``generate``, the
benchmarks or a tensor-parallel rank. ``submit`` validates and queues a request, ``abort`` ends one wherever it is,
``step`` runs one step and returns what it gave as values (``StepOutput``), ``has_work`` says whether a step would
run anything or hand anything over. ``run_requests`` drives any core over a list of requests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from models.engine.requests import InvalidRequest, Request, Result, StepOutput


class EngineCore(Protocol):
    def submit(self, request: Request, arrived: float | None = None) -> str: ...

    def abort(self, request_id: str) -> bool: ...

    def step(self) -> StepOutput: ...

    def has_work(self) -> bool: ...


def run_requests(core: EngineCore, requests: Iterable[Request],
                 on_step: Callable[[StepOutput], None] | None = None) -> list[Result | InvalidRequest]:  # fmt: skip
    """Submit every request and step until all have finished: a Result per request, in order, or the InvalidRequest
    that refused it (the others run on). ``on_step`` is called with every step's output."""
    ids: list[str | InvalidRequest] = []
    for r in requests:
        try:
            ids.append(core.submit(r))
        except InvalidRequest as e:
            ids.append(e)
    done: dict[str, Result] = {}
    while core.has_work():
        out = core.step()
        done.update((r.request_id, r) for r in out.finished)
        if on_step is not None:
            on_step(out)
    return [done.pop(i) if isinstance(i, str) else i for i in ids]
