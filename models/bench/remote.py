"""The traffic benchmark's ``--url`` mode: its workload sent to an OpenAI-compatible server as streaming completions
(as ``vllm bench serve`` sends it), every request timed chunk by chunk, and the report's metrics and goodput.

A request is ``POST {url}/v1/completions`` with its prompt as token ids (``--prompt-text``: as text, ``as_text``),
``max_tokens`` its drawn output length, ``ignore_eos`` (vLLM's extension: it generates exactly that many tokens unless
a stop token of its own fires), greedy (``temperature`` 0) or its sampling (``temperature``, ``top_p``, ``top_k``,
``seed``), its ``stop_token_ids`` if it carries them, ``echo`` with ``logprobs`` if it scores its prompt
(``--scored-frac``), and ``stream`` with ``stream_options.include_usage``. Bodies are
encoded before a round starts; each is sent at its arrival (its offset from the round's start), and how late the client
sent it is reported (send lag).
Its times, from the moment it is sent, are read with ``time.perf_counter()`` as each network read arrives (the
events of one read share its time; a read's lines are split on bytes and only ``data:`` lines are parsed):

* TTFT: until the first chunk carrying a token: a choice with text, with token ids, or with no finish reason yet (a
  token that decodes to no text still counts, as in vLLM; a closing chunk holding only a finish reason does not, nor
  does an echoed prompt's, whose first token's logprob is null);
* ITL: the gaps between the chunks carrying tokens, after the first;
* E2EL: until the last chunk carrying a token;
* TPOT: (E2EL - TTFT) / (output tokens - 1), the output tokens from the usage chunk's ``completion_tokens``, else
  the chunks carrying tokens;
* response headers: until the status line and headers were read. ``models.server`` sends them once the request is
  with its engine, before any token: against the server's own TTFT (/metrics, from the handler's start) they show
  what a request waits before the server's handler runs.

A chat's later turn (``--shape chat``, a trace's sessions) is sent when the turn before it has ended (plus its think
time), its prompt that turn's prompt ids, the output ids the server returned for it and its own new message: a turn
that a later one continues asks for them with ``return_token_ids`` (vLLM's field, which ``models.server`` takes too;
re-tokenizing the returned text need not give the same ids). If that turn failed, or the server returned no ids, the
turns after it are not sent and fail with that reason. A chat's turns all go through one client process.

A request fails, counted and reported with its error (never dropped), on an HTTP error status, a broken stream, a
stream that ends before ``data: [DONE]``, an error event in the stream, or no token at all. Goodput
(``--goodput ttft:MS,tpot:MS``, vLLM's; ``itl:MS`` and ``e2el:MS`` too): the requests that completed and met every
target stated (ITL: every gap of the request; TPOT: 0 for a request of one token, as vLLM counts it), a second of the
round's wall time and as a fraction of the requests sent. Request and token throughput count completed requests.

The timed streams go out on lean HTTP/1.1 connections (``models.bench.http1``; httpx, tens to hundreds of
microseconds of CPU a request and a chunk, answers only the untimed requests), and before each timed round the client
opens one for each request arriving in the round's first ``KEEPALIVE_S`` (at most ``WARM_MAX`` a client process, or
``--max-connections``): a burst's TTFTs count neither the client's connection set-up nor a TCP handshake. What the
client still costs shows in the report: the send lag (a request sent late: the event loop was busy) and the client's
CPU share of the round's wall time (near 100%: the client, not the server, set the pace; at thousands of chunks a
second run it on cores the server does not use, or in more client processes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable

import attrs
import numpy as np

from models.bench.arms import frozen_heap
from models.bench.http1 import HTTPError, Pool
from models.bench.workload import WorkloadError
from models.engine import Request
from models.server.heap import freeze_heap

GOODPUT_NAMES = ("ttft", "tpot", "itl", "e2el")
# an event of one choice with text, no logprobs, no finish reason and no usage: a token's (read without parsing)
_TOKEN_CHUNK = re.compile(rb'^\{[^{]*"choices":\[\{"index":\d+,"text":"(?:[^"\\]|\\.)+","logprobs":null,'
                          rb'"finish_reason":null\}\](?:,"usage":null)?\}$')
LATENCIES = (("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"), ("E2EL", "e2el"))  # (name, key prefix)
STATS = (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"))


def goodput_targets(text: str) -> dict[str, float]:
    """``--goodput``'s ``NAME:MS[,NAME:MS...]``: the latency targets in ms by name (ttft, tpot, itl, e2el)."""
    hint = "targets are NAME:MS, comma-separated, NAME one of ttft, tpot, itl, e2el (e.g. ttft:500,tpot:50)"
    out: dict[str, float] = {}
    for part in text.split(","):
        name, colon, value = part.strip().partition(":")
        if not colon or name not in GOODPUT_NAMES:
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: {hint}")
        try:
            ms = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: {value!r} is not a number of ms") from None
        if not (math.isfinite(ms) and ms > 0):
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: a target must be a number of ms > 0")
        if name in out:
            raise argparse.ArgumentTypeError(f"{name} is named twice")
        out[name] = ms
    return out


def server_url(text: str) -> str:
    """``--url``: an http:// or https:// root (the path /v1/... is added to it), without its trailing slash."""
    if not text.startswith(("http://", "https://")) or text.rstrip("/").endswith(("http:", "https:")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8000)")
    return text.rstrip("/")


