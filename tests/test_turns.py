"""IntakeTurns: a burst's intakes start one a turn of the event loop, in arrival order, with the loop's other ready
work (a token's write) run between two of them."""

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
