"""A request's response: its choices (one engine request each) read as their tokens come, and written as server-sent
events (``EventStream``, ``events``) or as one response once every choice has finished (``until_done``, ``whole``).
A choice's text goes through ``text.ChoiceText`` (incremental, stop strings); a stop string ends its engine request;
a client that disconnects has every unfinished choice aborted (``Release``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from json.encoder import encode_basestring  # a str as a JSON string, not ASCII-escaped
from typing import TYPE_CHECKING

import attrs
import numpy as np
from fastapi.responses import Response

from models.engine.requests import FinishReason
from models.server.client import RequestStream
from models.server.protocol import HTTPError, now, usage
from models.server.text import ChoiceText

if TYPE_CHECKING:
    from fastapi import Request

    from models.server.app import ServerState


@attrs.frozen(eq=False)
class Echo:
    """A completion's prompt, which its text starts with (``echo``): its text and token ids."""

    text: str
    ids: list[int]


@attrs.define(eq=False)
class Choice:
    """One choice of a request: its engine request's token stream, the text read from it so far, and whether (and
    why) it has finished."""

    index: int
    prompt_len: int
    stream: RequestStream
    text: ChoiceText
    arrived: float
    done: bool = False
    finish_reason: str | None = None
    read: int = 0  # tokens of the stream taken into ``text``
    offsets: list[int] = attrs.Factory(list)  # each token's first character in ``text`` (logprobs' text_offset)
    asked: int | None = None  # the alternatives each token's logprobs list (None: no logprobs)
    echo_only: bool = False  # its prompt alone (echo, max_tokens 0): the engine's token is left out


def _logprobs(state: ServerState, c: Choice, lo: int, hi: int, chat: bool, shift: int = 0) -> dict | None:
    """The choice's tokens lo .. hi-1 with their logprobs, in OpenAI's shape (chat's ``content`` list, or
    completions' parallel lists, each text offset + ``shift``: the echoed prompt's length); None when the request did
    not ask."""
    lps = c.stream.logprobs
    if not lps:
        return None
    k = c.asked or 0
    tok, ids = state.tokenizer, c.stream.tokens
    if chat:
        content = []
        for i in range(lo, min(hi, len(lps))):
            lp, top_ids, top_lps = lps[i]
            content.append({"token": tok.piece(ids[i]), "logprob": lp, "bytes": list(tok.piece_bytes(ids[i])),
                            "top_logprobs": [{"token": tok.piece(j), "logprob": float(v),
                                              "bytes": list(tok.piece_bytes(j))}
                                             for j, v in zip(top_ids[:k].tolist(), top_lps[:k].tolist(),
                                                             strict=True)]})  # fmt: skip
        return {"content": content}
    idx = range(lo, min(hi, len(lps)))
    return {"tokens": [tok.piece(ids[i]) for i in idx], "token_logprobs": [lps[i][0] for i in idx],
            "top_logprobs": [_top(tok, lps[i][1], lps[i][2], k) for i in idx],
            "text_offset": [c.offsets[i] + shift for i in idx]}  # fmt: skip


def _top(tok, ids, logprobs, k: int) -> dict[str, float]:
    """A position's k most likely tokens in completions' ``top_logprobs`` shape: {piece: logprob} (``ids``,
    ``logprobs``: [MAX_LOGPROBS] arrays, most likely first)."""
    return {tok.piece(j): float(v) for j, v in zip(ids[:k].tolist(), logprobs[:k].tolist(), strict=True)}


def _echo_logprobs(state: ServerState, c: Choice, echo: Echo) -> dict:
    """The echoed prompt's tokens with their logprobs in completions' parallel lists (the first token has none: null,
    as OpenAI gives it; all null where the engine gave none, a request that ended before its prompt did), each text
    offset its pieces' length before it."""
    tok, k = state.tokenizer, c.asked or 0
    pieces = [tok.piece(t) for t in echo.ids]
    offsets = np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist()
    if c.stream.prompt_logprobs is None:
        return {"tokens": pieces, "token_logprobs": [None] * len(pieces), "top_logprobs": [None] * len(pieces),
                "text_offset": offsets}  # fmt: skip
    lp, top_ids, top_lps = c.stream.prompt_logprobs
    tops = [_top(tok, i, t, k) for i, t in zip(top_ids, top_lps, strict=True)]
    return {"tokens": pieces, "token_logprobs": [None, *lp.tolist()], "top_logprobs": [None, *tops],
            "text_offset": offsets}


def _with_echo(state: ServerState, c: Choice, echo: Echo, lp: dict | None) -> dict:
    """The echoed prompt's logprobs, then ``lp``'s (the choice's tokens', shifted past the prompt's text)."""
    out = _echo_logprobs(state, c, echo)
    if lp is not None:
        for key, values in lp.items():
            out[key] += values
    return out


