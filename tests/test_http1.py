"""The load generator's lean HTTP/1.1 client (models/bench/http1.py) against a scripted asyncio server on 127.0.0.1:
a chunked response read a chunk a piece, a Content-Length one, a kept-alive connection reused and one the server
closes not, the connection cap, a stalled read timed out, a response cut short and a bad status line refused."""

from __future__ import annotations

import asyncio

import pytest

from models.bench.http1 import HTTPError, Pool


def chunked(*parts: bytes, close: bool = False) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    head += b"Connection: close\r\n" if close else b""
    return head + b"\r\n" + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def serve(answers: list[bytes]):
    """A server answering each request (read up to its body's end) with the next of ``answers``, closing the
    connection after the last; b"" closes it instead, b"stall" never answers. Returns (server, its URL, the
    connections it accepted)."""
    accepted = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                length = next(int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                              if k.lower() == b"content-length")  # fmt: skip
                await reader.readexactly(length)
                answer = answers.pop(0)
                if answer == b"stall":
                    await asyncio.sleep(2)  # (past the client's 0.3 s timeout)
                if not answer:
                    break
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer or not answers:  # (after the last answer: closed)
                    break
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/prefix", accepted


async def stop(srv, accepted) -> None:
    """Close the server and every connection it accepted (a stalled handler's too)."""
    for w in accepted:
        w.close()
    srv.close()
    await srv.wait_closed()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_chunks_arrive_a_piece_each_and_the_connection_is_reused():
    async def go():
        srv, url, accepted = await serve([chunked(b"data: a\n\n", b"data: b\n\n"),
                                          b"HTTP/1.1 400 Bad\r\nContent-Length: 5\r\n\r\nnope!", chunked(b"x")])
        pool = Pool(url, None, 5.0)
        async with pool.post("/v1/completions", b"{}") as r:
            assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
            assert [p async for p in r.pieces()] == [b"data: a\n\n", b"data: b\n\n"]
        async with pool.post("/v1/completions", b"{}") as r:
            assert (r.status, await r.read()) == (400, b"nope!")
        async with pool.post("/v1/completions", b"{}") as r:
            assert await r.read() == b"x"
        pool.close()
        await stop(srv, accepted)
        return len(accepted)

    assert run(go()) == 1  # one connection served all three


def test_a_connection_the_server_closes_or_a_response_left_unread_is_not_reused():
    async def go():
        srv, url, accepted = await serve([chunked(b"a", close=True), chunked(b"b", b"c"), chunked(b"d")])
        pool = Pool(url, None, 5.0)
        async with pool.post("/x", b"1") as r:
            assert await r.read() == b"a"
        async with pool.post("/x", b"2") as r:
            async for _ in r.pieces():
                break  # the caller stopped reading: the rest of the response is still on the connection
        async with pool.post("/x", b"3") as r:
            assert await r.read() == b"d"
        pool.close()
        await stop(srv, accepted)
        return len(accepted)

    assert run(go()) == 3


def test_warm_opens_connections_and_the_cap_holds_requests_back():
    async def go():
        srv, url, accepted = await serve([chunked(b"a")] * 4)
        pool = Pool(url, 2, 5.0)
        await pool.warm(2)
        assert len(accepted) == 2

        async def one():
            async with pool.post("/x", b"{}") as r:
                return await r.read()

        assert await asyncio.gather(*(one() for _ in range(4))) == [b"a"] * 4
        pool.close()
        await stop(srv, accepted)
        return len(accepted)

    assert run(go()) == 2  # four requests, never more than two connections


@pytest.mark.parametrize("answer,error", [(b"stall", TimeoutError), (b"", HTTPError),
                                          (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", HTTPError),
                                          (b"SPDY/9 OK\r\n\r\n", HTTPError)],
                         ids=["stalled", "closed-before-answer", "cut-short", "bad-status-line"])  # fmt: skip
def test_a_stalled_cut_or_foreign_answer_raises(answer, error):
    async def go():
        srv, url, accepted = await serve([answer])
        pool = Pool(url, None, 0.3)
        try:
            with pytest.raises(error):
                async with pool.post("/x", b"{}") as r:
                    await r.read()
        finally:
            pool.close()
            await stop(srv, accepted)

    run(go())
