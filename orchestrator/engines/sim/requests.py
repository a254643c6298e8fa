"""What the simulated engine's OpenAI API accepts: a request body read and refused as vLLM reads and refuses it.

vLLM 0.29 checks a completion request in four places, and the first one that objects answers
(400 ``{"error": {message, type, param, code}}`` unless noted):

1. the request model's ``mode="before"`` validators, on the raw JSON (empty prompt,
   ``stream_options`` without ``stream``, ``logprobs``/``top_logprobs``/``prompt_logprobs``
   below -1);
2. the request model's field types (pydantic, lax), all errors at once: FastAPI's request
   validation, type ``Bad Request``, param ``body.<field>``;
3. the model name (404 ``NotFoundError``), then ``SamplingParams`` (``n``, penalties,
   ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``max_tokens``, ``min_tokens``);
4. the engine's own check of ``SamplingParams`` when the request is added: more logprobs
   than ``max_logprobs`` (20; ``-1`` means the whole vocabulary). A streamed request has
   its 200 by then, so this one arrives as an SSE error event (:class:`EngineRefusal`).

Messages, params and order were read from vLLM's ``CompletionRequest`` /
``ChatCompletionRequest`` and ``SamplingParams`` (``tests/engines/test_sim_api.py`` holds the
answers vLLM's own classes give).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.workload.tokens import text_token_ids, token_ids_to_text

# vLLM's ModelConfig.max_logprobs default (0.26 and 0.29): most logprobs a request may ask for.
MAX_LOGPROBS = 20
# vLLM's VLLM_MAX_N_SEQUENCES default.
MAX_N = 16384
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class BadRequest(ValueError):
    """A request vLLM's server refuses, with its status, error type and parameter (vLLM's ``ErrorInfo``)."""

    def __init__(self, message: str, *, param: Optional[str] = None, status: int = 400,
                 err_type: str = "BadRequestError"):
        super().__init__(message)
        self.param, self.status, self.err_type = param, status, err_type

    def body(self) -> dict:
        return error_body(self.status, str(self), self.err_type, self.param)


class EngineRefusal(BadRequest):
    """Refused when the engine adds the request (vLLM's ``SamplingParams.verify``): after a
    streamed response has started, so it is streamed as an error event."""


def error_body(status: int, message: str, kind: Optional[str] = None, param: Optional[str] = None) -> dict:
    """vLLM's ``ErrorResponse``: ``{"error": {message, type, param, code}}``."""
    kind = kind or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _validation(message: str, *, param: Optional[str] = None, value: Any = None) -> BadRequest:
    """vLLM's ``VLLMValidationError``: the message carries ``(parameter=..., value=...)`` when given."""
    extras = [f"parameter={param}"] if param is not None else []
    if value is not None:
        extras.append(f"value={value}")
    return BadRequest(f"{message} ({', '.join(extras)})" if extras else message, param=param)


# ---- 2. field types: the fields of vLLM's request models that the simulator reads

_TokenId = Annotated[int, Field(ge=0)]
_Int64 = Annotated[Optional[int], Field(ge=_INT64_MIN, le=_INT64_MAX)]


class _StreamOptions(BaseModel):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM ignores fields it does not know (and logs them)

    model: Optional[str] = None
    frequency_penalty: Optional[float] = 0.0
    presence_penalty: Optional[float] = 0.0
    max_tokens: Optional[int] = None
    seed: _Int64 = None
    stream: Optional[bool] = False
    stream_options: Optional[_StreamOptions] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: int = 0
    prompt_logprobs: Optional[int] = None


class _CompletionFields(_Common):
    prompt: Union[list[_TokenId], list[list[_TokenId]], str, list[str], None] = None
    echo: Optional[bool] = False
    logprobs: Optional[int] = None
    n: int = 1
    max_completion_tokens: Optional[int] = None  # not vLLM's (it ignores it here); the simulator's fallback


class _ChatFields(_Common):
    messages: Any = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = 0
    max_completion_tokens: Optional[int] = None
    n: Optional[int] = 1
    echo: bool = False


def _typed(body: dict, chat: bool) -> _Common:
    try:
        return (_ChatFields if chat else _CompletionFields).model_validate(body)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        label = "error" if len(errors) == 1 else "errors"
        message = f"{len(errors)} validation {label}:\n" + "".join(f"  {err}\n" for err in errors)
        raise BadRequest(message.rstrip(), param=_param_of(errors[0]["loc"]), err_type="Bad Request") from None


_INTERNAL_LOC = re.compile(r"[\[\]{}()]")
_INTERNAL_MARKERS = frozenset({
    "function-wrap", "function-after", "function-before", "function-plain", "json-or-python", "lax-or-strict",
    "chain", "default", "nullable", "tagged-union", "union", "call", "arguments", "is-instance", "is-subclass",
    "callable", "str", "int", "float", "bool", "bytes", "bytearray", "list", "tuple", "dict", "set", "frozenset",
    "complex", "none", "nonetype"})


def _param_of(loc: tuple) -> str:
    """vLLM's ``clean_loc_for_param``: ``body.prompt.0``, not ``body.prompt.list[constrained-int].0``."""
    parts = [str(p) for p in loc if not _INTERNAL_LOC.search(str(p)) and str(p).lower() not in _INTERNAL_MARKERS]
    return ".".join(parts or map(str, loc))


# ---- 1. the raw-JSON validators, in the order vLLM runs them (the last defined runs first)

def _check_raw(body: dict, chat: bool) -> None:
    if not chat:
        prompt = body.get("prompt")
        if prompt is None or prompt == "":
            raise _validation("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if body.get("stream_options") and not body.get("stream"):
        raise _validation("Stream options can only be defined when `stream=True`.", param="stream_options")
    count_field = "top_logprobs" if chat else "logprobs"
    for name in ("prompt_logprobs", count_field):
        value = body.get(name)
        if value is not None and not isinstance(value, (int, float)):  # bool is an int here, as in vLLM
            raise _validation(f"`{name}` must be an integer.", param=name, value=value)
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None:
        if body.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise _validation("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise _validation("`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs",
                              value=prompt_logprobs)
    count = body.get(count_field)
    if count is not None and count < 0 and count != -1:
        raise _validation(f"`{count_field}` must be a positive value or -1.", param=count_field, value=count)
    if chat and count is not None and (count == -1 or count > 0) and not body.get("logprobs"):
        raise _validation("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")


# ---- 3. SamplingParams._verify_args, for the parameters a request can carry

def _check_sampling(f: _Common, n: int, max_tokens: int) -> None:
    if n < 1:
        raise _validation(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise _validation(f"n must be at most {MAX_N}, got {n}. To increase this limit, set the "
                          "VLLM_MAX_N_SEQUENCES environment variable.")
    presence = 0.0 if f.presence_penalty is None else f.presence_penalty
    frequency = 0.0 if f.frequency_penalty is None else f.frequency_penalty
    if not -2.0 <= presence <= 2.0:
        raise _validation(f"presence_penalty must be in [-2, 2], got {presence}.")
    if not -2.0 <= frequency <= 2.0:
        raise _validation(f"frequency_penalty must be in [-2, 2], got {frequency}.")
    repetition = 1.0 if f.repetition_penalty is None else f.repetition_penalty
    if not math.isfinite(repetition):
        raise _validation(f"repetition_penalty must be a finite number, got {repetition}.")
    if repetition <= 0.0:
        raise _validation(f"repetition_penalty must be greater than zero, got {repetition}.")
    temperature = 1.0 if f.temperature is None else f.temperature
    if not math.isfinite(temperature):
        raise _validation(f"temperature must be a finite number, got {temperature}.", param="temperature",
                          value=temperature)
    if temperature < 0.0:
        raise _validation(f"temperature must be non-negative, got {temperature}.", param="temperature",
                          value=temperature)
    if temperature > 2.0:
        raise _validation(f"temperature must be in [0, 2], got {temperature}.", param="temperature",
                          value=temperature)
    top_p = 1.0 if f.top_p is None else f.top_p
    if not 0.0 < top_p <= 1.0:
        raise _validation(f"top_p must be in (0, 1], got {top_p}.", param="top_p", value=top_p)
    top_k = 0 if f.top_k is None else f.top_k
    if top_k < -1:
        raise _validation(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    min_p = 0.0 if f.min_p is None else f.min_p
    if not 0.0 <= min_p <= 1.0:
        raise _validation(f"min_p must be in [0, 1], got {min_p}.")
    if max_tokens < 1:
        raise _validation(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens", value=max_tokens)
    if f.min_tokens < 0:
        raise _validation(f"min_tokens must be greater than or equal to 0, got {f.min_tokens}.")
    if f.min_tokens > max_tokens:
        raise _validation(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {f.min_tokens}.")


def _check_engine(logprobs: Optional[int], prompt_logprobs: Optional[int], vocab_size: int) -> None:
    """vLLM's ``SamplingParams._validate_logprobs`` (``max_logprobs`` 20; -1: the vocabulary)."""
    if logprobs:
        wanted = vocab_size if logprobs == -1 else logprobs
        if wanted > MAX_LOGPROBS:
            raise EngineRefusal(str(_validation(
                f"Requested sample logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}",
                param="logprobs", value=wanted)), param="logprobs")
    if prompt_logprobs:
        wanted = vocab_size if prompt_logprobs == -1 else prompt_logprobs
        if wanted > MAX_LOGPROBS:
            raise EngineRefusal(str(_validation(
                f"Requested prompt logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}",
                param="prompt_logprobs", value=wanted)), param="prompt_logprobs")


# ---- the request as the simulator serves it

@dataclass(frozen=True)
class Prompt:
    """One prompt: the ids the engine schedules, and its text (what ``echo`` returns)."""

    ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class ApiRequest:
    """A validated completion or chat request."""

    chat: bool
    prompts: tuple[Prompt, ...]  # a batched completions prompt has several; each is its own engine request
    max_tokens: int  # what the engine generates (1 for ``echo`` with ``max_tokens: 0``)
    echo: bool  # completions: the prompt's text (and its logprobs) before the completion
    echo_only: bool  # ``echo`` with ``max_tokens: 0``: the prompt alone is returned
    logprobs: Optional[int]  # completions ``logprobs``; chat ``top_logprobs`` when ``logprobs`` is true
    prompt_logprobs: Optional[int]  # vLLM's ``prompt_logprobs`` (``echo`` implies ``logprobs``)
    stream: bool
    include_usage: bool
    seed: Optional[int]


def parse_request(body: Any, chat: bool, *, served_name: str, vocab_size: int) -> ApiRequest:
    """Validate ``body`` as vLLM 0.29 does; raises :class:`BadRequest` (or :class:`EngineRefusal`)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    _check_raw(body, chat)
    fields = _typed(body, chat)
    if fields.model not in (None, served_name):
        raise BadRequest(f"The model `{fields.model}` does not exist.", param="model", status=404,
                         err_type="NotFoundError")
    prompts = _chat_prompt(body, vocab_size) if chat else _completion_prompts(fields.prompt, vocab_size)
    order = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens", "max_completion_tokens")
    requested = next((getattr(fields, name) for name in order if getattr(fields, name) is not None), 16)  # 16: vLLM's default
    echo = bool(fields.echo) and not chat  # chat's echo repeats the last message: not simulated
    echo_only = echo and requested == 0
    max_tokens = 1 if echo_only else requested  # vLLM generates one token it does not return
    n = 1 if fields.n is None else fields.n
    _check_sampling(fields, n, max_tokens)
    if n > 1:  # vLLM samples n sequences; the simulator makes one: refuse, never ignore
        raise BadRequest(f"n > 1 is not supported by the simulated engine (one sequence per request), got {n}.",
                         param="n")
    if chat:
        logprobs = fields.top_logprobs if fields.logprobs else None
    else:
        logprobs = fields.logprobs
    prompt_logprobs = fields.prompt_logprobs
    if prompt_logprobs is None and echo:
        prompt_logprobs = logprobs
    stream = bool(fields.stream)
    try:
        _check_engine(logprobs, prompt_logprobs, vocab_size)
    except EngineRefusal as e:
        e.stream = stream
        raise
    include_usage = bool(stream and fields.stream_options and fields.stream_options.include_usage)
    return ApiRequest(chat=chat, prompts=prompts, max_tokens=max_tokens, echo=echo, echo_only=echo_only,
                      logprobs=logprobs, prompt_logprobs=prompt_logprobs, stream=stream,
                      include_usage=include_usage, seed=fields.seed)


def _completion_prompts(prompt: Any, vocab_size: int) -> tuple[Prompt, ...]:
    """A string, a list of token ids, or a batch of either (vLLM's four prompt forms)."""
    if isinstance(prompt, str):
        batch: list = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        batch = [prompt]
    else:
        batch = list(prompt)
    if not batch or any(len(p) == 0 for p in batch):
        raise _validation("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    out = []
    for p in batch:
        if isinstance(p, str):
            out.append(Prompt(text_token_ids(p, vocab_size), p))
        else:  # token ids: the text is what the simulator's word encoding decodes them to
            ids = tuple(t % vocab_size for t in p)
            out.append(Prompt(ids, token_ids_to_text(ids)))
    return tuple(out)


def _chat_prompt(body: dict, vocab_size: int) -> tuple[Prompt, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list")
    text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
    return (Prompt(text_token_ids(text, vocab_size), text),)