@attrs.define(eq=False)
class Release:
    """A response's end, taken once however it comes (its last event, the client gone, or a stream that never
    started): the server's count of active requests down, each finished choice forgotten, every other one aborted in
    the engine."""

    state: ServerState
    choices: list[Choice]
    released: bool = False

    def __attrs_post_init__(self) -> None:
        self.state.active += 1

    def __call__(self) -> None:
        if self.released:
            return
        self.released = True
        self.state.active -= 1
        for c in self.choices:
            if c.done:
                self.state.client.forget(c.stream.rid)
            else:
                self.state.client.abort(c.stream.rid)


class EventStream(Response):
    """A response of server-sent events, each written straight to the ASGI ``send`` (Starlette's streaming response
    runs a task group a response and three generator layers a chunk: the front end's CPU a token bounds a server's
    tokens/s). A task watches for the client's disconnect: it sets ``closed`` and wakes the choices, which ends the
    events. However the response ends, it is released."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], closed: asyncio.Event, choices: list[Choice],
                 release: Release) -> None:  # fmt: skip
        self.status_code, self.background = 200, None
        self.init_headers()  # (no body: no content-length, so the server sends it chunked)
        self.events, self.closed, self.choices, self.release = events, closed, choices, release

    async def __call__(self, scope, receive, send) -> None:
        watch = asyncio.ensure_future(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for event in self.events:
                await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            if not self.closed.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # (a server of ASGI 2.4 says the client is gone by raising it from send)
            pass
        finally:
            watch.cancel()
            await self.events.aclose()
            self.release()

    async def _watch(self, receive) -> None:
        """Until the client disconnects; then the events end (their next wake-up sees ``closed``)."""
        await _disconnected(receive)
        self.closed.set()
        for c in self.choices:
            c.stream.wake.set()


def _advance(state: ServerState, c: Choice) -> str:
    """Take the choice's new tokens into its text; returns the text they release. Marks the choice done when the
    engine finished it or a stop string did (then aborting it in the engine)."""
    s = c.stream
    if c.echo_only:  # (its prompt alone: done once the engine has scored it, its token left out)
        if s.finish in ("rejected", "failed"):
            raise HTTPError(400 if s.finish == "rejected" else 500, s.error or "the engine failed", s.error_field)
        if s.tokens or s.finish is not None:
            _done(state, c, FinishReason.LENGTH.value)
            if s.finish is None:
                state.client.abort(s.rid)
        return ""
    out = []
    while c.read < len(s.tokens) and not c.text.stopped:
        c.offsets.append(c.text.length)
        out.append(c.text.push(s.tokens[c.read]))
        c.read += 1
    if c.text.stopped:
        _done(state, c, FinishReason.STOP.value)
        state.client.abort(s.rid)  # the engine may still be generating it
    elif s.finish is not None and c.read == len(s.tokens):
        if s.finish in ("rejected", "failed"):
            raise HTTPError(400 if s.finish == "rejected" else 500, s.error or "the engine failed", s.error_field)
        out.append(c.text.flush())
        _done(state, c, s.finish)
    return "".join(out)


def _done(state: ServerState, c: Choice, reason: str) -> None:
    """The choice has finished (once): its reason, and its latencies and counts in the metrics."""
    if not c.done:
        c.done, c.finish_reason = True, reason
        state.metrics.request_done(c.arrived, c.stream.token_times[: c.text.tokens], c.prompt_len, reason)


async def _wait_any(choices: list[Choice]) -> None:
    """Until one of the unfinished choices has news."""
    if len(choices) == 1:  # (most requests: one choice, waited on as it is)
        if not choices[0].done:
            await choices[0].stream.wake.wait()
        return
    pending = [c for c in choices if not c.done]
    if any(c.stream.wake.is_set() for c in pending):
        return
    if len(pending) == 1:  # (the others done: waited on without a task a wake-up)
        await pending[0].stream.wake.wait()
        return
    waits = [asyncio.ensure_future(c.stream.wake.wait()) for c in pending]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def until_done(state: ServerState, choices: list[Choice], request: Request) -> None:
    """Every choice finished; returns early (choices unfinished) if the client disconnects."""
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        while not all(c.done for c in choices):
            waiter = asyncio.ensure_future(_wait_any(choices))
            await asyncio.wait([waiter, gone], return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                waiter.cancel()
                return
            for c in choices:
                c.stream.wake.clear()
                if not c.done:
                    _advance(state, c)
    finally:
        gone.cancel()


async def _disconnected(receive) -> None:
    """Returns when the client has gone away (``receive``: the request's ASGI receive)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


def _usage(choices: list[Choice], prompts_counted: list[int]) -> dict:
    return usage(sum(prompts_counted), sum(c.text.tokens for c in choices))


def _prompt_tokens(choices: list[Choice], n: int) -> list[int]:
    """Each prompt's length, once (``n`` choices share a prompt)."""
    return [c.prompt_len for c in choices[::n]]


def whole(state: ServerState, rid: str, choices: list[Choice], chat: bool, echo: list[Echo] | None, n: int,
           token_ids: bool = False) -> dict:  # fmt: skip
    """The response of a request that did not stream."""
    out = []
    for c in choices:
        text, e = c.text.text, None if echo is None else echo[c.index // n]
        lp = _logprobs(state, c, 0, c.text.tokens, chat, 0 if e is None else len(e.text))
        if e is not None:
            text = e.text + text
            if c.asked is not None:
                lp = _with_echo(state, c, e, lp)
        if chat:
            out.append({"index": c.index, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                        "finish_reason": c.finish_reason})  # fmt: skip
        else:
            out.append({"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish_reason})
            if token_ids:
                out[-1]["token_ids"] = list(c.stream.tokens[: c.text.tokens])
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": now(),
            "model": state.model, "choices": out, "usage": _usage(choices, _prompt_tokens(choices, n))}  # fmt: skip


_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode  # (json.dumps builds one a call)


def _sse(obj: dict) -> str:
    return f"data: {_to_json(obj)}\n\n"


async def events(state: ServerState, rid: str, choices: list[Choice], chat: bool, echo: list[Echo] | None, n: int,
                  include_usage: bool, closed: asyncio.Event, token_ids: bool = False,
                  continuous_usage: bool = False) -> AsyncIterator[str]:  # fmt: skip
    """The response as server-sent events: one chunk per choice per wake-up with new text, a chunk with each choice's
    finish reason, then (``include_usage``) the usage, then ``[DONE]``; nothing more once ``closed`` (the client went
    away). With ``continuous_usage`` (vLLM's ``continuous_usage_stats``) every chunk carries the usage so far. With
    ``token_ids`` every chunk of a choice carries the ids of the tokens it released (its ``token_ids``; a chunk goes out
    for tokens that released no text yet), so the chunks' ids concatenate to the choice's tokens. A request the engine
    refused or lost (it failed) ends in an event of OpenAI's error object, then ``[DONE]``."""
    created, obj = now(), "chat.completion.chunk" if chat else "text_completion"
    extra = {"usage": None} if include_usage else {}
    prompt_lens = _prompt_tokens(choices, n)

    def usage_now() -> dict:  # a chunk's usage: null, or (continuous_usage) the tokens so far
        return {"usage": _usage(choices, prompt_lens)} if continuous_usage else extra

    # a text chunk without logprobs, the common one, is this frame around its JSON-quoted text (the quoting of a
    # string a chunk, not a dump of the whole object: the front end's CPU a token is what bounds a server's tokens/s)
    frame = _sse({"id": rid, "object": obj, "created": created, "model": state.model, "choices": [
        {"index": -1, "delta": {"content": "\0"}, "logprobs": None, "finish_reason": None} if chat else
        {"index": -1, "text": "\0", "logprobs": None, "finish_reason": None}], **extra})  # fmt: skip
    head, tail = frame.split('"\\u0000"')
    heads = {c.index: head.replace('"index":-1', f'"index":{c.index}') for c in choices}

    def chunk(c: Choice, text: str | None, finish: str | None, lp: dict | None = None, ids: list | None = None) -> str:
        if text and finish is None and lp is None and ids is None and not continuous_usage:
            return heads[c.index] + encode_basestring(text) + tail  # (json.dumps' quoting, 0.07 us against 0.7)
        if chat:
            delta = {} if text is None else {"content": text}
            body = {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            body = {"index": c.index, "text": text or "", "logprobs": lp, "finish_reason": finish}
            if ids is not None:
                body["token_ids"] = ids
        return _sse({"id": rid, "object": obj, "created": created, "model": state.model, "choices": [body],
                     **usage_now()})  # fmt: skip

    for c in choices:
        if chat:
            yield _sse({"id": rid, "object": obj, "created": created, "model": state.model, "choices": [
                {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}], **usage_now()})  # fmt: skip
        elif echo is not None and c.asked is None:
            yield chunk(c, echo[c.index // n].text, None)
    unechoed = {c.index for c in choices} if echo is not None and choices[0].asked is not None else set()
    while not all(c.done for c in choices):
        await _wait_any(choices)
        if closed.is_set():
            return
        for c in choices:
            if c.done:
                continue
            c.stream.wake.clear()
            if c.index in unechoed and c.stream.prompt_logprobs is not None:  # (they come with its first token)
                unechoed.discard(c.index)
                yield chunk(c, echo[c.index // n].text, None, _echo_logprobs(state, c, echo[c.index // n]))
            lo = c.text.tokens
            try:
                text = _advance(state, c)
            except HTTPError as e:  # (the status went out with the first chunk: the error is the stream's last event)
                yield _sse(e.body())
                yield "data: [DONE]\n\n"
                return
            shift = len(echo[c.index // n].text) if echo is not None else 0
            lp = _logprobs(state, c, lo, c.text.tokens, chat, shift) if c.text.tokens > lo else None
            ids = list(c.stream.tokens[lo : c.text.tokens]) if token_ids else None
            if text or lp is not None or ids:
                yield chunk(c, text, None, lp, ids)
            if c.done:
                yield chunk(c, None, c.finish_reason, ids=[] if token_ids else None)
    if include_usage:
        yield _sse({"id": rid, "object": obj, "created": created, "model": state.model, "choices": [],
                    "usage": _usage(choices, prompt_lens)})  # fmt: skip
    yield "data: [DONE]\n\n"