def _httpx():
    try:
        import httpx
    except ImportError:
        raise WorkloadError("--url", "sending requests to a server needs httpx (pip install httpx)") from None
    return httpx


# -- the server ----------------------------------------------------------------------------------------------------
@attrs.frozen
class Server:
    """The server a run measures: its URL, the model the requests name, and its context and vocabulary where it says
    them."""

    url: str
    model: str
    max_model_len: int | None  # vLLM's /v1/models field; None where the server does not give it
    vocab_size: int | None = None  # the token ids it takes, [0, vocab_size) (/tokenizer_info); None where unsaid


def bearer() -> dict[str, str]:
    """The API key's header when $OPENAI_API_KEY holds one (as ``vllm bench serve`` sends it; a server started with
    ``--api-key``), else none."""
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def connect(url: str, served_model: str | None, timeout_s: float) -> Server:
    """Wait until ``url`` answers (GET /health 200, or /v1/models 200 where it has no /health) for at most
    ``timeout_s``, then read its model from /v1/models (the first id, or ``served_model``, which it must list)."""
    httpx = _httpx()
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with httpx.Client(base_url=url, timeout=5.0, trust_env=False, headers=bearer()) as client:
        while True:
            try:
                r = client.get("/health")
                if r.status_code == 404:  # no /health route: the model list answering is the server being up
                    r = client.get("/v1/models")
                if r.status_code == 200:
                    break
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {' '.join(str(e).split())}" if str(e) else type(e).__name__
            if time.monotonic() >= deadline:
                raise WorkloadError("--url", f"no server answered at {url} within {timeout_s:g} s ({last}; "
                                             "--ready-timeout waits longer)")  # fmt: skip
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
        try:
            r = client.get("/v1/models")
            models = r.json()["data"] if r.status_code == 200 else None
            listed = {m["id"]: m for m in models} if isinstance(models, list) else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            r, listed = None, None
        vocab = _said_int(client, "/tokenizer_info", "vocab_size")
    if r is not None and r.status_code in (401, 403):
        which = "another than $OPENAI_API_KEY" if bearer() else "set OPENAI_API_KEY"
        raise WorkloadError("--url", f"{url} answers {r.status_code}: it wants an API key ({which})")
    if listed is None or not listed:
        if served_model is None:
            raise WorkloadError("--url", f"{url}/v1/models lists no model; name it with --served-model")
        return Server(url, served_model, None, vocab)
    model = served_model if served_model is not None else next(iter(listed))
    if model not in listed:
        raise WorkloadError("--served-model", f"{model!r} is not served at {url} (it serves "
                                              f"{', '.join(listed)})")  # fmt: skip
    return Server(url, model, _positive(listed[model].get("max_model_len")), vocab)


def _positive(v) -> int | None:
    """``v`` where a server said a positive int, else None (it did not say, or said something else)."""
    return v if isinstance(v, int) and v > 0 else None


def _said_int(client, path: str, field: str) -> int | None:
    """A positive int field of the JSON the server answers ``GET path`` with; None where it has no such route or
    field."""
    try:
        r = client.get(path)
        v = r.json().get(field) if r.status_code == 200 else None
    except Exception:  # noqa: BLE001 (any failure: the server does not say)
        return None
    return _positive(v)


