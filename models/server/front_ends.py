"""Several front-end processes over one engine core (``--front-ends N``), as vLLM's ``--api-server-count``.

One front end's event loop parses, checks and tokenizes every request and writes every stream: a burst of a hundred
requests, or a thousand streams, can hold it for tens of milliseconds while the engine waits for its requests. With N
front ends the first process (the one started) launches the engine and N - 1 others (``run_front_end``); each binds
the server's port with SO_REUSEPORT, so that the kernel spreads new connections over them, and a loopback port of its
own (``private``), through which it warms itself up before "ready" and the others read its metrics (``/metrics``
sums the front ends': ``metrics.merged``). Every front end sends its requests to the engine and gets every engine
message (``client.Link``).

The first process says "ready" once every front end has warmed up, and each answers ``/health`` 200 only from then.
SIGTERM (or Ctrl-C) to the first process drains every front end (it passes SIGTERM on; the others ignore Ctrl-C,
which reaches the whole process group, and take the first's word); the first exits once they have. A front end that
dies while serving stops the server (exit 1): a server that drops some of its connections is worse than a restart.
"""

from __future__ import annotations

import multiprocessing
import socket
import time

import attrs

PEER_START_TIMEOUT_S = 600.0  # another front end's start (imports, tokenizer, the engine's build) until it warmed up


def listening_socket(host: str, port: int, shared: bool) -> socket.socket:
    """A TCP socket bound to (host, port) (0: a free port), not yet listening; ``shared``: with SO_REUSEPORT, so that
    the other front ends bind the same port (only processes of the same user can, on Linux)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class FrontEndFailed(RuntimeError):
    """Another front end could not start, or exited."""


@attrs.define
class Peers:
    """The first process's view of the other front ends: their processes and a pipe to each."""

    procs: list = attrs.Factory(list)  # multiprocessing.Process, front ends 1 .. N-1
    pipes: list = attrs.Factory(list)  # the first process's end of each one's pipe

    @classmethod
    def start(cls, argv: list[str], links, port: int) -> Peers:
        """Spawn a front end for each of ``links`` (``client.Link``), serving ``argv``'s server on ``port``."""
        ctx = multiprocessing.get_context("spawn")
        peers = cls()
        for k, link in enumerate(links, 1):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=run_front_end, args=(argv, k, link, port, theirs), name=f"front-end-{k}",
                               daemon=True)  # fmt: skip
            proc.start()
            theirs.close()
            peers.procs.append(proc)
            peers.pipes.append(mine)
        return peers

    def check(self) -> None:
        """FrontEndFailed if one of them has exited."""
        for k, proc in enumerate(self.procs, 1):
            if not proc.is_alive():
                raise FrontEndFailed(f"front end {k} exited (code {proc.exitcode})")

    def wait_warm(self, timeout_s: float = PEER_START_TIMEOUT_S) -> list[int]:
        """Wait until every one has warmed up (blocking); their private ports. FrontEndFailed if one fails first."""
        deadline = time.monotonic() + timeout_s
        ports: dict[int, int] = {}
        while len(ports) < len(self.procs):
            for k, pipe in enumerate(self.pipes, 1):
                if k in ports or not pipe.poll(0.05):
                    continue
                try:
                    what, detail = pipe.recv()
                except EOFError:
                    raise FrontEndFailed(f"front end {k} exited while starting") from None
                if what != "warm":
                    raise FrontEndFailed(f"front end {k} could not start: {detail}")
                ports[k] = detail
            self.check()
            if time.monotonic() > deadline:
                raise FrontEndFailed(f"the other front ends were not warmed up after {timeout_s:.0f} s")
        return [ports[k] for k in range(1, len(self.procs) + 1)]

    def announce(self, ports: list[int]) -> None:
        """Tell each that the server is ready, with every front end's private port (``ports``)."""
        for pipe in self.pipes:
            pipe.send(("ready", ports))

    def terminate(self) -> None:
        """SIGTERM to each still running: a first drains it, a second ends it at once."""
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()

    def running(self) -> int:
        """How many are still running."""
        return sum(proc.is_alive() for proc in self.procs)

    def join(self, timeout_s: float) -> None:
        """Wait for them to exit (at most ``timeout_s`` in all), then end any left."""
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def run_front_end(argv: list[str], index: int, link, port: int, pipe) -> None:
    """Front end ``index`` (>= 1): the server of ``argv`` on ``port`` over the engine the first process launched,
    talking to it through ``link``; ``pipe`` to the first process: ("warm", its private port) or ("failed", why),
    then ("ready", every front end's private port) back."""
    import os

    from models.server import cli

    owner = os.getppid()
    args = cli.parser().parse_args(argv)
    cli.raise_open_files_limit()
    try:
        from models.server.client import EngineClient

        client = EngineClient(cli.engine_spec(args), link=link, owner=owner)  # (subscribed: the engine may start)
        tokenizer, audio = cli.front_end_files(cli.refuse, args)
        client.wait_ready()
    except Exception as e:  # noqa: BLE001 (the first process says it and stops)
        pipe.send(("failed", str(e).splitlines()[-1] if str(e) else type(e).__name__))
        return
    public = listening_socket(args.host, port, shared=True)
    private = listening_socket("127.0.0.1", 0, shared=False)
    state = cli.server_state(args, client, tokenizer, audio)

    async def on_listening() -> None:
        import asyncio

        mine = private.getsockname()[1]
        await cli.warm_front_end(state, "127.0.0.1", mine, args.api_key)
        pipe.send(("warm", mine))
        try:
            _, ports = await asyncio.get_running_loop().run_in_executor(None, pipe.recv)
        except EOFError:  # the first process is gone: on_tick ends this one
            return
        state.peer_ports = [p for p in ports if p != mine]
        state.ready = True

    try:
        cli.serve(args, state, [public, private], on_listening, owner=owner)
    finally:
        state.prompts.close()
        client.shutdown()
