"""An OpenAI-compatible server: ``python -m models.server --model-dir DIR [--host 127.0.0.1 --port 8000]``.

The engine core runs in a process of its own (``engine_core.py``), fed over ZMQ with msgpack; this process is the HTTP
front end (FastAPI on uvicorn): it tokenizes, detokenizes and writes the streams. Start-up loads the weights, builds
the engine (pools, captured graphs) and serves a few warm-up requests (compiling every kernel) before it prints
"ready" with the URL, so no request pays for a compile. Triton and FlashInfer keep their compile caches on disk
(``~/.triton/cache``, ``~/.cache/flashinfer``): a second start skips the compiles.

Endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (the checkpoint's chat template),
``/v1/audio/transcriptions`` (a Whisper checkpoint: a WAV upload), ``/health``, ``/metrics`` (Prometheus). SIGTERM
(or Ctrl-C) drains: new requests get 503, running ones finish, then the server exits; a second signal exits at once.

``--front-ends N`` runs N front-end processes over the one engine, sharing the port (``front_ends.py``).

Defaults on CUDA are the fastest engine the benchmarks measured (Triton attention that needs no host plan, overlapped
resident decode steps, captured prefill passes beside the decode steps); on a CPU, the engine that runs there. The
start-up log says what each default chose.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from models.cli import OneLineParser, burst_wait_ms, positive_int
from models.server.engine_core import BURST_WAIT_MS, EngineSpec
from models.server.heap import freeze_heap

DRAIN_TIMEOUT_S = 60.0
KEEP_ALIVE_S = 15.0  # an idle HTTP connection is closed after this (clients' pools keep theirs about 5 s)
WARM_UP_TIMEOUT_S = 120.0  # the start-up's requests to itself
API_KEY_ENV = "RESPLAN_API_KEY"  # --api-key's default (a key on the command line shows in the process list)


def parser() -> OneLineParser:
    ap = OneLineParser(prog="python -m models.server", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model-dir", type=Path, required=True, help="a Hugging Face model directory (local files)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only)")
    ap.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    ap.add_argument("--served-model-name", default=None, help="the model's name in the API (default: the directory's)")
    ap.add_argument("--max-waiting", type=positive_int, default=1024,
                    help="requests waiting for the engine beyond which new ones get 503 (default 1024)")
    ap.add_argument("--front-ends", type=positive_int, default=1,
                    help="HTTP front-end processes over the one engine (default 1). Each parses, checks and tokenizes "
                         "its requests and writes its streams; they share the port (the kernel spreads connections "
                         "over them) and /metrics sums theirs. More than one takes a burst in faster where one "
                         "process's CPU is what requests wait for (as vLLM's --api-server-count)")  # fmt: skip
    ap.add_argument("--in-process", action="store_true",
                    help="run the engine core in a thread of this process, not a process of its own (debugging)")
    ap.add_argument("--drain-timeout", type=float, default=DRAIN_TIMEOUT_S,
                    help=f"seconds a shutdown waits for running requests (default {DRAIN_TIMEOUT_S:.0f})")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar while starting")
    ap.add_argument("--max-audio-mb", type=float, default=25.0,
                    help="a transcription's upload at most, in MB (default 25, OpenAI's; larger: 413)")
    ap.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                    help=f"a key every API request must carry as 'Authorization: Bearer KEY' (401 otherwise; /health "
                         f"and /metrics stay open); default: ${API_KEY_ENV}, else none")  # fmt: skip
    e = ap.add_argument_group("engine (defaults: the fastest measured engine on CUDA, see above)")
    e.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    e.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="weights and KV caches (default: the checkpoint's)")
    e.add_argument("--max-running", type=positive_int, default=None,
                   help="requests decoded at once (default 64 on CUDA, 8 on a CPU)")
    e.add_argument("--max-seq-len", type=positive_int, default=None,
                   help="context a request may fill, prompt and output (default: the model's)")
    e.add_argument("--kv-memory-gib", type=float, default=None,
                   help="memory for the KV pages (default: half the GPU memory free after the weights; 2 GiB on a "
                        "CPU); never more than every running request at the full context")
    e.add_argument("--attention", choices=["torch", "triton", "fa2", "xqa"], default=None,
                   help="decode attention (default: triton on CUDA, torch on a CPU)")
    e.add_argument("--no-overlap", action="store_true", help="read each step's tokens before launching the next")
    e.add_argument("--no-prefix-cache", action="store_true",
                   help="no prefix cache (by default on for Qwen3.5: KV pages shared by their token chain, "
                        "recurrent-state checkpoints restored, so a chat's next turn prefills only what is new)")
    e.add_argument("--prefill-graphs", type=int, default=None,
                   help="token buckets of captured prefill passes (default 6 where the pass can be captured: bf16 or "
                        "fp16 on CUDA; else 0, eager)")
    e.add_argument("--prefill", choices=["in-step", "in-pass", "beside", "beside-priority"], default=None,
                   help="where a prefill pass runs relative to the decode steps (default: beside on CUDA)")
    e.add_argument("--burst-wait-ms", type=burst_wait_ms, default=BURST_WAIT_MS,
                   help="an idle engine that has just taken a request waits up to this long for more before its "
                        "first step, until they fill a prefill pass: a burst's first pass then holds its first "
                        "requests, not the first alone, which every later request would wait for; a lone request "
                        f"pays the whole wait (default {BURST_WAIT_MS:g}; 0: step at once)")
    return ap


def _check_options(ap: OneLineParser, args) -> None:
    """One-line errors for what the options alone tell, before anything is imported or started."""
    if not 0 <= args.port < 65536:
        ap.error(f"argument --port: must be in [0, 65535], got {args.port}")
    if args.front_ends > 1 and args.in_process:
        ap.error("argument --front-ends: an engine in a thread (--in-process) serves one front end")
    if args.prefill_graphs is not None and args.prefill_graphs < 0:
        ap.error("argument --prefill-graphs: must be >= 0")
    if args.kv_memory_gib is not None and args.kv_memory_gib <= 0:
        ap.error("argument --kv-memory-gib: must be > 0")
    if args.max_audio_mb <= 0:
        ap.error("argument --max-audio-mb: must be > 0")
    if not (args.model_dir / "config.json").is_file():
        ap.error(f"argument --model-dir: {args.model_dir} holds no config.json (a Hugging Face model directory)")


def _check_model(error: Callable[[str], NoReturn], args) -> None:
    """One-line errors (``error``) for the device asked for and the directory, while the engine process starts."""
    from models.engine.checkpoint import CheckpointError, read_checkpoint

    if args.device is not None:
        import torch

        if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
            error("argument --device: cuda asked for, but this machine has no CUDA GPU (use --device cpu)")
    try:
        read_checkpoint(args.model_dir)
    except CheckpointError as e:
        error(str(e))


class _Refused(Exception):
    """A one-line refusal found on the start-up thread: the main thread says it (``ap.error``), after any stage the
    engine reported first, never in between."""


def refuse(message: str) -> NoReturn:
    raise _Refused(message)


def front_end_files(error: Callable[[str], NoReturn], args):
    """The front end's own start: the directory checked, the tokenizer read, Whisper's audio settings (or None)."""
    _check_model(error, args)
    import uvicorn  # noqa: F401 (the HTTP stack imported here, while the engine loads)

    from models.engine.text import Tokenizer, TokenizerError
    from models.server.app import AudioFront

    try:
        return Tokenizer.from_pretrained(args.model_dir), AudioFront.of(args.model_dir)
    except (TokenizerError, ValueError) as e:
        error(str(e))


def raise_open_files_limit() -> None:
    """Let this process hold as many sockets as the system allows (a thousand streaming clients need more than the
    soft limit of 1024 descriptors many systems start with)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def _start(ap: OneLineParser, args, client, progress: _Progress, peers=None):
    """Launch the engine and, while it starts, check the directory and read the tokenizer on a thread (this one waits
    for the engine and says its stages); (what it serves, the tokenizer, Whisper's audio settings or None) once both
    are done. The front end's one-line error (SystemExit) or the engine's failure (EngineFailed) is raised."""
    # (transformers' lazy imports are not safe from two threads at once; a process of its own imports, loads and
    # builds while this one checks and reads)
    front = front_end_files(ap.error, args) if args.in_process else None
    client.launch()
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="front-end-start")
    reading = pool.submit(lambda: front or front_end_files(refuse, args))
    pool.shutdown(wait=False)
    reported = False
    held: list[tuple[str, float]] = []  # the engine's stages until the front end's checks pass: a refusal is one line

    def check() -> None:
        nonlocal reported
        if peers is not None:
            peers.check()
        if reading.done() and not reported:
            try:
                reading.result()
            except _Refused as e:
                ap.error(str(e))
            reported = True
            for stage in held:
                progress(*stage)
            progress("front end: tokenizer read", time.time() - client.launched_at)

    def say(stage: str, seconds: float) -> None:
        if reported:
            progress(stage, seconds)
        else:
            held.append((stage, seconds))

    served = client.wait_ready(say, check=check)
    concurrent.futures.wait([reading])
    check()
    tokenizer, audio = reading.result()
    return served, tokenizer, audio