def body(request: Request, model: str, token_ids: bool = False, text: str | None = None) -> bytes:
    """The completions request for ``request`` (module doc), encoded; ``token_ids``: it asks for its output's token
    ids (``return_token_ids``: a chat's next turn repeats them); ``text``: its prompt sent as this text."""
    sp = request.sampling
    prompt = list(request.prompt) if text is None else text
    d = {"model": model, "prompt": prompt, "max_tokens": sp.max_tokens, "ignore_eos": True,
         "temperature": sp.temperature, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    if token_ids:
        d["return_token_ids"] = True
    if sp.temperature > 0:
        d.update(top_p=sp.top_p, seed=sp.seed)
        if sp.top_k > 0:
            d["top_k"] = sp.top_k
    if sp.stop_token_ids:
        d["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.logprobs is not None:
        d["logprobs"] = sp.logprobs
    if sp.prompt_logprobs is not None:  # (echo with logprobs: the prompt's tokens come with theirs)
        d["echo"] = True
    return json.dumps(d, separators=(",", ":")).encode()


def bodies(requests: list[Request], model: str, after: np.ndarray | None = None,
           texts: list[str] | None = None) -> list[bytes]:  # fmt: skip
    """Every request's body, each asking for its output's token ids where a later request (``after``) continues it
    (``texts``: the prompts sent as these texts)."""
    fed = set() if after is None else {int(a) for a in after if a >= 0}
    return [body(r, model, j in fed, None if texts is None else texts[j]) for j, r in enumerate(requests)]


def as_text(requests: list[Request], tokenizer) -> tuple[list[Request], list[str]]:
    """Each prompt as a client sends text (``--prompt-text``): its ids decoded by ``tokenizer``
    (``models.engine.text.Tokenizer``), and the requests with the ids that text encodes to, which the server prefills
    and the report counts. WorkloadError for a prompt whose text encodes to no token."""
    texts = [tokenizer.decode(r.prompt) for r in requests]
    ids = tokenizer.encode_many(texts)
    empty = next((r.request_id for r, i in zip(requests, ids, strict=True) if not i), None)
    if empty is not None:
        raise WorkloadError("--prompt-text", f"request {empty}'s prompt decodes to a text of no tokens (its ids are "
                                             "all special tokens): send token ids")  # fmt: skip
    return [attrs.evolve(r, prompt=i) for r, i in zip(requests, ids, strict=True)], texts


def sent(requests: list[Request], model: str, after: np.ndarray | None = None,
         tokenizer=None) -> tuple[list[Request], list[bytes]]:  # fmt: skip
    """The requests as they are sent (with ``tokenizer``: their prompts as text, ``as_text``) and their bodies."""
    texts = None
    if tokenizer is not None:
        requests, texts = as_text(requests, tokenizer)
    return requests, bodies(requests, model, after, texts)


def with_history(payload: bytes, history: list[int]) -> bytes:
    """A chat turn's body as it is sent: ``history`` (the previous turn's prompt and output token ids) spliced in
    before its own prompt ids."""
    head, sep, tail = payload.partition(b'"prompt":[')
    return head + sep + b"".join(b"%d," % t for t in history) + tail


# -- sending a round -----------------------------------------------------------------------------------------------
@attrs.define
class Outcome:
    """One request as the client saw it: its times (seconds) and tokens, or its error."""

    max_tokens: int
    prompt_tokens: int
    lag_s: float = 0.0  # sent this long after its arrival
    headers_s: float = math.nan  # from its send until the response's status line and headers were read
    ttft_s: float = math.nan
    e2el_s: float = math.nan
    itl_s: list[float] = attrs.Factory(list)
    output_tokens: int = 0
    error: str | None = None
    token_ids: list[int] | None = None  # the output's token ids where the server returned them (return_token_ids)

    @property
    def tpot_s(self) -> float:
        """(E2EL - TTFT) / (output tokens - 1); 0 for a request of one token (vLLM's, for goodput)."""
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


async def stream_one(client: LoadClient, payload: bytes, out: Outcome, arrival: float) -> Outcome:
    """Send one streaming completion (``arrival``: the perf_counter time it was due) and time its chunks."""
    first = last = None
    chunks, usage, done = 0, None, False
    ids: list[int] | None = None
    buf = b""
    sent = time.perf_counter()
    out.lag_s = sent - arrival
    try:
        async with client.streams.post("/v1/completions", payload) as resp:
            out.headers_s = time.perf_counter() - sent
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")
                with contextlib.suppress(ValueError, KeyError, TypeError):  # OpenAI's error object: its message
                    text = json.loads(text)["error"]["message"]
                out.error = f"HTTP {resp.status}: {' '.join(str(text).split())[:200]}"
                return out
            async for data in resp.pieces():
                now = time.perf_counter()  # every event of this read arrived by now
                *lines, buf = (buf + data).split(b"\n")
                for line in lines:
                    if done or not line.startswith(b"data:"):
                        continue  # the blank line between events, comments, event: and id: lines
                    text = line[5:].strip()
                    if text == b"[DONE]":
                        done = True
                        continue
                    if _TOKEN_CHUNK.search(text) is not None:  # most events: a token's, not worth a JSON parse
                        event, token = None, True
                    else:
                        event = json.loads(text)
                        if "error" in event:
                            err = event["error"]
                            out.error = (f"error in the stream: "
                                         f"{err.get('message', err) if isinstance(err, dict) else err}")  # fmt: skip
                            return out
                        c = (event.get("choices") or [{}])[0]
                        if c.get("token_ids") is not None:
                            ids = (ids or []) + list(c["token_ids"])
                        token = bool(event.get("choices")) and bool(c.get("text") or c.get("token_ids")
                                                                    or c.get("finish_reason") is None)  # fmt: skip
                        lp = c.get("logprobs") or {}
                        if lp.get("token_logprobs") and lp["token_logprobs"][0] is None:
                            token = False  # an echoed prompt (its first token has no logprob), not a token
                    if token:
                        if first is None:
                            first = now
                        else:
                            out.itl_s.append(now - last)
                        last = now
                        chunks += 1
                    if event is not None and event.get("usage"):
                        usage = event["usage"].get("completion_tokens")
    except (OSError, EOFError, asyncio.LimitOverrunError, HTTPError) as e:  # a refused or dropped connection, a
        # timeout (an OSError), a stream cut short (EOFError), an answer that is not HTTP
        out.error = f"{type(e).__name__}: {' '.join(str(e).split())}" if str(e) else type(e).__name__
        return out
    except (ValueError, AttributeError, TypeError) as e:  # a data: line that is not a JSON object
        out.error = f"a malformed event in the stream: {e}"
        return out
    if not done:
        out.error = "the stream ended before data: [DONE]"
    elif first is None:
        out.error = "the stream carried no token"
    else:
        out.ttft_s, out.e2el_s = first - sent, last - sent
        out.output_tokens = usage if isinstance(usage, int) else chunks
        out.token_ids = ids
    return out


async def send_round(client, payloads: list[bytes], requests: list[Request], arrival_s: np.ndarray, wait: bool,
                     progress: Callable[[], None] | None = None, after: np.ndarray | None = None,
                     think_s: np.ndarray | None = None, t0: float | None = None) -> tuple[list[Outcome], float]:
    """Send every request at its arrival (``wait``; else all at once) and wait for all: (outcomes in request order,
    wall seconds from the round's start, ``t0`` or now, until the last one ended). A chat's later turn (``after``:
    the request it continues, or -1) is sent once that one has ended plus its ``think_s`` (and not before its
    arrival), its prompt that one's prompt, the token ids it returned and its own."""
    if after is not None and (after >= 0).any():
        return await _send_chats(client, payloads, requests, arrival_s, wait, progress, after, think_s, t0)
    done_cb = (lambda _: progress()) if progress is not None else None
    tasks = []
    t0 = time.perf_counter() if t0 is None else t0
    for i, (payload, req) in enumerate(zip(payloads, requests, strict=True)):
        due = t0 + float(arrival_s[i]) if wait else t0
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        out = Outcome(req.sampling.max_tokens, len(req.prompt))
        tasks.append(asyncio.create_task(stream_one(client, payload, out, due)))
        if done_cb is not None:
            tasks[-1].add_done_callback(done_cb)
    outs = await asyncio.gather(*tasks)
    return list(outs), time.perf_counter() - t0


NO_TOKEN_IDS = ("the server returned no token ids for the turn before (return_token_ids): a chat's next turn repeats "
                "them")  # fmt: skip


async def _send_chats(client, payloads: list[bytes], requests: list[Request], arrival_s: np.ndarray, wait: bool,
                      progress: Callable[[], None] | None, after: np.ndarray, think_s: np.ndarray | None,
                      t0: float | None) -> tuple[list[Outcome], float]:  # fmt: skip
    """``send_round`` of a workload with chats: each chat a closed loop (a turn sent when the one before it ended).
    A turn after one that failed, or whose token ids the server did not return, is not sent: it fails too."""
    n = len(requests)
    think_s = np.zeros(n) if think_s is None else think_s
    nexts: dict[int, list[int]] = {}
    for k in np.flatnonzero(after >= 0):
        nexts.setdefault(int(after[k]), []).append(int(k))
    outs = [Outcome(r.sampling.max_tokens, len(r.prompt)) for r in requests]
    t0 = time.perf_counter() if t0 is None else t0

    def fail(j: int, why: str) -> None:
        outs[j].error = why
        if progress is not None:
            progress()
        for k in nexts.get(j, ()):
            fail(k, why)

    async def send(j: int, due: float, history: list[int]) -> None:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        o = outs[j]
        o.prompt_tokens = len(history) + len(requests[j].prompt)
        await stream_one(client, with_history(payloads[j], history) if history else payloads[j], o, due)
        if progress is not None:
            progress()
        later = nexts.get(j, ())
        if not later:
            return
        if o.error is not None or o.token_ids is None:
            why = (f"the turn before failed: {o.error}" if o.error is not None else NO_TOKEN_IDS)
            for k in later:
                fail(k, why)
            return
        history = [*history, *requests[j].prompt, *o.token_ids]
        end = time.perf_counter()
        await asyncio.gather(*(send(k, max(t0 + float(arrival_s[k]), end + float(think_s[k])) if wait else end,
                                    history) for k in later))  # fmt: skip

    firsts = [j for j in range(n) if after[j] < 0]
    await asyncio.gather(*(send(j, t0 + float(arrival_s[j]) if wait else t0, []) for j in firsts))
    return outs, time.perf_counter() - t0


WARM_MAX = 256  # connections a client process opens before a round at most (a burst's past them connect in its time)
KEEPALIVE_S = 2.0  # an idle connection's life in the client's pools (less than servers' keep-alive timeouts, 5 s at
# the least, so the client never sends on a connection the server is closing)


class LoadClient:
    """A client process's connections to the server: httpx for the untimed requests (the model list, /metrics), and
    for the timed streams a pool of lean HTTP/1.1 connections (``models.bench.http1``: httpx's CPU a request and a
    chunk would show in the times it measures). No cap on connections unless ``max_connections`` (then requests past
    it wait for one, in their TTFT); no proxy from the environment."""

    def __init__(self, url: str, max_connections: int | None, timeout_s: float) -> None:
        httpx = _httpx()
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                              keepalive_expiry=KEEPALIVE_S)  # fmt: skip
        self.http = httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(timeout_s), trust_env=False,
                                      headers=bearer())  # fmt: skip
        self.streams = Pool(url, max_connections, timeout_s, KEEPALIVE_S, bearer())
        self.max_connections = max_connections

    async def get(self, path: str):
        return await self.http.get(path)

    async def warm(self, arrival_s) -> None:
        """Before a round's clock: a stream connection open for each request arriving before the first ones would
        expire (``KEEPALIVE_S``; at most ``max_connections`` and ``WARM_MAX``), so that a burst's TTFTs do not count
        TCP handshakes."""
        n = min(int(np.count_nonzero(np.asarray(arrival_s) < KEEPALIVE_S)), WARM_MAX, self.max_connections or WARM_MAX)
        await self.streams.warm(n)

    async def __aenter__(self) -> LoadClient:
        await self.http.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        self.streams.close()
        await self.http.__aexit__(*exc)


