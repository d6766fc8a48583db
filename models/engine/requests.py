"""What a client submits (a Request with its SamplingParams), what it gets back (a Result), and the checks a request
passes at submission. Bad input is refused there, with a message naming the field, and never reaches a step."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np

from resplan.layout import BANNED_STOPS

if TYPE_CHECKING:
    import torch

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
CANDIDATES = 256  # tokens a sampled row can draw from (models.engine.sampler), so top_k's largest useful value
MAX_LOGPROBS = 5  # top alternatives a token can come with (SamplingParams.logprobs); the logprobs graph computes all


class FinishReason(enum.Enum):
    STOP = "stop"  # sampled one of its stop tokens
    LENGTH = "length"  # reached max_tokens, or the context
    ABORT = "abort"  # Engine.abort ended it


@attrs.frozen
class SamplingParams:
    """How a request's tokens are chosen. ``temperature == 0`` is greedy; otherwise temperature, then top-k
    (0 = off; at most ``CANDIDATES``, 256, the tokens sampling looks at), then top-p over what is left, drawn from a
    counter-based RNG keyed by (seed, position). A request ends after ``max_tokens`` tokens, at the context, or with
    the first stop token it samples (that token is the last of its output): its ``stop_token_ids`` and, unless
    ``ignore_eos``, the model's end-of-sequence tokens (a checkpoint's generation_config.json; random-weight models
    have none). ``logprobs``: None, or k in [0, ``MAX_LOGPROBS``]: each token comes with its log-probability and the
    k most likely tokens' at its position (OpenAI's logprobs / top_logprobs), log_softmax of the raw logits in
    float32 (temperature 1: before temperature, top-k and top-p). ``min_tokens``: no stop token (its own, or an
    end-of-sequence token it does not ignore) is drawn before this many tokens (at most ``BANNED_STOPS`` of them:
    the sampler masks them in the graph), as vLLM's and OpenAI-compatible servers' ``min_tokens``.
    ``prompt_logprobs``: None, or k in [0, ``MAX_LOGPROBS``]: each prompt token after the first comes with its
    log-probability given the tokens before it and the k most likely tokens' there (what an eval harness scores a
    text by: OpenAI's ``echo`` with ``logprobs``); such a request computes its whole prompt (no prefix cache)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    min_tokens: int = 0
    prompt_logprobs: int | None = None


def stop_set(sp: SamplingParams, eos: Sequence[int]) -> tuple[int, ...]:
    """The tokens that end a request: its ``stop_token_ids`` and, unless it ignores them, ``eos``; in order, once."""
    return tuple(sp.stop_token_ids) if sp.ignore_eos else tuple(dict.fromkeys((*sp.stop_token_ids, *eos)))


@attrs.frozen(eq=False)
class Request:
    """A prompt (token ids), how to sample, and for an encoder-decoder model its input features."""

    prompt: tuple[int, ...] = attrs.field(converter=tuple)
    sampling: SamplingParams = SamplingParams()
    model: str | None = None  # None: the engine's model; any other name must be the engine's
    features: torch.Tensor | None = None  # Whisper: log-mel [n_mels, frames]
    request_id: str | None = None


@attrs.frozen
class Result:
    request_id: str
    prompt_len: int
    tokens: tuple[int, ...]
    finish_reason: FinishReason
    ttft_s: float = attrs.field(default=float("nan"), eq=False)  # submission to first token (wall clock)
    itl_s: float = attrs.field(default=float("nan"), eq=False)  # mean gap between consecutive tokens
    logprobs: tuple[float, ...] = ()  # each token's log-probability (asked for: SamplingParams.logprobs; else empty)
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # each token's k (id, logprob), most likely first
    # prompt tokens 1 .. P-1 given those before each (asked for: SamplingParams.prompt_logprobs; else empty)
    prompt_logprobs: tuple[float, ...] = ()
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()