class _Progress:
    """The start-up stages on stderr, each with the seconds since the launch: a bar when stderr is a terminal (and
    wanted), else a line each."""

    STAGES = 7  # the engine's five (importing, loading, building, warming up, ready), the front end's two

    def __init__(self, show_bar: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=self.STAGES, desc="starting", file=sys.stderr, leave=False,
                        bar_format="{desc} {bar} {elapsed}") if show_bar else None  # fmt: skip

    def __call__(self, stage: str, seconds: float) -> None:
        if self.bar is not None:
            self.bar.set_description_str(stage)
            self.bar.update(1)
        else:
            print(f"[{seconds:6.1f} s] {stage}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def engine_spec(args):
    """The engine the options ask for."""
    choices = {k: v for k, v in dict(max_running=args.max_running, max_seq_len=args.max_seq_len,
                                     kv_memory_gib=args.kv_memory_gib, attention=args.attention,
                                     overlap=False if args.no_overlap else None, prefill_graphs=args.prefill_graphs,
                                     prefix_cache=False if args.no_prefix_cache else None,
                                     prefill=args.prefill).items() if v is not None}  # fmt: skip
    return EngineSpec(str(args.model_dir), device=args.device, dtype=args.dtype, choices=choices,
                      burst_wait_ms=args.burst_wait_ms)


def server_state(args, client, tokenizer, audio):
    """A front end's state over its engine client, not yet ready."""
    from models.server.app import ServerState

    return ServerState(client, tokenizer, args.served_model_name or client.served.name, args.max_waiting, audio,
                       ready=False, max_audio_mb=args.max_audio_mb)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    _check_options(ap, args)
    try:  # (before anything starts: a port in use is one line)
        from models.server.front_ends import listening_socket

        public = listening_socket(args.host, args.port, shared=args.front_ends > 1)
    except OSError as e:
        ap.error(f"argument --port: cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    with public:
        return _serve_on(ap, args, argv, public)


def _serve_on(ap: OneLineParser, args, argv: list[str], public) -> int:
    """Start the engine (and the other front ends), then serve on the bound socket ``public`` until drained."""
    from models.server.client import EngineClient, EngineFailed
    from models.server.front_ends import FrontEndFailed, Peers, listening_socket

    client = EngineClient(engine_spec(args), in_process=args.in_process, front_ends=args.front_ends)
    peers = Peers.start(argv, client.links[1:], public.getsockname()[1]) if args.front_ends > 1 else None
    t0 = time.perf_counter()
    raise_open_files_limit()
    progress = _Progress(not args.no_progress and sys.stderr.isatty())

    def stop_all() -> None:
        if peers is not None:
            peers.terminate()
            peers.join(10)
        client.shutdown()

    try:
        try:
            served, tokenizer, audio = _start(ap, args, client, progress, peers)
        except SystemExit:
            stop_all()
            raise
    except (EngineFailed, FrontEndFailed) as e:
        progress.close()
        what = "the engine" if isinstance(e, EngineFailed) else "a front end"
        print(f"python -m models.server: error: {what} could not start:\n{e}", file=sys.stderr)
        stop_all()
        return 1
    except KeyboardInterrupt:
        progress.close()
        print("python -m models.server: interrupted while starting", file=sys.stderr)
        stop_all()
        return 130
    state = server_state(args, client, tokenizer, audio)
    private = listening_socket("127.0.0.1", 0, shared=False) if peers is not None else None
    sockets = [public] if private is None else [public, private]
    port = public.getsockname()[1]

    async def on_listening() -> None:
        import asyncio

        warm_host, warm_port = ((args.host, port) if private is None
                                else ("127.0.0.1", private.getsockname()[1]))  # fmt: skip
        await warm_front_end(state, warm_host, warm_port, args.api_key)
        if peers is not None:
            ports = await asyncio.get_running_loop().run_in_executor(None, peers.wait_warm)
            peers.announce([warm_port, *ports])
            state.peer_ports = ports
        state.ready = True  # (/health: 200 from now on)
        progress("front end: warmed up through HTTP", time.time() - client.launched_at)
        progress.close()
        for note in served.notes:
            print(f"  {note}", file=sys.stderr)
        fronts = f", {args.front_ends} front ends" if peers is not None else ""
        print(f"ready: http://{args.host}:{port} (model {state.model}{fronts}, {time.perf_counter() - t0:.1f} s)",
              flush=True)  # fmt: skip

    try:
        return serve(args, state, sockets, on_listening, peers=peers)
    finally:
        state.prompts.close()
        stop_all()


def serve(args, state, sockets, on_listening, peers=None, owner: int | None = None) -> int:
    """Serve ``state``'s app on ``sockets`` until a signal drains it (``_DrainingServer``): the first front end with
    the other front ends' ``peers`` (or None), another with its ``owner``'s pid. ``on_listening()`` is awaited once
    the sockets listen. The exit code: 1 where a front end or the start failed, else 0."""
    import uvicorn

    from models.server.app import asgi_app

    app = asgi_app(state, args.api_key or None)
    server = _DrainingServer(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5,
                                            timeout_keep_alive=KEEP_ALIVE_S),
                             state, args.drain_timeout, peers, owner)  # fmt: skip
    server.on_listening = on_listening
    server.run(sockets=sockets)
    return server.exit_code


async def warm_front_end(state, host: str, port: int, api_key: str | None = None) -> None:
    """One streamed request of each kind the server takes, sent to itself over HTTP before it says "ready", so that
    no client's request pays for a first use (the routes' validators, the tokenizer's and the chat template's first
    call, the tokenizer queue's thread, the engine's first step after its warm-up); the metrics start after it. A
    failure is reported, not fatal."""
    import asyncio
    import json

    bodies = [] if state.audio is not None else [
        ("/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 2, "stream": True, "ignore_eos": True}),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 2, "stream": True, "ignore_eos": True}),
        *([("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2,
                                     "stream": True})] if state.tokenizer.has_chat_template else []),
    ]  # fmt: skip
    target = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    key = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    for path, body in bodies:
        data = json.dumps(body).encode()
        try:
            reader, writer = await asyncio.open_connection(target, port)
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {target}\r\nContent-Type: application/json\r\n{key}"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)  # fmt: skip
            reply = await asyncio.wait_for(reader.read(-1), WARM_UP_TIMEOUT_S)
            writer.close()
            if b"data: [DONE]" not in reply:
                raise RuntimeError(reply.decode(errors="replace").split("\r\n", 1)[0])
        except Exception as e:  # noqa: BLE001 (reported; the server serves on)
            print(f"warning: the warm-up request to {path} failed: {e}", file=sys.stderr, flush=True)
    freeze_heap()
    state.start_metrics()


class _DrainingServer:
    """uvicorn's server, whose first SIGTERM or SIGINT drains (new requests 503, running ones finish, at most
    ``drain_timeout`` seconds) before it exits; a second exits at once. The first front end passes its signals on to
    the other front ends (``peers``) and exits once they have; another front end (``owner``: the first's pid) ignores
    SIGINT (a terminal's Ctrl-C reaches every process of the group: the first passes it on as SIGTERM) and exits at
    once if the first is gone. A front end that exits while serving stops the first (``exit_code`` 1); so does the
    engine's failure (every front end exits, the first saying the engine's traceback)."""

    def __new__(cls, config, state, drain_timeout: float, peers=None, owner: int | None = None):
        import signal

        import uvicorn

        from models.server.engine_core import parent_gone
        from models.server.front_ends import FrontEndFailed

        class Server(uvicorn.Server):
            on_listening = None  # an async callable, awaited once the server listens
            exit_code = 0

            def handle_exit(self, sig, frame) -> None:
                if owner is not None and sig == signal.SIGINT:
                    return
                if peers is not None:
                    peers.terminate()
                if state.draining:
                    return super().handle_exit(sig, frame)
                state.draining = True
                self.drain_deadline = time.monotonic() + drain_timeout
                if owner is None:
                    print("draining: new requests get 503; waiting for the running ones", file=sys.stderr, flush=True)

            async def startup(self, sockets=None) -> None:
                await super().startup(sockets)
                if self.on_listening is not None and self.servers:
                    try:
                        await self.on_listening()
                    except Exception as e:  # noqa: BLE001 (a front end that failed to start: said in one line)
                        print(f"python -m models.server: error: {e}", file=sys.stderr, flush=True)
                        self.exit_code, self.should_exit = 1, True

            async def on_tick(self, counter: int) -> bool:
                if parent_gone(owner):
                    return True
                if owner is None:
                    state.client.check_engine()
                if state.client.failed is not None:  # (its requests were answered with the error; none can be now)
                    if owner is None:
                        print(f"python -m models.server: error: the engine failed; stopping:\n{state.client.failed}",
                              file=sys.stderr, flush=True)  # fmt: skip
                    if peers is not None:
                        peers.terminate()
                    self.exit_code = 1
                    return True
                if peers is not None and not state.draining:
                    try:
                        peers.check()
                    except FrontEndFailed as e:
                        print(f"python -m models.server: error: {e}; stopping", file=sys.stderr, flush=True)
                        self.exit_code = 1
                        self.handle_exit(signal.SIGTERM, None)
                if state.draining:
                    late = time.monotonic() > self.drain_deadline
                    if late or (state.active == 0 and (peers is None or peers.running() == 0)):
                        return True
                return await super().on_tick(counter)

        return Server(config)