UNTIMED_SEED = 2**32  # added to the seeds the untimed requests' prompts are drawn from (run_rounds says why)


@contextlib.contextmanager
def collector_paused():
    """The client's cyclic garbage collector off through a timed round, then one collection (the state before is
    restored): a collection of the oldest generation in the middle of a round took 72-80 ms in the load generator on
    the development CPU, and every chunk that arrived meanwhile would have been stamped late, in the server's TTFT and
    ITL."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
            gc.collect()


def _worker_round(url: str, max_connections: int | None, timeout_s: float, payloads: list[bytes],
                  requests: list[Request], arrival_s: list[float], t0: float, wait: bool, after: list[int] | None,
                  think_s: list[float] | None) -> tuple[list[Outcome], float, float]:  # fmt: skip
    """A client process's share of a round: its requests (whole chats, ``after`` indexing its own share) sent at
    ``t0`` (a ``time.perf_counter()`` of the parent's: the clock is the system's monotonic one, shared by every
    process) plus their arrivals. Returns the outcomes, this process's CPU seconds and when its last one ended."""

    async def go() -> list[Outcome]:
        async with LoadClient(url, max_connections, timeout_s) as client:
            await client.get("/v1/models")  # the untimed client's one-time costs, before the round's clock
            await client.warm(arrival_s)
            outs, _ = await send_round(client, payloads, requests, np.asarray(arrival_s), wait,
                                       after=None if after is None else np.asarray(after),
                                       think_s=None if think_s is None else np.asarray(think_s), t0=t0)  # fmt: skip
            return outs

    freeze_heap()  # (as the server's processes do: no collection of the start-up's objects in a stream's timing)
    cpu = time.process_time()
    with collector_paused():
        outs = asyncio.run(go())
    return outs, time.process_time() - cpu, time.perf_counter()