@attrs.frozen(eq=False)
class StepOutput:
    """What one ``Engine.step`` gave its clients, as values: every token emitted since the last step returned, with
    its request's id (in emission order; under overlap a request may get two in one step), and the requests that
    finished meanwhile, their results handed over (the engine keeps nothing of them). ``ran``: the step ran
    anything."""

    request_ids: np.ndarray  # [n] object (str): the request of each token
    tokens: np.ndarray  # [n] int64
    finished: tuple[Result, ...]
    ran: bool = True
    # each token's logprobs (None: no token of the step has them); NaN / -1 where its request asked for fewer
    logprob: np.ndarray | None = None  # [n] float32
    top_ids: np.ndarray | None = None  # [n, MAX_LOGPROBS] int64, most likely first
    top_logprobs: np.ndarray | None = None  # [n, MAX_LOGPROBS] float32
    # the prompts that ended since the last step and asked for their logprobs (SamplingParams.prompt_logprobs): each
    # request's id and its prompt tokens 1 .. P-1's logprobs ([P - 1]; NaN / -1 past the alternatives it asked for)
    prompt_logprobs: tuple[tuple[str, TokenLogprobs], ...] = ()

    def new_tokens(self) -> dict[str, list[int]]:
        """The tokens by request, each request's in order (a client's view; a Python loop over the tokens)."""
        out: dict[str, list[int]] = {}
        for rid, t in zip(self.request_ids.tolist(), self.tokens.tolist(), strict=True):
            out.setdefault(rid, []).append(t)
        return out


@attrs.frozen(eq=False)
class TokenLogprobs:
    """Drawn tokens' logprobs, aligned with the tokens (log_softmax of the raw logits, float32): what a logprobs
    graph or a pass reads back, and the table emits."""

    logprob: np.ndarray  # [n] float32: the drawn token's
    top_ids: np.ndarray  # [n, MAX_LOGPROBS] int64, most likely first
    top_logprobs: np.ndarray  # [n, MAX_LOGPROBS] float32

    def __getitem__(self, i) -> TokenLogprobs:
        """The rows ``i`` picks (a slice, a mask or indices)."""
        return TokenLogprobs(self.logprob[i], self.top_ids[i], self.top_logprobs[i])

    def copy(self) -> TokenLogprobs:
        return TokenLogprobs(self.logprob.copy(), self.top_ids.copy(), self.top_logprobs.copy())


@attrs.frozen
class EngineLoad:
    """What an engine holds now: requests waiting for admission and admitted (running), KV pages held and holdable."""

    waiting: int
    running: int
    pages_used: int
    pages_total: int


