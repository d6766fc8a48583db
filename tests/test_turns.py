"""A burst's intake. The front end (IntakeTurns): its intakes start one a turn of the event loop, in arrival order,
with the loop's other ready work (a token's write) run between two of them. The engine core: idle and told that more
requests are on their way (MORE), it gathers them before its first step, unless a pass is full."""

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


def _first_step(batches: list[tuple[float, list]], pass_tokens: int | None, monkeypatch) -> list[str]:
    """``engine_core.serve`` over an idle engine in a thread; ``batches``: (seconds after the previous, messages as
    tuples), each sent as one multipart message; the requests its first step saw."""
    import threading
    import time

    import zmq

    import models.engine.requests  # noqa: F401  (serve imports it first thing: here, so its loop is up at once)
    from models.server import engine_core
    from models.server.engine_core import Kind, pack

    monkeypatch.setattr(engine_core, "GATHER_POLL_MS", 300)  # (wide: a slow CI machine's thread is not a quiet inbox)
    monkeypatch.setattr(engine_core, "GATHER_S", 3.0)
    ctx = zmq.Context()
    front, inbox = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    outbox = ctx.socket(zmq.PUB)
    inbox.bind("inproc://gather-in")
    front.connect("inproc://gather-in")
    outbox.bind("inproc://gather-out")
    engine = _FirstStep()
    loop = threading.Thread(target=engine_core.serve, args=(engine, inbox, outbox, None, pass_tokens))
    loop.start()
    time.sleep(0.05)
    try:
        for wait_s, msgs in batches:
            time.sleep(wait_s)
            front.send_multipart([pack(*m) for m in msgs])
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


def _add(rid: str, n: int = 4):
    from models.server.engine_core import Kind

    return (Kind.ADD, rid, list(range(3, 3 + n)), {"max_tokens": 2}, None, 0.0)


def test_an_idle_engine_told_more_are_coming_gathers_them_before_its_first_step(monkeypatch):
    from models.server.engine_core import Kind

    batches = [(0, [_add("a"), (Kind.MORE, 2)]), (0.05, [_add("b"), (Kind.MORE, 1)]), (0.05, [_add("c")]),
               (0.2, [_add("late")])]  # fmt: skip
    assert _first_step(batches, None, monkeypatch) == ["a", "b", "c"]


def test_a_lone_request_or_a_full_pass_steps_at_once(monkeypatch):
    from models.server.engine_core import Kind

    assert _first_step([(0, [_add("a")]), (0.2, [_add("b")])], None, monkeypatch) == ["a"]
    full = [(0, [_add("a", 5), (Kind.MORE, 5)]), (0.05, [_add("b", 5), (Kind.MORE, 4)]), (0.2, [_add("c")])]
    assert _first_step(full, 8, monkeypatch) == ["a", "b"]  # (10 prompt tokens: a pass of 8 is full)


def test_a_batch_to_the_engine_ends_with_how_many_intakes_wait():
    import zmq

    from models.server.client import EngineClient
    from models.server.engine_core import EngineSpec, Kind, pack, unpack

    client = EngineClient(EngineSpec(None), in_process=True)  # (sockets only: no engine launched)
    engine = client.ctx.socket(zmq.PULL)
    engine.connect(client.to_engine_addr)
    try:
        for queued in (7, 0):
            client.queued_intakes = lambda q=queued: q
            client._send(pack(Kind.ABORT, "x"))  # (no loop running: sent at once, alone)
            client._outbox = [pack(Kind.ABORT, "y")]
            client._flush()
            assert engine.poll(1000) and [unpack(f) for f in engine.recv_multipart()] == [[Kind.ABORT, "x"]]
            assert engine.poll(1000)
            got = [unpack(f) for f in engine.recv_multipart()]
            assert got == [[Kind.ABORT, "y"], *([[Kind.MORE, 7]] if queued else [])]
    finally:
        engine.close(linger=0)
        client.shutdown()