def send_round_procs(pool, procs: int, url: str, max_connections: int | None, timeout_s: float,
                     payloads: list[bytes], requests: list[Request], arrival_s: np.ndarray, wait: bool,
                     after: np.ndarray | None = None,
                     think_s: np.ndarray | None = None) -> tuple[list[Outcome], float, float]:  # fmt: skip
    """``send_round`` spread over ``procs`` client processes of ``pool`` (request i to process i mod procs; a chat's
    turns to the process of its first), so the client's CPU does not set the pace: (outcomes in request order, wall
    seconds from the round's start until the last one ended, the processes' CPU seconds)."""
    n = len(requests)
    chats = after is not None and bool((after >= 0).any())
    root = list(range(n))
    if chats:
        for j in range(n):  # (a turn comes after the one it continues in a chat's order, not always in the list's)
            a = j
            while after[a] >= 0:
                a = int(after[a])
            root[j] = a
    shares = [[j for j in range(n) if root[j] % procs == k] for k in range(procs)]
    t0 = time.perf_counter() + 1.0  # each process connects first
    futures = []
    for share in shares:
        local = {j: i for i, j in enumerate(share)}
        futures.append(pool.submit(
            _worker_round, url, max_connections, timeout_s, [payloads[j] for j in share],
            [requests[j] for j in share], [float(arrival_s[j]) for j in share], t0, wait,
            [local[int(after[j])] if after[j] >= 0 else -1 for j in share] if chats else None,
            [float(think_s[j]) for j in share] if chats and think_s is not None else None))  # fmt: skip
    parts = [f.result() for f in futures]
    outs: list[Outcome] = [None] * n  # type: ignore[list-item]
    for share, (part, _, _) in zip(shares, parts, strict=True):
        for j, o in zip(share, part, strict=True):
            outs[j] = o
    return outs, max(end for _, _, end in parts) - t0, sum(cpu for _, cpu, _ in parts)


