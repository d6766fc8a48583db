"""The OpenAI API as this server speaks it: request bodies (pydantic models, checked field by field), the error object,
and the response and stream-chunk bodies.

A request names only what it sets; a field OpenAI or vLLM defines that this server cannot honour (``logit_bias``,
penalties, ``min_p``, ``tools``, a ``best_of`` other than 1 or n) is refused with a 400 naming it when the request sets
it to anything but its neutral value, never ignored. vLLM's extensions that clients send (``top_k``, ``min_tokens``,
``ignore_eos``, ``stop_token_ids``, and for completions ``return_token_ids``) are taken too.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from models.engine.requests import CANDIDATES, INT32_MAX, INT32_MIN

MAX_LOGPROBS = 5  # alternatives a token's logprobs may list (OpenAI's completions limit)
MAX_N = 16  # choices a request may ask for

NonNegInt = Annotated[int, Field(ge=0)]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class HTTPError(Exception):
    """Answered as OpenAI's error object with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.headers = status, param, headers or {}

    def body(self) -> dict:
        """Its error object: the client's fault below 500, the server's from it."""
        return error_body(str(self), self.param, self.status,
                          "invalid_request_error" if self.status < 500 else "server_error")  # fmt: skip


def error_body(message: str, param: str | None = None, code: int = 400,
               kind: str = "invalid_request_error") -> dict:  # fmt: skip
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False  # (vLLM's: with include_usage, every chunk carries the usage so far)


class SamplingFields(BaseModel):
    """The fields every generation request shares (OpenAI's, then vLLM's extensions)."""

    model_config = ConfigDict(extra="allow")  # unknown fields: checked in refuse_unsupported, not dropped silently

    model: str | None = None
    max_tokens: NonNegInt | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=CANDIDATES)] | None = None  # -1 and 0: off (vLLM's -1)
    seed: Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegInt] | None = None
    ignore_eos: bool = False
    min_tokens: NonNegInt = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # OpenAI fields with no effect here unless set to their neutral values
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    repetition_penalty: float = 1.0  # (vLLM's)
    min_p: float = 0.0  # (vLLM's)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unsent(cls, data: Any) -> Any:
        """OpenAI's optional fields are nullable (clients built from its schema send ``"n": null``): a known field
        sent as null is taken as not sent, so it keeps its default. A required one (``prompt``, ``messages``) is then
        missing."""
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            return {k: v for k, v in data.items() if v is not None or k not in fields}
        return data

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v
        if stops is not None and any(s == "" for s in stops):
            raise ValueError("a stop string is empty")
        return v

    def stops(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(SamplingFields):
    # token ids tried first, strictly (what benchmarks and clients of a tokenizer of their own send; 4.6 us for 512
    # ids, where pydantic's smart union tries every member: 49 us), then the other forms left to right, each taking
    # what the smart union gave it
    prompt: Annotated[list[StrictInt] | str | list[str] | list[int] | list[list[int]],
                      Field(union_mode="left_to_right")]  # fmt: skip
    echo: bool = False
    return_token_ids: bool = False  # vLLM's: each choice (each chunk of a stream) carries its tokens' ids too
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: NonNegInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list | None = None
    response_format: dict | None = None
    modalities: list[str] | None = None


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a text (its special tokens added unless ``add_special_tokens`` is false) or chat messages
    (through the chat template, ready for the reply); exactly one."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    """vLLM's /detokenize: token ids to their text."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[NonNegInt]


NEUTRAL = {  # fields this server cannot honour, and the values of each that ask for nothing
    "presence_penalty": (0.0,), "frequency_penalty": (0.0,), "repetition_penalty": (1.0,), "min_p": (0.0,),
    "logit_bias": (None, {}), "suffix": (None, ""), "tools": (None, []), "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
}  # fmt: skip
KNOWN_EXTRA = {"parallel_tool_calls", "tool_choice", "service_tier", "store", "metadata", "reasoning_effort"}


def unsupported(req: SamplingFields) -> tuple[str, str] | None:
    """(field, why) for the first field the request sets that this server cannot honour, or None."""
    for name, neutral in NEUTRAL.items():
        if name in req.model_fields_set and getattr(req, name) not in neutral:
            return name, f"{name} is not supported by this server"
    if isinstance(req, CompletionRequest) and req.best_of not in (None, 1, req.n):  # (benchmark clients send 1)
        return "best_of", "best_of other than 1 or n is not supported by this server"
    for name in req.model_extra or {}:
        if name not in KNOWN_EXTRA:
            return name, f"unknown field {name!r}"
    return None


def now() -> int:
    return int(time.time())


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
