"""The engine core in a process of its own: it builds the engine, warms it up, and then only steps it.

Each front end (``client.EngineClient``; a server runs one or more) and this process talk over two ZMQ sockets, one
each way, every message one msgpack array whose first item is its kind (``Kind``): this process takes every front
end's PUSH on one PULL, and publishes each of its messages once to all of them (XPUB: it says READY once every front
end has subscribed, and drops nothing for one that is behind). A front end sends what one turn of its loop gave
as the frames of one multipart message: ADD (request id, prompt ids, sampling fields, and Whisper's features or None),
ABORT (request id) and SHUTDOWN (the first front end only). The engine sends PROGRESS while it starts (each stage
with the wall-clock time it began), READY with what it serves (``ServedModel``), then a STEP message for every step
that gave tokens or results: the request id of each new token and the token, the finished requests with their finish
reasons, the engine's load and step counters, (when a token of the step asked) the tokens' logprobs: float32 logprob
[n], int32 top ids and float32 top logprobs [n, 5], as bytes, and the prompts' logprobs of the requests that asked
whose first token is in the step (each its request id and the same three arrays over its prompt tokens 1 .. P-1). A
request the engine refuses comes back as REJECTED (its field and message); FAILED carries a fatal error's traceback
before the process exits.

Between steps the loop takes every message waiting, then steps; with nothing to run it blocks on its inbox (waking every
second to see whether the front end still lives). With ``EngineSpec.burst_wait_ms``, an idle engine that has just
taken a request gathers a burst before its first step: it waits for more until they fill a prefill pass or the wait is
spent. A front end takes a burst in one request at a time, and the client's sends of a burst spread over milliseconds
(on an H200's host a burst's second request reached the server 0.7-3.1 ms after its first, and the engine 0.2-2.1
ms after: ``models/bench/results/server-h200``, call AG), so otherwise the first step starts a pass with the first
request alone, and as one pass runs at a time every later request waits for it too (a pass is ~10-15 ms, call AB);
in-process, the whole burst is there for the first step. The gathering used to end on a quiet inbox (2 ms without a
message): on one H200 host the first request still went alone in four bursts of six (call AF). A lone request at an
idle engine pays the whole wait. Nothing else runs in this process: no tokenizer, no HTTP.
"""

from __future__ import annotations

import enum
import math
import os
import signal
import sys
import time
import traceback

import attrs
import msgpack
import zmq

from models.server.heap import CollectorClock, freeze_heap

ALIVE_CHECK_MS = 1000  # an idle engine looks this often whether its parent process is still there
BURST_WAIT_MS = 5.0  # EngineSpec.burst_wait_ms's default (the server's --burst-wait-ms)


class Kind(enum.IntEnum):
    ADD = 1
    ABORT = 2
    SHUTDOWN = 3
    PROGRESS = 10
    READY = 11
    FAILED = 12
    STEP = 13
    REJECTED = 14


@attrs.frozen
class EngineSpec:
    """What the engine process builds (picklable): a model directory (or a random-weight model by name), on a
    device, with ``serving_config``'s keyword choices; ``warmup``: serve a few requests before READY."""

    model_dir: str | None
    model: str | None = None  # a models.engine.adapters name (random weights), when there is no model_dir
    device: str | None = None  # None: cuda where there is one, else cpu
    dtype: str | None = None  # float32 / bfloat16 / float16; None: the checkpoint's
    choices: dict = attrs.Factory(dict)  # serving_config keywords (enums by value)
    warmup: bool = True
    seed: int = 0
    burst_wait_ms: float = BURST_WAIT_MS  # an idle engine's wait for a pass's worth of requests before its first step


@attrs.frozen
class ServedModel:
    """What a built engine serves, as the front end needs it to check and shape requests."""

    name: str
    vocab_size: int
    max_seq_len: int
    eos_token_ids: tuple[int, ...]
    notes: tuple[str, ...]  # what the serving defaults chose (printed at start-up)
    generation: dict  # the checkpoint's generation_config.json (default sampling)


def pack(*items) -> bytes:
    return msgpack.packb(items, use_bin_type=True)


def unpack(data: bytes) -> list:
    return msgpack.unpackb(data, raw=False)


