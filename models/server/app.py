"""The HTTP front end: FastAPI routes in OpenAI's shapes over an ``EngineClient``.

The front end tokenizes prompts (or a chat's messages through the checkpoint's template), checks every field before
the engine sees a request (a 400 in OpenAI's error object naming the field; the engine and every other request go on
undisturbed), sends one engine request per prompt and choice (``n``), and answers with the response ``responses``
writes from the tokens that come back (server-sent events or one response). Beyond ``max_waiting`` requests not yet
started, or once shutdown has begun, requests are answered 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import time
import uuid

import attrs
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError

from models.engine.requests import MAX_LOGPROBS
from models.engine.text import Tokenizer, TokenizerError
from models.server.client import EngineClient, EngineFailed
from models.server.heap import CollectorClock
from models.server.metrics import Metrics, merged
from models.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    HTTPError,
    SamplingFields,
    StreamOptions,
    TokenizeRequest,
    error_body,
    now,
    unsupported,
)
from models.server.responses import Choice, Echo, EventStream, Release, events, until_done, whole
from models.server.text import ChoiceText
from models.server.tokenizer_queue import TokenizerQueue

PROMPT_FORMS = "must be a string, a list of strings, a list of token ids or a list of lists of token ids"
PEER_METRICS_TIMEOUT_S = 5.0  # another front end's /metrics?scope=front-end
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the rest of the context


@attrs.frozen
class AudioFront:
    """What the front end needs of a Whisper checkpoint to turn a WAV upload into an engine request."""

    extractor: object  # transformers' WhisperFeatureExtractor with the checkpoint's settings
    n_frames: int  # mel frames the encoder reads
    generation: dict  # generation_config.json: the language and task tokens
    decoder_start: int
    languages: dict[int, str] = attrs.Factory(dict)  # a multilingual checkpoint's language tokens (audio.languages)

    @classmethod
    def of(cls, model_dir) -> AudioFront | None:
        """A Whisper directory's, or None for a text model."""
        from models.engine.audio import feature_extractor, languages
        from models.engine.checkpoint import WHISPER, read_checkpoint

        ckpt = read_checkpoint(model_dir)
        if ckpt.architecture != WHISPER:
            return None
        cfg = ckpt.config
        return cls(feature_extractor(model_dir, cfg.num_mel_bins), cfg.n_frames, ckpt.generation,
                   cfg.decoder_start_token_id, languages(ckpt.generation))  # fmt: skip


@attrs.define
class ServerState:
    client: EngineClient
    tokenizer: Tokenizer
    model: str  # the served model's name (its directory's)
    max_waiting: int
    audio: AudioFront | None = None  # a Whisper checkpoint's: the server transcribes
    draining: bool = False
    ready: bool = True  # False while the server warms itself up: /health answers 503 until it says "ready"
    active: int = 0  # HTTP generation requests being served
    metrics: Metrics | None = None
    max_audio_mb: float = 25.0  # a transcription's upload at most (OpenAI's and vLLM's 25 MB)
    peer_ports: list[int] = attrs.Factory(list)  # the other front ends' loopback ports (--front-ends): their metrics
    prompts: TokenizerQueue = attrs.field(init=False)  # text prompts' ids, off the loop
    collector: CollectorClock = attrs.field(init=False)  # this process's garbage collections

    def __attrs_post_init__(self) -> None:
        self.prompts = TokenizerQueue(self.tokenizer)
        self.collector = CollectorClock()

    def start_metrics(self) -> None:
        """Metrics from now on (a new registry): the server's own warm-up requests are not counted."""
        self.metrics = Metrics(lambda: self.client.load, self.collector)
        self.client.on_delivery = self.metrics.delivered


def asgi_app(state: ServerState, api_key: str | None = None):
    """The ASGI app a front end serves: the routes (``build_app``), each POST's intake started one a turn of the loop
    (``turns.TakingTurns``), behind ``api_key`` where one is given (``auth.KeyCheck``)."""
    from models.server.auth import KeyCheck
    from models.server.turns import TakingTurns

    app = TakingTurns(build_app(state), idle=lambda: not state.client.streams)
    return app if api_key is None else KeyCheck(app, api_key)


