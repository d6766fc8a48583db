"""A burst's intake. The front end (IntakeTurns): its intakes start one a turn of the event loop, in arrival order,
with the loop's other ready work (a token's write) run between two of them. The engine core (``burst_wait_s``): idle,
it gathers a burst's requests while they keep coming, until a pass is full or its wait is spent."""

import asyncio

from models.server.turns import IntakeTurns, TakingTurns


def _burst(n: int, cancel: frozenset[int] = frozenset()) -> list[tuple[str, int]]:
    """n handlers started together; each logs its intake and schedules "other" work (as a delivered token wakes a
    stream); the handlers in ``cancel`` are cancelled while they wait."""

    async def main():
        turns, log = IntakeTurns(), []

        async def handler(i: int) -> None:
            await turns.take()
            log.append(("intake", i))
            asyncio.get_running_loop().call_soon(log.append, ("other", i))

        tasks = [asyncio.ensure_future(handler(i)) for i in range(n)]
        await asyncio.sleep(0)  # every handler has asked once
        for i in cancel:
            tasks[i].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)
        assert not turns.waiting and not turns.taken  # idle again: the next request starts at once
        ran = []
        asyncio.get_running_loop().call_soon(ran.append, True)
        await turns.take()
        assert not ran  # (returned without a turn of the loop)
        return log

    return asyncio.run(main())


def test_intakes_start_in_arrival_order_one_a_turn_with_other_work_between():
    log = _burst(12)
    intakes = [i for kind, i in log if kind == "intake"]
    assert intakes == list(range(12))
    for i in range(11):  # the work intake i made ready ran before intake i+1
        assert log.index(("other", i)) < log.index(("intake", i + 1))


def test_a_handler_cancelled_while_waiting_leaves_the_line_moving():
    log = _burst(6, cancel=frozenset({2, 3}))
    assert [i for kind, i in log if kind == "intake"] == [0, 1, 4, 5]


def _first_request_then_parse(idle: bool) -> list:
    """One handler starts; in the same turn of the loop, after its first step, an I/O callback "parses" three more
    requests (starting their handlers), as uvicorn does with the rest of a burst. Returns the log."""

    async def main():
        log = []
        turns = IntakeTurns(idle=lambda: idle and not log)  # (idle: no intake yet)

        async def handler(i: int) -> None:
            await turns.take()
            log.append(("intake", i))

        def parse() -> None:
            log.append("parse")
            tasks.extend(asyncio.ensure_future(handler(i)) for i in (1, 2, 3))

        tasks = [asyncio.ensure_future(handler(0))]
        asyncio.get_running_loop().call_soon(parse)  # (an I/O callback of the turn handler 0's first step runs in)
        while len(tasks) < 4 or not all(t.done() for t in tasks):
            await asyncio.sleep(0)
        return log

    return asyncio.run(main())


def test_an_idle_front_end_sends_its_first_request_after_the_loop_parsed_the_rest_of_a_burst():
    """Idle, the first intake waits one turn: the parse falls before it, and the burst's requests reach the engine a
    turn apart, where a busy front end's first intake goes at once, the parse between it and the second."""
    burst = [("intake", i) for i in range(4)]
    assert _first_request_then_parse(idle=True) == ["parse", *burst]
    assert _first_request_then_parse(idle=False) == [burst[0], "parse", *burst[1:]]


def test_taking_turns_gates_posts_only():
    async def main():
        seen = []

        async def app(scope, receive, send):
            seen.append(scope["method"])

        wrapped = TakingTurns(app)
        wrapped.turns.taken = True  # (a POST already started in this turn: the next one must wait for the loop)
        post = asyncio.ensure_future(wrapped({"type": "http", "method": "POST"}, None, None))
        await wrapped({"type": "http", "method": "GET"}, None, None)  # not gated: runs at once
        for _ in range(3):
            await asyncio.sleep(0)
        assert seen == ["GET"]  # the POST waits for its turn
        wrapped.turns._next_turn()  # the loop's next turn lets the POST in
        await post
        assert seen == ["GET", "POST"]

    asyncio.run(main())


class _FirstStep:
    """An engine that records the requests submitted before its first step, and then has no work."""

    def __init__(self) -> None:
        self.submitted, self.first_step = [], None

    def submit(self, request, arrived=None):
        self.submitted.append(request.request_id)
        return request.request_id

    def abort(self, rid):
        return False

    def has_work(self) -> bool:
        return self.first_step is None and bool(self.submitted)

    def step(self):
        import numpy as np

        self.first_step = list(self.submitted)
        return type("Out", (), {"tokens": np.zeros(0), "finished": []})()


def _first_step(arrivals: list[tuple[float, str, int]], wait_s: float, pass_tokens: int | None) -> list[str]:
    """``engine_core.serve`` over an idle engine in a thread, each of ``arrivals`` (seconds after the one before,
    request id, prompt tokens) sent as its own message; the requests its first step saw."""
    import threading
    import time

    import zmq

    import models.engine.requests  # noqa: F401  (serve imports it first thing: here, so its loop is up at once)
    from models.server import engine_core
    from models.server.engine_core import Kind, pack

    ctx = zmq.Context()
    front, inbox, outbox = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL), ctx.socket(zmq.PUB)
    inbox.bind("inproc://burst-in")
    front.connect("inproc://burst-in")
    outbox.bind("inproc://burst-out")
    engine = _FirstStep()
    loop = threading.Thread(target=engine_core.serve, args=(engine, inbox, outbox, None, wait_s, pass_tokens))
    loop.start()
    time.sleep(0.05)
    try:
        for after_s, rid, n in arrivals:
            time.sleep(after_s)
            front.send(pack(Kind.ADD, rid, list(range(3, 3 + n)), {"max_tokens": 2}, None, 0.0))
        deadline = time.monotonic() + 10
        while engine.first_step is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return engine.first_step
    finally:
        front.send(pack(Kind.SHUTDOWN))
        loop.join(10)
        for s in (front, inbox, outbox):
            s.close(linger=0)
        ctx.term()


def test_an_idle_engine_gathers_what_comes_within_its_wait():
    """A wait of 400 ms: the first step takes the requests 0, 50 and 250 ms after the first (no quiet inbox ends the
    gathering), not the one 850 ms after it; with no wait, the first alone."""
    burst = [(0, "a", 4), (0.05, "b", 4), (0.2, "c", 4), (0.6, "late", 4)]
    assert _first_step(burst, 0.4, None) == ["a", "b", "c"]
    assert _first_step(burst, 0.0, None) == ["a"]


def test_the_gathering_ends_once_a_pass_is_full_or_the_wait_is_spent():
    burst = [(0, "a", 5), (0.05, "b", 5), (0.05, "c", 5)]
    assert _first_step(burst, 3.0, 8) == ["a", "b"]  # (10 prompt tokens: a pass of 8 is full)
    assert _first_step(burst, 0.08, None) == ["a", "b"]  # (c came 100 ms after a, past the 80 ms)