def run_rounds(server: Server, rounds: list, warmup, sampling, vocab: int, seed: int, prerun: bool,
               max_connections: int | None, timeout_s: float, targets: dict[str, float],
               progress: bool = True, client_procs: int = 1, tokenizer=None) -> list[dict]:  # fmt: skip
    """The warm-up (all at once), then every round (a ``Workload``): its traffic served once untimed first
    (``prerun``), then timed, each request sent at its arrival. The timed requests are the in-process arms' (the
    same ``Workload.requests`` seeds; with ``tokenizer``, their prompts sent as text: ``as_text``); the untimed ones
    draw their prompt ids from seeds no timed round uses, so a server's prefix cache cannot serve a timed prompt from
    them. Returns each round's ``round_metrics``."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(w.n for w in rounds), unit="req", desc="traffic", file=sys.stderr)
    say = bar.write if bar is not None else print
    label = f"{server.model} at {server.url}"

    if client_procs > 1:
        return _run_rounds_procs(server, rounds, warmup, sampling, vocab, seed, prerun, max_connections, timeout_s,
                                 targets, client_procs, say, bar, tokenizer)  # fmt: skip

    async def go() -> list[dict]:
        runs = []
        async with LoadClient(server.url, max_connections, timeout_s) as client:
            await client.get("/v1/models")  # the client's first request pays its one-time costs, untimed
            if warmup.n:
                reqs, payloads = sent(warmup.requests(vocab, sampling, UNTIMED_SEED + seed + 1, "warmup-"),
                                      server.model, tokenizer=tokenizer)  # fmt: skip
                outs, _ = await send_round(client, payloads, reqs, warmup.arrival_s, wait=False)
                failed = [o.error for o in outs if o.error is not None]
                say(f"warmed up with {warmup.n} requests" + (f" ({len(failed)} failed: {failed[0]})" if failed
                                                               else ""))  # fmt: skip
            for rnd, work in enumerate(rounds):
                if prerun:
                    reqs, payloads = sent(work.requests(vocab, sampling, UNTIMED_SEED + seed + rnd, f"pre{rnd}-"),
                                          server.model, work.after, tokenizer)  # fmt: skip
                    await send_round(client, payloads, reqs, work.arrival_s, wait=True, after=work.after,
                                     think_s=work.think_s)  # fmt: skip
                # (encoded before the round's clock starts)
                reqs, payloads = sent(work.requests(vocab, sampling, seed + rnd, f"{rnd}-"), server.model, work.after,
                                      tokenizer)  # fmt: skip
                await client.warm(work.arrival_s)
                cpu, before = time.process_time(), await server_counters(client)
                with collector_paused():
                    outs, wall = await send_round(client, payloads, reqs, work.arrival_s, wait=True,
                                                  progress=(lambda: bar.update(1)) if bar is not None else None,
                                                  after=work.after, think_s=work.think_s)  # fmt: skip
                r = round_metrics(outs, wall, targets)
                r.update(label=label, round=rnd, client_cpu=(time.process_time() - cpu) / wall,
                         **server_costs(before, await server_counters(client)))  # fmt: skip
                runs.append(r)
                say(round_line(rnd, label, r))
        return runs

    try:
        with frozen_heap():  # (as each client process of a run over several is: no collection walks the caller's heap)
            return asyncio.run(go())
    finally:
        if bar is not None:
            bar.close()


SERVER_COUNTERS = ("process_cpu_seconds_total", "resplan_generation_tokens_total", "resplan_engine_decode_steps",
                   "resplan_engine_decode_step_seconds", "resplan_engine_decode_steps_beside_pass",
                   "resplan_frontend_step_lag_seconds_sum", "resplan_frontend_step_lag_seconds_count",
                   "resplan_frontend_steps_per_wakeup_sum", "resplan_frontend_steps_per_wakeup_count",
                   "resplan_engine_intake_seconds_sum", "resplan_engine_intake_seconds_count",
                   "resplan_frontend_gc_seconds", "resplan_engine_gc_seconds", "resplan_engine_prefill_passes",
                   "resplan_engine_prefill_tokens", "resplan_engine_prefill_pass_seconds",
                   "resplan_time_to_first_token_seconds_sum", "resplan_time_to_first_token_seconds_count")  # fmt: skip


async def server_counters(client) -> dict[str, float]:
    """The server's own counters (``models.server``'s /metrics: its front end's CPU time, the tokens it generated,
    its engine's decode steps, their wall time and those beside a pass, its delivery of the engine's steps); empty for a
    server without them."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = await client.get("/metrics")
        samples = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}
    except Exception:  # no /metrics, or not Prometheus text: another server, whose costs are not reported
        return {}
    return {k: samples[k] for k in SERVER_COUNTERS if k in samples}


