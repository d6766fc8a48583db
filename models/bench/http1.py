"""A lean HTTP/1.1 client for the load generator's timed streams (``models.bench.remote``).

httpx spends tens to hundreds of microseconds of CPU on a request's set-up and on each chunk it hands over: in a burst
the client's own queue then shows in every TTFT it measures (32 requests at once from one process over a stand-in
engine on the development CPU: ~57 ms from send to the response's headers with httpx, ~11 ms with this client, the
server the same). This one writes a POST on a kept-alive connection and reads the response with asyncio's streams:
the status line and headers, then the body as the server framed it (chunked, or by Content-Length), one piece a
chunk, so the caller stamps each piece as it arrives. Plain HTTP and HTTPS, no redirects, no proxies, no
compression: what a benchmark against a known server needs.

Connections are pooled: an idle one is reused (if idle for less than ``keepalive_s``), a new one opened when none
is idle (counted in the request's time, as a client's would be), at most ``max_connections`` at once (a request past
them waits for one). A connection goes back to the pool only after its response was read to the end and the server
did not ask to close it. Every read waits at most ``timeout_s`` (``TimeoutError``); a response the client cannot
parse raises ``HTTPError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator

import attrs


async def _within(aw, timeout_s: float):
    """``await aw``, at most ``timeout_s`` (``TimeoutError``): ``asyncio.timeout``, which starts no task, where
    Python 3.11's ``wait_for`` starts one a call (tens of microseconds a chunk)."""
    async with asyncio.timeout(timeout_s):
        return await aw


class HTTPError(Exception):
    """The server's answer is not HTTP/1.1 this client can read (a bad status line, header or chunk size)."""


@attrs.define(eq=False)
class Response:
    """A response being read: its status and headers (names lower-cased), then its body with ``pieces``."""

    status: int
    headers: dict[str, str]
    _reader: asyncio.StreamReader
    _timeout_s: float
    complete: bool = False  # the body was read to its end

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives: a chunk a piece (chunked), else the rest up to Content-Length (or the close). A
        connection closed before the body's end raises ``HTTPError``."""
        try:
            async for piece in self._pieces():
                yield piece
        except asyncio.IncompleteReadError:
            raise HTTPError("the server closed the connection in the middle of the response") from None

    async def _pieces(self) -> AsyncIterator[bytes]:
        r, t = self._reader, self._timeout_s
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = await _within(r.readuntil(b"\r\n"), t)
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise HTTPError(f"a bad chunk size line {line[:40]!r}") from None
                if size == 0:  # the last chunk, then trailers up to an empty line
                    while await _within(r.readuntil(b"\r\n"), t) != b"\r\n":
                        pass
                    self.complete = True
                    return
                data = await _within(r.readexactly(size + 2), t)
                yield data[:-2]
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await _within(r.read(min(left, 1 << 16)), t)
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield data
            self.complete = True
        else:  # the body ends when the server closes the connection
            while data := await _within(r.read(1 << 16), t):
                yield data

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([p async for p in self.pieces()])


class Pool:
    """Kept-alive connections to one server (``url``: http:// or https://, host and optional port and path prefix)."""

    def __init__(self, url: str, max_connections: int | None, timeout_s: float, keepalive_s: float = 2.0,
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        """``headers``: sent with every request (an API key's Authorization)."""
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        self.host, self.https = u.hostname, u.scheme == "https"
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.authority = u.netloc.rsplit("@", 1)[-1].encode()
        self.timeout_s, self.keepalive_s = timeout_s, keepalive_s
        self._ssl = ssl.create_default_context() if self.https else None
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []  # (..., idle since)
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._headers = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in (headers or {}).items())

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await _within(asyncio.open_connection(self.host, self.port, ssl=self._ssl), self.timeout_s)

    async def warm(self, n: int) -> None:
        """Open connections until ``n`` are idle (before a round's clock: a burst's requests start on open ones)."""
        self._expire()
        new = await asyncio.gather(*(self._connect() for _ in range(n - len(self._idle))))
        now = time.monotonic()
        self._idle.extend((r, w, now) for r, w in new)

    def _expire(self) -> None:
        """Close the connections idle for longer than ``keepalive_s`` (less than servers' keep-alive timeouts, 5 s at
        the least, so that no request is written to a connection the server is closing)."""
        old = time.monotonic() - self.keepalive_s
        while self._idle and self._idle[0][2] < old:
            self._idle.pop(0)[1].close()

    @contextlib.asynccontextmanager
    async def post(self, path: str, body: bytes, content_type: str = "application/json") -> AsyncIterator[Response]:
        """POST ``body`` to ``path`` (after the URL's own path); the response, its status and headers read."""
        if self._slots is not None:
            await self._slots.acquire()
        conn = None
        try:
            self._expire()
            conn = self._idle.pop()[:2] if self._idle else await self._connect()
            reader, writer = conn
            writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                         b"Accept: text/event-stream, application/json\r\n%s\r\n%s"
                         % ((self.prefix + path).encode(), self.authority, content_type.encode(), len(body),
                            self._headers, body))  # fmt: skip
            try:
                head = await _within(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
            except asyncio.IncompleteReadError:
                raise HTTPError("the server closed the connection before its response") from None
            resp = _response(head, reader, self.timeout_s)
            yield resp
            if resp.complete and resp.headers.get("connection", "").lower() != "close":
                self._idle.append((*conn, time.monotonic()))
                conn = None
        finally:
            if conn is not None:
                conn[1].close()
            if self._slots is not None:
                self._slots.release()

    def close(self) -> None:
        """Close the idle connections."""
        for _, writer, _ in self._idle:
            writer.close()
        self._idle.clear()


def _response(head: bytes, reader: asyncio.StreamReader, timeout_s: float) -> Response:
    """The status line and headers of ``head`` (up to the empty line)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise HTTPError(f"a bad status line {lines[0][:60]!r}")
    headers = {}
    for line in lines[1:]:
        if line:
            name, colon, value = line.partition(":")
            if not colon:
                raise HTTPError(f"a bad header line {line[:60]!r}")
            headers[name.strip().lower()] = value.strip()
    return Response(int(code), headers, reader, timeout_s)