def build_engine(spec: EngineSpec, progress):
    """The engine ``spec`` describes and what it serves; ``progress(stage)`` is told each stage as it starts."""
    progress("importing torch and the engine")
    import torch

    from models.engine.adapters import build_adapter
    from models.engine.config import PrefillPlacement
    from models.engine.driver import Engine
    from models.engine.serving import serving_config
    from models.layers.decode_attention import Backend

    dtype = getattr(torch, spec.dtype) if spec.dtype else None
    device = spec.device or ("cuda" if torch.cuda.is_available() else "cpu")
    progress("loading weights")
    if spec.model_dir is not None:
        from models.engine.checkpoint import load_adapter

        adapter = load_adapter(spec.model_dir, device, dtype)
        generation = adapter.checkpoint.generation
    else:
        adapter = build_adapter(spec.model, spec.seed, device, dtype or torch.float32)
        generation = {}
    choices = dict(spec.choices)
    if choices.get("attention") is not None:
        choices["attention"] = Backend(choices["attention"])
    if choices.get("prefill") is not None:
        choices["prefill"] = PrefillPlacement(choices["prefill"])
    plan = serving_config(adapter, device, **choices)
    progress("building the engine (pools, graphs)")
    engine = Engine(adapter, plan.config)
    served = ServedModel(adapter.name, adapter.vocab_size, plan.config.max_seq_len, tuple(adapter.eos_token_ids),
                         (f"device {device}", *plan.notes), generation)  # fmt: skip
    if spec.warmup:
        progress("warming up (compiling kernels)")
        warm_up(engine, adapter.vocab_size, plan.config.max_seq_len)
    return engine, served


def warm_up(engine, vocab: int, context: int) -> None:
    """Serve requests that run every kind of step once (greedy and sampled, short and chunked prompts; Whisper's on
    silence), so that no client's request pays for a first-use compile."""
    import torch

    from models.engine.requests import Request, SamplingParams

    sampled = SamplingParams(max_tokens=3, temperature=0.8, top_p=0.9, top_k=20, seed=1, ignore_eos=True)
    greedy = SamplingParams(max_tokens=3, ignore_eos=True)
    cfg = engine.adapter.model.cfg
    if hasattr(cfg, "num_mel_bins"):  # Whisper: a decoder start token and the features of silence
        silence = torch.zeros(cfg.num_mel_bins, cfg.n_frames)
        requests = [Request((cfg.decoder_start_token_id,), sp, features=silence, request_id=f"warmup-{i}")
                    for i, sp in enumerate((greedy, sampled))]  # fmt: skip
    else:
        n = max(1, min(context - 4, 2 * (engine.config.token_budget or 64)))
        prompts = [(1, 2, 3, 4), (5, 6, 7, 8), tuple(i % vocab for i in range(n))]
        requests = [Request(p, sampled if i == 1 else greedy, request_id=f"warmup-{i}")
                    for i, p in enumerate(prompts)]  # fmt: skip
    engine.run(requests)


def pack_features(features) -> tuple[list[int], bytes] | None:
    """Whisper's log-mel features [n_mels, frames] as an ADD message carries them: (shape, float32 bytes)."""
    return None if features is None else (list(features.shape), features.float().numpy().tobytes())


def request_of(prompt: list[int], sampling: dict, rid: str, features: tuple[list[int], bytes] | None):
    """The engine's Request for an ADD message's fields."""
    import numpy as np
    import torch

    from models.engine.requests import Request, SamplingParams

    sp = dict(sampling)
    if "stop_token_ids" in sp:
        sp["stop_token_ids"] = tuple(sp["stop_token_ids"])
    feats = None
    if features is not None:
        shape, data = features
        feats = torch.from_numpy(np.frombuffer(data, np.float32).reshape(shape).copy())
    return Request(tuple(prompt), SamplingParams(**sp), features=feats, request_id=rid)


def parent_gone(parent: int | None) -> bool:
    """The process ``parent`` (a pid; None: none to watch) is no longer this one's parent: it has exited."""
    return parent is not None and os.getppid() != parent