def server_costs(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What a round cost the server (NaN where it does not say): its front end's CPU a generated token (us), its
    engine's wall time a decode step (ms), the share of its decode steps that ran beside a prefill pass, and the front
    end's delivery of the engine's steps: the mean lag from the engine's send (ms) and steps a wake-up of its reader;
    the mean intake of a request, from its arrival at the server to its submission in the engine (ms); the time
    each of its processes spent in garbage collections over the round (ms); its engine's prefill passes (prompt
    tokens a pass, wall ms a pass); and its own TTFT mean, from a request's arrival at the server to its first token
    reaching the front end (ms: the client's TTFT less what the client and the network add)."""
    nan = float("nan")
    d = {k: after[k] - before[k] for k in SERVER_COUNTERS if k in before and k in after}
    tokens, steps = d.get("resplan_generation_tokens_total", 0), d.get("resplan_engine_decode_steps", 0)
    cpu = d.get("process_cpu_seconds_total")
    passes = d.get("resplan_engine_prefill_passes", 0)
    return dict(front_cpu_us_token=cpu / tokens * 1e6 if tokens and cpu is not None else nan,
                engine_decode_step_ms=d["resplan_engine_decode_step_seconds"] / steps * 1e3 if steps else nan,
                engine_beside_share=d.get("resplan_engine_decode_steps_beside_pass", nan) / steps if steps else nan,
                front_step_lag_ms=_histogram_mean(d, "resplan_frontend_step_lag_seconds") * 1e3,
                front_steps_per_wakeup=_histogram_mean(d, "resplan_frontend_steps_per_wakeup"),
                engine_intake_ms=_histogram_mean(d, "resplan_engine_intake_seconds") * 1e3,
                front_gc_ms=d.get("resplan_frontend_gc_seconds", nan) * 1e3,
                engine_gc_ms=d.get("resplan_engine_gc_seconds", nan) * 1e3,
                engine_tokens_per_pass=d["resplan_engine_prefill_tokens"] / passes if passes else nan,
                engine_pass_ms=d["resplan_engine_prefill_pass_seconds"] / passes * 1e3 if passes else nan,
                server_ttft_mean_ms=_histogram_mean(d, "resplan_time_to_first_token_seconds") * 1e3)


def _histogram_mean(d: dict[str, float], histogram: str) -> float:
    """A histogram's mean over a round from its _sum and _count differences (NaN where the server has none)."""
    n = d.get(f"{histogram}_count", 0)
    return d[f"{histogram}_sum"] / n if n else float("nan")


def _run_rounds_procs(server: Server, rounds: list, warmup, sampling, vocab: int, seed: int, prerun: bool,
                      max_connections: int | None, timeout_s: float, targets: dict[str, float], procs: int, say,
                      bar, tokenizer=None) -> list[dict]:  # fmt: skip
    """``run_rounds`` with the requests of each round spread over ``procs`` client processes."""
    import concurrent.futures
    import multiprocessing

    runs = []
    label = f"{server.model} at {server.url}"
    send = functools.partial(send_round_procs, procs=procs, url=server.url, max_connections=max_connections,
                             timeout_s=timeout_s)  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
            if warmup.n:
                reqs, payloads = sent(warmup.requests(vocab, sampling, UNTIMED_SEED + seed + 1, "warmup-"),
                                      server.model, tokenizer=tokenizer)  # fmt: skip
                outs, _, _ = send(pool, payloads=payloads, requests=reqs, arrival_s=warmup.arrival_s, wait=False)
                failed = [o.error for o in outs if o.error is not None]
                say(f"warmed up with {warmup.n} requests over {procs} client processes" + (
                    f" ({len(failed)} failed: {failed[0]})" if failed else ""))  # fmt: skip
            for rnd, work in enumerate(rounds):
                if prerun:
                    reqs, payloads = sent(work.requests(vocab, sampling, UNTIMED_SEED + seed + rnd, f"pre{rnd}-"),
                                          server.model, work.after, tokenizer)  # fmt: skip
                    send(pool, payloads=payloads, requests=reqs, arrival_s=work.arrival_s, wait=True,
                         after=work.after, think_s=work.think_s)  # fmt: skip
                reqs, payloads = sent(work.requests(vocab, sampling, seed + rnd, f"{rnd}-"), server.model, work.after,
                                      tokenizer)  # fmt: skip
                before = asyncio.run(_counters(server.url, timeout_s))
                outs, wall, cpu = send(pool, payloads=payloads, requests=reqs, arrival_s=work.arrival_s, wait=True,
                                       after=work.after, think_s=work.think_s)  # fmt: skip
                r = round_metrics(outs, wall, targets)
                r.update(label=label, round=rnd, client_cpu=cpu / wall,
                         **server_costs(before, asyncio.run(_counters(server.url, timeout_s))))  # fmt: skip
                runs.append(r)
                if bar is not None:
                    bar.update(len(reqs))
                say(round_line(rnd, label, r))
    finally:
        if bar is not None:
            bar.close()
    return runs


async def _counters(url: str, timeout_s: float) -> dict[str, float]:
    async with LoadClient(url, None, timeout_s) as client:
        return await server_counters(client)


# -- metrics -------------------------------------------------------------------------------------------------------
DECILES = tuple(range(10, 100, 10))  # the ITL's deciles, kept in results.json: its shape around one step


def _stats(prefix: str, x: np.ndarray) -> dict:
    nan = float("nan")
    return {f"{prefix}_mean_ms": float(x.mean()) if x.size else nan,
            **{f"{prefix}_p{q}_ms": float(np.percentile(x, q)) if x.size else nan for q in (50, 90, 99)}}  # fmt: skip


def meets(o: Outcome, targets: dict[str, float]) -> bool:
    """Whether ``o`` completed and met every target (ms; module doc)."""
    if o.error is not None:
        return False
    got = {"ttft": o.ttft_s, "tpot": o.tpot_s, "itl": max(o.itl_s, default=0.0), "e2el": o.e2el_s}
    return all(got[k] * 1e3 <= ms for k, ms in targets.items())


def round_metrics(outs: list[Outcome], wall: float, targets: dict[str, float]) -> dict:
    """One timed round's metrics (module doc), with the per-request lists the plots and the tests read."""
    ok = [o for o in outs if o.error is None]
    ttft = np.array([o.ttft_s for o in ok]) * 1e3
    itl = np.array([g for o in ok for g in o.itl_s]) * 1e3
    tpot = np.array([o.tpot_s for o in ok if o.output_tokens > 1]) * 1e3
    e2el = np.array([o.e2el_s for o in ok]) * 1e3
    lag = np.array([o.lag_s for o in outs]) * 1e3
    headers = np.array([o.headers_s for o in ok]) * 1e3
    out_tokens, in_tokens = sum(o.output_tokens for o in ok), sum(o.prompt_tokens for o in ok)
    good = sum(meets(o, targets) for o in outs) if targets else None
    return dict(
        requests=len(outs), completed=len(ok), failed=len(outs) - len(ok), wall_s=wall,
        reqps=len(ok) / wall, tokps=out_tokens / wall, total_tokps=(in_tokens + out_tokens) / wall,
        output_tokens=out_tokens, prompt_tokens=in_tokens,
        short=sum(o.output_tokens < o.max_tokens for o in ok),  # fewer tokens than asked: a stop token, no ignore_eos
        goodput_reqps=good / wall if targets else float("nan"),
        goodput_frac=good / len(outs) if targets and outs else float("nan"), good=good,
        **_stats("ttft", ttft), **_stats("itl", itl), **_stats("tpot", tpot), **_stats("e2el", e2el),
        itl_ms_deciles=np.percentile(itl, DECILES).tolist() if itl.size else [],
        lag_p99_ms=float(np.percentile(lag, 99)) if lag.size else float("nan"),
        lag_max_ms=float(lag.max()) if lag.size else float("nan"),
        headers_mean_ms=float(np.nanmean(headers)) if headers.size else float("nan"),
        ttft_ms=ttft.tolist(), itl_ms=itl.tolist(), tpot_ms=tpot.tolist(), e2el_ms=e2el.tolist(),
        request_ttft_ms=[o.ttft_s * 1e3 if o.error is None else None for o in outs],
        output_lens=[o.output_tokens for o in outs], max_tokens=[o.max_tokens for o in outs],
        errors=[(i, o.error) for i, o in enumerate(outs) if o.error is not None],
    )  # fmt: skip


# -- the report ----------------------------------------------------------------------------------------------------
RUN_COLUMNS = (  # (header, key, format): median [min-max] over rounds
    ("requests", "requests", "{:.0f}"), ("failed", "failed", "{:.0f}"), ("output tok/s", "tokps", "{:.0f}"),
    ("req/s", "reqps", "{:.2f}"), ("total tok/s", "total_tokps", "{:.0f}"),
    ("goodput req/s", "goodput_reqps", "{:.2f}"), ("goodput share", "goodput_frac", "{:.1%}"),
    ("short of max_tokens", "short", "{:.0f}"), ("send lag p99 ms", "lag_p99_ms", "{:.1f}"),
    ("send lag max ms", "lag_max_ms", "{:.1f}"), ("response headers ms (mean, from the send)", "headers_mean_ms",
                                                  "{:.1f}"), ("client CPU", "client_cpu", "{:.0%}"),
    ("server front-end CPU us/token", "front_cpu_us_token", "{:.0f}"),
    ("engine decode step ms", "engine_decode_step_ms", "{:.2f}"),
    ("engine decode steps beside a pass", "engine_beside_share", "{:.0%}"),
    ("front-end step lag ms", "front_step_lag_ms", "{:.3f}"), ("steps a reader wake-up", "front_steps_per_wakeup",
                                                                "{:.2f}"),
    ("engine intake ms", "engine_intake_ms", "{:.2f}"),
    ("front-end GC ms", "front_gc_ms", "{:.1f}"), ("engine GC ms", "engine_gc_ms", "{:.1f}"),
    ("engine prompt tokens a pass", "engine_tokens_per_pass", "{:.0f}"), ("engine pass ms", "engine_pass_ms", "{:.2f}"),
    ("server TTFT mean ms (arrival to the front end)", "server_ttft_mean_ms", "{:.1f}"),
    ("prompt tokens", "prompt_tokens", "{:.0f}"),
)  # fmt: skip


def _cell(values: list[float], fmt: str) -> str:
    if all(math.isnan(v) for v in values):
        return "-"  # not measured (goodput without --goodput, a latency no request had)
    med = fmt.format(float(np.median(values)))
    if len(values) == 1:
        return med
    return f"{med} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def targets_text(targets: dict[str, float]) -> str:
    """The goodput targets as the report states them."""
    return ", ".join(f"{k.upper()} <= {v:g} ms" for k, v in targets.items()) if targets else "none (no --goodput)"


def summarize(runs: list[dict], server: Server) -> tuple[str, dict]:
    """The report's tables (throughput and goodput; latency mean and percentiles), cells median [min-max] over
    rounds, the failed requests' errors under them; and the summary as a dict."""
    head = ["server", "model", *(h for h, _, _ in RUN_COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
             "| " + " | ".join([server.url, server.model, *(_cell([r[k] for r in runs], f) for _, k, f in
                                                            RUN_COLUMNS)]) + " |", ""]  # fmt: skip
    lines += ["| latency ms | " + " | ".join(s for s, _ in STATS) + " |", "|---|" + "---|" * len(STATS)]
    summary = {k: dict(median=float(np.median(v)), min=float(min(v)), max=float(max(v)))
               for k, v in ((k, [r[k] for r in runs]) for _, k, _ in RUN_COLUMNS)}  # fmt: skip
    for name, key in LATENCIES:
        keys = [f"{key}_{s}_ms" for _, s in STATS]
        lines.append(f"| {name} | " + " | ".join(_cell([r[k] for r in runs], "{:.2f}") for k in keys) + " |")
        summary |= {k: dict(median=float(np.median(v)), min=float(min(v)), max=float(max(v)))
                    for k, v in ((k, [r[k] for r in runs]) for k in keys)}  # fmt: skip
    errors = Counter(e for r in runs for _, e in r["errors"])
    if errors:
        n = sum(errors.values())
        lines += ["", f"Failed requests ({n} over {len(runs)} round{'s' if len(runs) > 1 else ''}), by error:"]
        lines += [f"- {c} x {e}" for e, c in errors.most_common()]
    return "\n".join(lines), dict(url=server.url, model=server.model, **summary)


def round_line(rnd: int, label: str, r: dict) -> str:
    """A timed round's one line of progress."""
    good = f"  goodput {r['goodput_reqps']:.2f} req/s ({r['goodput_frac']:.0%})" if r["good"] is not None else ""
    return (f"round {rnd} {label}  {r['tokps']:7.0f} tok/s  {r['reqps']:.2f} req/s  TTFT p50/p99 "
            f"{r['ttft_p50_ms']:.1f}/{r['ttft_p99_ms']:.1f} ms  ITL p50/p99 {r['itl_p50_ms']:.2f}/"
            f"{r['itl_p99_ms']:.1f} ms  TPOT mean {r['tpot_mean_ms']:.2f} ms{good}  {r['failed']} failed")  # fmt: skip