def build_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        reader = asyncio.get_running_loop().create_task(state.client.run_reader())
        yield
        reader.cancel()

    app = FastAPI(title="resplan", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.server = state
    state.start_metrics()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        msg = err.get("msg", "invalid request")
        if err.get("type") == "json_invalid":
            msg, param = f"the body is not valid JSON: {err.get('ctx', {}).get('error', msg)}", None
        elif loc[:1] == ["prompt"] and len(loc) > 1:  # (pydantic names the union's first member in loc)
            msg, param = PROMPT_FORMS, "prompt"
        return JSONResponse(error_body(f"{param}: {msg}" if param else msg, param), status_code=400)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.get("/health")
    async def health():
        if state.client.failed is not None:
            return JSONResponse(error_body("the engine failed", code=503, kind="server_error"), status_code=503)
        return Response(status_code=503 if state.draining or not state.ready else 200)

    def card() -> dict:
        return {"id": state.model, "object": "model", "created": now(), "owned_by": "resplan",
                "max_model_len": state.client.served.max_seq_len}  # fmt: skip

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):  # (OpenAI's retrieve: client.models.retrieve)
        _check_model(state, model)
        return card()

    @app.get("/metrics")
    async def metrics(scope: str = "server"):
        """Every front end's metrics summed (``metrics.merged``); ``?scope=front-end``: this process's alone."""
        own = state.metrics.exposition()
        if scope == "front-end" or not state.peer_ports:
            return PlainTextResponse(own, media_type="text/plain; version=0.0.4")
        theirs = await asyncio.gather(*(_front_end_metrics(p) for p in state.peer_ports))
        return PlainTextResponse(merged([own.decode(), *theirs]), media_type="text/plain; version=0.0.4")

    async def completions(request: Request):
        arrived = time.perf_counter()  # (its headers in; its body not yet read)
        body = await _parsed(request, CompletionRequest)
        _check(state, body)
        prompts = await _completion_prompts(state, body.prompt)
        return await _serve(state, body, prompts, request, chat=False, arrived=arrived)

    async def chat_completions(request: Request):
        arrived = time.perf_counter()
        body = await _parsed(request, ChatCompletionRequest)
        _check(state, body)
        ids = await _chat_ids(state, body.messages)
        return await _serve(state, body, [ids], request, chat=True, arrived=arrived)

    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])

    # vLLM's tokenizer endpoints (an eval harness's "remote" tokenizer: lm-eval's tokenizer_backend=remote)
    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await _parsed(request, TokenizeRequest)
        _check_model(state, body.model)
        if (body.prompt is None) == (body.messages is None):
            raise HTTPError(400, "give a prompt (text) or messages, one of the two", "prompt")
        if body.prompt is not None:
            ids = (await state.prompts.encode([body.prompt], special=body.add_special_tokens))[0]
        else:
            ids = await _chat_ids(state, body.messages)
        return {"count": len(ids), "max_model_len": state.client.served.max_seq_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await _parsed(request, DetokenizeRequest)
        _check_model(state, body.model)
        vocab = state.client.served.vocab_size
        bad = _outside_vocabulary(body.tokens, vocab)
        if bad is not None:
            raise HTTPError(400, f"token {bad} is outside the vocabulary [0, {vocab})", "tokens")
        return {"prompt": state.tokenizer.decode(body.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        hf = state.tokenizer.hf
        return {"tokenizer_class": type(hf).__name__, "eos_token": hf.eos_token, "bos_token": hf.bos_token,
                "pad_token": hf.pad_token, "chat_template": getattr(hf, "chat_template", None),
                "model_max_length": state.client.served.max_seq_len,
                "vocab_size": state.client.served.vocab_size}  # fmt: skip  (the token ids a prompt may hold)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await _transcribe(state, request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await _transcribe(state, request, "translate")

    return app


async def _transcribe(state: ServerState, request: Request, task: str) -> Response:
    """OpenAI's transcription endpoint (``task`` transcribe; translate: its translation endpoint, into English, the
    spoken language given or detected as here): a multipart form with ``file`` (a PCM WAV file, resampled to 16 kHz),
    ``language`` (default: detected on the first window, ``_spoken_language``), ``prompt`` (a text every window is
    conditioned on, ``audio.previous_ids``), ``temperature`` (default 0) and ``response_format`` (json, text,
    verbose_json, srt or vtt; the segments and cues are the windows); the text the model decodes until its end token or
    its context, of each of the encoder's windows the audio is cut into (``audio.windows``: all sent at once),
    joined."""
    from models.engine.audio import (
        SAMPLE_RATE,
        AudioError,
        decode_wav,
        decoder_prompt,
        log_mel,
        previous_ids,
        windows,
    )

    audio = state.audio
    if audio is None:
        raise HTTPError(404, f"{state.model} is a text model: use /v1/completions or /v1/chat/completions")
    if task != "transcribe" and not audio.languages:  # (before its upload is read)
        raise HTTPError(400, f"{state.model} is English-only (no language tokens): it transcribes, it does not "
                             "translate")  # fmt: skip
    if state.draining:
        raise HTTPError(503, "the server is shutting down", headers={"Retry-After": "5"})
    try:
        form = await request.form()
    except Exception as e:  # the multipart parser's own errors
        raise HTTPError(400, f"the body is not a multipart form: {e}") from None
    arrived = time.perf_counter()  # (its body parsed; its audio not yet decoded)
    upload, fmt = form.get("file"), form.get("response_format", "json")
    if upload is None or isinstance(upload, str):
        raise HTTPError(400, "file: a WAV file is required (multipart field 'file')", "file")
    _check_model(state, form.get("model"))
    if fmt not in AUDIO_FORMATS:
        raise HTTPError(400, f"response_format {fmt!r}: one of {', '.join(AUDIO_FORMATS)}", "response_format")
    _refuse_unsupported_form(form)
    try:
        temperature = float(form.get("temperature", 0.0))
    except ValueError:
        raise HTTPError(400, f"temperature {form.get('temperature')!r} is not a number", "temperature") from None
    if not 0 <= temperature <= 2:
        raise HTTPError(400, f"temperature must be in [0, 2], got {temperature}", "temperature")
    language = form.get("language") or None
    if upload.size is not None and upload.size > state.max_audio_mb * 1e6:
        raise HTTPError(413, f"file: {upload.size / 1e6:.1f} MB; this server takes uploads of at most "
                             f"{state.max_audio_mb:g} MB (--max-audio-mb)", "file")  # fmt: skip
    data = await upload.read()

    def features_of(name: str) -> tuple:  # (wave, its windows, their features): resampled and cut off the loop
        wave = decode_wav(io.BytesIO(data), name)
        pieces = windows(wave, audio.n_frames * audio.extractor.hop_length)
        return wave, pieces, [log_mel(p, audio.extractor, audio.n_frames) for _, p in pieces]

    try:
        wave, pieces, features = await asyncio.to_thread(features_of, upload.filename or "file")
    except AudioError as e:
        raise HTTPError(400, str(e), "file") from None
    if language is None:
        language = await _spoken_language(state, features[0], arrived) if audio.languages else "en"
    try:
        prompt = decoder_prompt(audio.generation, audio.decoder_start, language, task, False)
    except AudioError as e:
        raise HTTPError(400, str(e), "language") from None
    context = state.client.served.max_seq_len
    previous = previous_ids(state.tokenizer, form.get("prompt") or "", context)
    if previous:  # (a text to condition on: after <|startofprev|>, before the start token)
        try:
            prompt = decoder_prompt(audio.generation, audio.decoder_start, language, task, False, previous)
        except AudioError as e:
            raise HTTPError(400, str(e), "prompt") from None
    sampling = dict(max_tokens=context - len(prompt), temperature=temperature, top_p=1.0, top_k=0,
                    seed=random.randrange(2**31), stop_token_ids=[], ignore_eos=False)  # fmt: skip
    rid = f"trsc-{uuid.uuid4().hex}"
    choices = []
    try:
        for i, f in enumerate(features):
            stream = state.client.add(f"{rid}-{i}", prompt, sampling, f, arrived=arrived)
            choices.append(Choice(i, len(prompt), stream, ChoiceText(state.tokenizer, []), arrived))
    except EngineFailed:
        raise _engine_failed() from None
    release = Release(state, choices)
    try:
        await until_done(state, choices, request)
    finally:
        release()
    texts = [c.text.text.strip() for c in choices]
    text = " ".join(t for t in texts if t)
    spans = [(start / SAMPLE_RATE, (start + p.size) / SAMPLE_RATE) for start, p in pieces]  # each window's, seconds
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt in ("srt", "vtt"):
        return PlainTextResponse(subtitles(spans, texts, fmt))
    if fmt == "verbose_json":
        segments = [{"id": i, "start": a, "end": b, "text": t, "tokens": list(c.stream.tokens[: c.text.tokens])}
                    for i, ((a, b), t, c) in enumerate(zip(spans, texts, choices, strict=True))]  # fmt: skip
        return JSONResponse({"task": task, "language": language, "duration": wave.size / SAMPLE_RATE,
                             "text": text, "segments": segments})  # fmt: skip
    return JSONResponse({"text": text})


AUDIO_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
AUDIO_FIELDS = ("file", "model", "response_format", "temperature", "language", "prompt")
AUDIO_UNSUPPORTED = {"stream": "a transcription is answered whole, not streamed",
                     "timestamp_granularities[]": "only segment timestamps are given (verbose_json's segments are its "
                                                  "windows), not word ones"}  # fmt: skip
# values that ask for nothing more than the server gives (its segments are the windows, with their spans)
AUDIO_NEUTRAL = {"stream": ("false", "False", "0"), "timestamp_granularities[]": ("segment",)}


def subtitles(spans: list[tuple[float, float]], texts: list[str], fmt: str) -> str:
    """SubRip (``srt``) or WebVTT (``vtt``) cues: one a window with text, its span (start, end seconds) and text."""

    def stamp(t: float) -> str:
        ms = round(t * 1000)
        h, m, s = ms // 3_600_000, ms // 60_000 % 60, ms // 1000 % 60
        return f"{h:02d}:{m:02d}:{s:02d}{',' if fmt == 'srt' else '.'}{ms % 1000:03d}"

    cues = [f"{stamp(a)} --> {stamp(b)}\n{t}\n" for (a, b), t in zip(spans, texts, strict=True) if t]
    if fmt == "srt":
        return "\n".join(f"{i}\n{c}" for i, c in enumerate(cues, 1))
    return "WEBVTT\n\n" + "\n".join(cues)


def _refuse_unsupported_form(form) -> None:
    """A transcription's form field this server cannot honour is refused by name, never ignored (a value that asks
    for nothing more, ``AUDIO_NEUTRAL``, is taken)."""
    for name in form:
        if name in AUDIO_FIELDS or all(v in AUDIO_NEUTRAL.get(name, ()) for v in form.getlist(name)):
            continue
        why = AUDIO_UNSUPPORTED.get(name, f"not a field of this endpoint (it takes {', '.join(AUDIO_FIELDS)})")
        raise HTTPError(400, f"{name}: {why}", name)


async def _spoken_language(state: ServerState, features, arrived: float) -> str:
    """A window's spoken language, as Whisper detects it: the most likely language token after the start token
    (``audio.detected``, among the 5 alternatives the sampler gives); en where the model names none."""
    from models.engine.audio import detected, detection_prompt

    audio, rid = state.audio, f"lang-{uuid.uuid4().hex}"
    sampling = dict(max_tokens=1, temperature=0.0, top_p=1.0, top_k=0, seed=0, stop_token_ids=[], ignore_eos=True,
                    logprobs=MAX_LOGPROBS)  # fmt: skip
    try:
        stream = state.client.add(rid, detection_prompt(audio.generation, audio.decoder_start), sampling, features,
                                  arrived=arrived)  # fmt: skip
    except EngineFailed:
        raise _engine_failed() from None
    try:
        while stream.finish is None:
            await stream.wake.wait()
            stream.wake.clear()
    finally:  # (its one token drawn, or the request cancelled meanwhile)
        if stream.finish is None:
            state.client.abort(rid)
        else:
            state.client.forget(rid)
    if stream.finish in ("rejected", "failed"):
        raise HTTPError(400 if stream.finish == "rejected" else 500, stream.error or "the engine failed", "file")
    if not stream.logprobs:
        return "en"
    _, ids, lps = stream.logprobs[0]
    return detected(list(zip(ids.tolist(), lps.tolist(), strict=True)), audio.languages) or "en"


async def _parsed(request: Request, model: type[SamplingFields]) -> SamplingFields:
    """The request's JSON body as ``model``, parsed and validated in one pass by pydantic's JSON parser (13 us for 512
    token ids, where FastAPI's json.loads then validation took 34); a RequestValidationError as FastAPI raises it. As
    FastAPI's strict content type: a body is JSON only when its Content-Type says so (application/json or
    application/*+json), so that a browser's cross-site "simple" request (text/plain, a form) is not taken."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        raise HTTPError(400, f"the body must be JSON, sent with Content-Type: application/json (got "
                             f"{kind or 'no Content-Type'})")  # fmt: skip
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


async def _front_end_metrics(port: int) -> str:
    """Another front end's own metrics, read over its loopback port (the connection closed whatever happens)."""
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics?scope=front-end HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = await asyncio.wait_for(reader.read(-1), PEER_METRICS_TIMEOUT_S)
    except (TimeoutError, OSError) as e:
        raise HTTPError(503, f"a front end (port {port}) did not give its metrics: {e!r}") from None
    finally:
        if writer is not None:
            writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if not status.startswith("HTTP/1.1 200"):
        raise HTTPError(503, f"a front end (port {port}) did not give its metrics: {status}")
    return body.decode()


def _engine_failed() -> HTTPError:
    """The 503 every request gets once the engine has failed."""
    return HTTPError(503, "the engine failed; the server cannot serve", headers={"Retry-After": "60"})


def _outside_vocabulary(ids: list[int], vocab: int) -> int | None:
    """The first of ``ids`` outside [0, vocab), or None (a min and a max first: the usual prompt is all inside)."""
    if min(ids, default=0) >= 0 and max(ids, default=0) < vocab:
        return None
    return next(t for t in ids if not 0 <= t < vocab)


def _check_model(state: ServerState, model: str | None) -> None:
    """A request naming a model names this server's (404 otherwise)."""
    if model is not None and model != state.model:
        raise HTTPError(404, f"the model {model!r} does not exist; this server serves {state.model!r}", "model")


async def _chat_ids(state: ServerState, messages) -> list[int]:
    """Chat messages' ids through the checkpoint's chat template, ready for the reply (encoded off the loop); 400
    naming ``messages`` where there is no template or it refuses them."""
    plain = [_message(m, i) for i, m in enumerate(messages)]
    try:
        text = state.tokenizer.chat_text(plain)
    except TokenizerError as e:
        raise HTTPError(400, str(e), "messages") from None
    except Exception as e:  # the template's own checks (a role it does not take, a raise_exception)
        raise HTTPError(400, f"the chat template refused the messages: {e}", "messages") from None
    return (await state.prompts.encode([text], special=False))[0]


def _check(state: ServerState, body: SamplingFields) -> None:
    """Refuse what no prompt can fix: shutdown, a model this server does not serve, an unsupported field."""
    if state.draining:
        raise HTTPError(503, "the server is shutting down", headers={"Retry-After": "5"})
    if state.client.failed is not None:
        raise _engine_failed()
    if state.audio is not None:
        raise HTTPError(404, f"{state.model} is a speech recognition model: use /v1/audio/transcriptions")
    _check_model(state, body.model)
    bad = unsupported(body)
    if bad is not None:
        raise HTTPError(400, bad[1], bad[0])


def _message(m, i: int) -> dict:
    """A chat message as the template takes it: text content (a string, or its text parts joined)."""
    content = m.content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise HTTPError(400, f"content part of type {part.get('type')!r}: this server takes text parts only",
                                f"messages.{i}.content.{j}")  # fmt: skip
            parts.append(part["text"])
        content = "".join(parts)
    role = "system" if m.role == "developer" else m.role
    return {"role": role, "content": content or ""}


async def _completion_prompts(state: ServerState, prompt) -> list[list[int]]:
    """The prompts of a completion request, as token ids: a string, strings (encoded off the loop), token ids, or
    lists of token ids (a list validated by CompletionRequest holds one kind, so its first element says which)."""
    prompts = [prompt] if isinstance(prompt, str) or prompt and isinstance(prompt[0], int) else list(prompt)
    if not prompts:
        raise HTTPError(400, "prompt: no prompt given", "prompt")
    if isinstance(prompts[0], str):
        prompts = await state.prompts.encode(prompts)
    vocab = state.client.served.vocab_size
    for i, ids in enumerate(prompts):
        if not ids:
            raise HTTPError(400, f"prompt {i} is empty (no tokens)", "prompt")
        bad = _outside_vocabulary(ids, vocab)
        if bad is not None:
            raise HTTPError(400, f"prompt {i}: token {bad} is outside the vocabulary [0, {vocab})", "prompt")
    return prompts


def _sampling(state: ServerState, body: SamplingFields, prompt_len: int, chat: bool, index: int) -> dict:
    """The engine's sampling fields for one choice; HTTPError for a length that does not fit the context."""
    served = state.client.served
    gen = served.generation
    context = served.max_seq_len
    param = "messages" if chat else "prompt"
    if prompt_len >= context:
        raise HTTPError(400, f"the prompt is {prompt_len} tokens; the context is {context} tokens, which must also "
                             "hold at least one generated token", param)  # fmt: skip
    max_tokens = body.max_completion_tokens if chat and body.max_completion_tokens is not None else body.max_tokens
    which = "max_completion_tokens" if chat and body.max_completion_tokens is not None else "max_tokens"
    if max_tokens is None:
        max_tokens = context - prompt_len if chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, context - prompt_len)
    echo_only = _echo_only(body, chat)
    if max_tokens < 1 and not echo_only:
        raise HTTPError(400, f"{which} must be at least 1, got {max_tokens}"
                             + ("" if chat else " (0 only with echo: the prompt alone)"), which)  # fmt: skip
    max_tokens = max(max_tokens, 1)  # (echo only: the engine draws one token, which the response leaves out)
    if prompt_len + max_tokens > context:
        raise HTTPError(400, f"the context is {context} tokens, but the prompt is {prompt_len} tokens and "
                             f"{which} asks for {max_tokens} more", which)  # fmt: skip
    if body.min_tokens > max_tokens:
        raise HTTPError(400, f"min_tokens ({body.min_tokens}) is more than {which} ({max_tokens})", "min_tokens")
    logprobs = _logprobs_asked(body, chat)
    prompt_logprobs = logprobs if not chat and body.echo else None  # (echo's prompt tokens come with theirs)
    temperature = body.temperature if body.temperature is not None else float(gen.get("temperature", 1.0))
    top_p = body.top_p if body.top_p is not None else float(gen.get("top_p", 1.0))
    top_k = body.top_k if body.top_k is not None else int(gen.get("top_k", 0) or 0)
    seed = body.seed + index if body.seed is not None else random.randrange(2**31)
    return dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=max(top_k, 0), seed=seed,
                stop_token_ids=list(body.stop_token_ids or ()), ignore_eos=body.ignore_eos, logprobs=logprobs,
                min_tokens=body.min_tokens, prompt_logprobs=prompt_logprobs)


def _echo_only(body: SamplingFields, chat: bool) -> bool:
    """A completion asking for its prompt back and no tokens (``echo`` with ``max_tokens: 0``: what an eval harness
    sends to score a text by its prompt logprobs)."""
    return not chat and body.echo and body.max_tokens == 0


def _logprobs_asked(body: SamplingFields, chat: bool) -> int | None:
    """The engine's ``logprobs`` (alternatives a token comes with, or None) for completions' ``logprobs: k`` or
    chat's ``logprobs: true`` with ``top_logprobs: k``."""
    if not chat:
        return body.logprobs
    if body.top_logprobs is not None and not body.logprobs:
        raise HTTPError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


async def _serve(state: ServerState, body: SamplingFields, prompts: list[list[int]], request: Request,
                 chat: bool, arrived: float) -> Response:  # fmt: skip
    """Send every choice to the engine and answer with its stream of events or its whole response (``arrived``: the
    request's arrival, perf_counter seconds, where its latencies start)."""
    client = state.client
    if client.load.waiting >= state.max_waiting:
        raise HTTPError(503, f"{client.load.waiting} requests are waiting for the engine (--max-waiting "
                             f"{state.max_waiting}); retry later", headers={"Retry-After": "1"})  # fmt: skip
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    n = body.n
    settings = [_sampling(state, body, len(p), chat, j) for p in prompts for j in range(n)]  # (all checked first)
    stops = body.stops()
    choices = []
    try:
        for i, (p, sp) in enumerate(zip((p for p in prompts for _ in range(n)), settings, strict=True)):
            stream = client.add(f"{rid}-{i}", p, sp, arrived=arrived)
            choices.append(Choice(i, len(p), stream, ChoiceText(state.tokenizer, stops), arrived,
                                  asked=sp["logprobs"], echo_only=_echo_only(body, chat)))  # fmt: skip
    except EngineFailed:
        raise _engine_failed() from None
    echo = [Echo(state.tokenizer.decode(p), p) for p in prompts] if not chat and body.echo else None
    release = Release(state, choices)
    if body.stream:
        options = body.stream_options or StreamOptions()
        closed = asyncio.Event()
        return EventStream(events(state, rid, choices, chat, echo, n, options.include_usage, closed, _token_ids(body),
                                  options.include_usage and options.continuous_usage_stats),
                           closed, choices, release)  # fmt: skip
    try:
        await until_done(state, choices, request)
    finally:
        release()
    return JSONResponse(whole(state, rid, choices, chat, echo, n, _token_ids(body)))


def _token_ids(body: SamplingFields) -> bool:
    """Whether each choice carries its tokens' ids (completions' ``return_token_ids``, vLLM's: a client that builds
    its next prompt from a reply, a chat's next turn, needs the exact ids, which re-tokenizing the text need not
    give)."""
    return bool(getattr(body, "return_token_ids", False))