def serve(engine, inbox: zmq.Socket, outbox: zmq.Socket, parent: int | None, burst_wait_s: float,
          pass_tokens: int | None = None) -> None:  # fmt: skip
    """The loop: take what the front end sent, step, send what the step gave; until SHUTDOWN or the parent process
    dies (``parent``: its pid; None for an engine in a thread of the front end's process, which lives as long). An
    idle engine gathers a burst for at most ``burst_wait_s`` before its first step, or until the requests taken hold
    ``pass_tokens`` prompt tokens (None: no such bound) (module doc). A STEP message also carries the intakes since the
    last one: each request's seconds from its arrival at the server to its submission here."""
    import numpy as np

    from models.engine.requests import InvalidRequest

    intakes: list[float] = []
    collector = CollectorClock()
    full = math.inf if pass_tokens is None else pass_tokens
    while True:
        busy = engine.has_work()
        gathering = not busy and burst_wait_s > 0
        gather_until = math.inf  # (set once the idle engine has taken its first message)
        taken = 0  # prompt tokens submitted since the last step
        timeout = 0 if busy else ALIVE_CHECK_MS
        while inbox.poll(timeout):
            for frame in inbox.recv_multipart():
                msg = unpack(frame)
                kind = msg[0]
                if kind == Kind.ADD:
                    _, rid, prompt, sampling, features, arrived = msg
                    intakes.append(time.perf_counter() - arrived)  # (the front end's clock is this one: monotonic)
                    try:
                        engine.submit(request_of(prompt, sampling, rid, features))
                        taken += len(prompt)
                    except (InvalidRequest, TypeError) as e:
                        outbox.send(pack(Kind.REJECTED, rid, getattr(e, "field", "request"), str(e)))
                elif kind == Kind.ABORT:
                    engine.abort(msg[1])
                elif kind == Kind.SHUTDOWN:
                    return
            busy, timeout = True, 0
            if gathering:
                now = time.perf_counter()
                gather_until = min(gather_until, now + burst_wait_s)
                if taken and taken < full and now < gather_until:
                    timeout = math.ceil((gather_until - now) * 1e3)
        if not busy and parent_gone(parent):
            return  # the front end is gone
        if engine.has_work():
            out = engine.step()
            if out.tokens.size or out.finished:
                load, st = engine.load(), engine.stats
                lp = None if out.logprob is None else (out.logprob.astype(np.float32).tobytes(),
                                                       out.top_ids.astype(np.int32).tobytes(),
                                                       out.top_logprobs.astype(np.float32).tobytes())  # fmt: skip
                prompt_lp = [(rid, p.logprob.astype(np.float32).tobytes(), p.top_ids.astype(np.int32).tobytes(),
                              p.top_logprobs.astype(np.float32).tobytes())
                             for rid, p in out.prompt_logprobs]  # fmt: skip
                outbox.send(pack(Kind.STEP, out.request_ids.tolist(), out.tokens.tolist(),
                                 [(r.request_id, r.finish_reason.value) for r in out.finished],
                                 (load.waiting, load.running, load.pages_used, load.pages_total, st.steps,
                                  st.decode_steps, st.decode_ns, st.decode_beside_pass, st.prefix_hits,
                                  st.prefix_cached_tokens, collector.seconds, st.prefill_passes, st.prefill_tokens,
                                  st.prefill_ns),
                                 lp, prompt_lp, time.perf_counter(), intakes))  # fmt: skip  (sent: the delivery lag)
                intakes = []


def main(spec: EngineSpec, links, parent: int | None, context: zmq.Context | None = None) -> None:
    """The engine process's body (or, with ``context``, a thread's in the front end's process)."""
    run_core(build_engine, spec, links, parent, context)


def subscribed(outbox: zmq.Socket, front_ends: int, parent: int | None) -> bool:
    """Wait until ``front_ends`` subscriptions reached the XPUB ``outbox`` (a message published before a front end
    subscribed never reaches it); False if the parent process ended first."""
    seen = 0
    while seen < front_ends:
        if outbox.poll(100):
            seen += outbox.recv()[:1] == b"\x01"  # (a subscription; b"\x00" would be its end)
        elif parent_gone(parent):
            return False
    return True


def run_core(build, spec: EngineSpec, links, parent: int | None, context: zmq.Context | None = None) -> None:
    """Connect to every front end's ``client.Link``, ``build(spec, progress)`` the engine (``(engine, ServedModel)``),
    say READY, then ``serve`` it. The first message waits for a front end's subscription (the first front end's: it
    subscribed before it launched this process; the others start beside it), READY for every one's."""
    if context is None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the front end decides
    ctx = context or zmq.Context()
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.XPUB)
    outbox.setsockopt(zmq.SNDHWM, 0)  # a front end that is behind gets every message later, never loses one
    outbox.setsockopt(zmq.XPUB_VERBOSE, 1)  # every front end's subscription comes up, not only the first
    for link in links:
        inbox.connect(link.to_engine)
        outbox.connect(link.from_engine)
    try:  # (the times are the wall clock's: the front end says them from its own start)
        if not subscribed(outbox, 1, parent):
            return
        engine, served = build(spec, lambda stage: outbox.send(pack(Kind.PROGRESS, stage, time.time())))
        freeze_heap()
        if not subscribed(outbox, len(links) - 1, parent):
            return
        outbox.send(pack(Kind.READY, attrs.asdict(served), time.time()))
        serve(engine, inbox, outbox, parent, spec.burst_wait_ms / 1e3,
              engine.config.largest_pass if hasattr(engine, "config") else None)
    except Exception:  # the front end reports it (with this traceback) and stops; the process ends quietly
        outbox.send(pack(Kind.FAILED, traceback.format_exc()))
        if context is None:
            sys.exit(1)
    finally:
        outbox.close(linger=1000)
        inbox.close(linger=0)
        if context is None:
            ctx.term()