class InvalidRequest(ValueError):
    """A request refused at submission; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid request: {field}: {message}")
        self.field = field


@attrs.frozen
class Limits:
    """What the serving engine accepts: its model's name and vocabulary, its context, its end-of-sequence tokens,
    and whether it scores prompts (``SamplingParams.prompt_logprobs``)."""

    model: str
    vocab_size: int
    max_seq_len: int
    eos_token_ids: tuple[int, ...] = ()
    scores_prompts: bool = False


def validate(req: Request, limits: Limits) -> None:
    """Raise InvalidRequest for the first problem found; return None for a request the engine can run."""
    if not isinstance(req, Request):
        raise InvalidRequest("request", f"expected a Request, got {type(req).__name__}")
    if req.model is not None and req.model != limits.model:
        raise InvalidRequest("model", f"unknown model {req.model!r}; this engine serves {limits.model!r}")
    _token_ids("prompt", req.prompt, limits.vocab_size)
    if len(req.prompt) == 0:
        raise InvalidRequest("prompt", "the prompt is empty; it needs at least one token")
    if len(req.prompt) > limits.max_seq_len:
        raise InvalidRequest("prompt", f"{len(req.prompt)} tokens is longer than the engine's context of "
                                       f"{limits.max_seq_len} tokens (EngineConfig.max_seq_len)")  # fmt: skip
    sp = req.sampling
    if not isinstance(sp, SamplingParams):
        raise InvalidRequest("sampling", f"expected SamplingParams, got {type(sp).__name__}")
    if not _is_int(sp.max_tokens) or sp.max_tokens <= 0:
        raise InvalidRequest("max_tokens", f"must be an integer > 0, got {sp.max_tokens!r}")
    if not _is_real(sp.temperature) or not math.isfinite(sp.temperature) or sp.temperature < 0:
        raise InvalidRequest("temperature", f"must be a finite number >= 0 (0 is greedy), got {sp.temperature!r}")
    if not _is_real(sp.top_p) or not 0 < sp.top_p <= 1:
        raise InvalidRequest("top_p", f"must be in (0, 1], got {sp.top_p!r}")
    if not _is_int(sp.top_k) or not 0 <= sp.top_k <= CANDIDATES:
        raise InvalidRequest("top_k", f"must be an integer in [0, {CANDIDATES}] (0 is off; sampling looks at the "
                                      f"{CANDIDATES} most likely tokens), got {sp.top_k!r}")  # fmt: skip
    if not _is_int(sp.seed) or not INT32_MIN <= sp.seed <= INT32_MAX:
        raise InvalidRequest("seed", f"must be an int32, got {sp.seed!r}")
    _token_ids("stop_token_ids", sp.stop_token_ids, limits.vocab_size)
    if not isinstance(sp.ignore_eos, bool):
        raise InvalidRequest("ignore_eos", f"must be True or False, got {sp.ignore_eos!r}")
    if sp.logprobs is not None and (not _is_int(sp.logprobs) or not 0 <= sp.logprobs <= MAX_LOGPROBS):
        raise InvalidRequest("logprobs", f"must be None or an integer in [0, {MAX_LOGPROBS}] (the top alternatives "
                                         f"each token comes with), got {sp.logprobs!r}")  # fmt: skip
    if sp.prompt_logprobs is not None and (not _is_int(sp.prompt_logprobs)
                                           or not 0 <= sp.prompt_logprobs <= MAX_LOGPROBS):  # fmt: skip
        raise InvalidRequest("prompt_logprobs", f"must be None or an integer in [0, {MAX_LOGPROBS}] (the top "
                                                f"alternatives each prompt token comes with), got "
                                                f"{sp.prompt_logprobs!r}")  # fmt: skip
    if sp.prompt_logprobs is not None and not limits.scores_prompts:
        raise InvalidRequest("prompt_logprobs", f"{limits.model} does not score prompts")
    if not _is_int(sp.min_tokens) or not 0 <= sp.min_tokens <= sp.max_tokens:
        raise InvalidRequest("min_tokens", f"must be an integer in [0, max_tokens = {sp.max_tokens}], got "
                                           f"{sp.min_tokens!r}")  # fmt: skip
    n_stops = len(stop_set(sp, limits.eos_token_ids)) if sp.min_tokens else 0
    if n_stops > BANNED_STOPS:
        raise InvalidRequest("min_tokens", f"with min_tokens the stop tokens (stop_token_ids, and the model's "
                                           f"{len(limits.eos_token_ids)} end-of-sequence tokens unless ignore_eos) "
                                           f"must be at most {BANNED_STOPS}: the sampler masks them in the graph; "
                                           f"this request has {n_stops}")  # fmt: skip


def _token_ids(field: str, ids: Sequence, vocab: int) -> None:
    """Every id an int (not a bool) in [0, vocab); refused naming the first that is not. Plain Python ints, what a
    prompt usually holds, are checked at C speed (type set, min, max: ~25 us for 512 ids, against ~65 us a token at
    a time); anything else takes the loop, which also finds the first bad id."""
    if ids and set(map(type, ids)) <= {int} and min(ids) >= 0 and max(ids) < vocab:
        return
    for i, t in enumerate(ids):
        if not _is_int(t):
            raise InvalidRequest(field, f"token {i} is {t!r}, not an integer")
        if not 0 <= t < vocab:
            raise InvalidRequest(field, f"token {i} is {t}, outside the vocabulary [0, {vocab})")


def _is_int(x) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)
