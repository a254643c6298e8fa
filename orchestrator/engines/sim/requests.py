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

from orchestrator.engines.sim.errors import BadRequest, EngineRefusal, error_body, validation_error as _validation
from orchestrator.engines.sim.logprobs import GENERATED_TEXT, generated_token_id
from orchestrator.engines.sim.stops import Ending, StopRule, plan_ending
from orchestrator.engines.sim.unsupported import check_simulated, check_tool_usage, check_tools
from orchestrator.workload.tokens import text_token_ids, token_ids_to_text

# vLLM's ModelConfig.max_logprobs default (0.26 and 0.29): most logprobs a request may ask for.
MAX_LOGPROBS = 20
# vLLM's VLLM_MAX_N_SEQUENCES default.
MAX_N = 16384
# vLLM's VLLM_MAX_STOP_STRINGS default.
MAX_STOP_STRINGS = 4
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
VLLM_VERSION = "0.29.0"  # the vLLM whose OpenAI server the simulator answers as (its GET /version)

__all__ = ["VLLM_VERSION", "ApiRequest", "BadRequest", "EngineRefusal", "Prompt", "error_body", "parse_request"]


# ---- 2. field types: the fields of vLLM's request models that the simulator reads

_TokenId = Annotated[int, Field(ge=0)]
_Int64 = Annotated[Optional[int], Field(ge=_INT64_MIN, le=_INT64_MAX)]


class _StreamOptions(BaseModel):
    include_usage: Optional[bool] = False
    continuous_usage_stats: Optional[bool] = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM ignores fields it does not know (and logs them)

    model: Optional[str] = None
    stop: Union[str, Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)], None] = []
    stop_token_ids: Optional[list[int]] = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False  # the simulated text never holds the end-of-sequence token
    priority: Annotated[int, Field(ge=_INT64_MIN, le=_INT64_MAX)] = 0
    return_tokens_as_token_ids: Optional[bool] = None
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
    suffix: Optional[str] = None
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
        prompt, embeds = body.get("prompt"), body.get("prompt_embeds")
        if (prompt is None or prompt == "") and (embeds is None or embeds == []):
            raise _validation("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if chat:
        check_tool_usage(body)
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
    if any(not s for s in _stop_strings(f.stop)):
        raise _validation("stop cannot contain an empty string.")


def _stop_strings(stop: Union[str, list[str], None]) -> tuple[str, ...]:
    return () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)


def _check_engine(logprobs: Optional[int], prompt_logprobs: Optional[int], stop_token_ids: tuple[int, ...],
                  vocab_size: int) -> None:
    """vLLM's ``SamplingParams.verify``: ``_validate_logprobs`` (``max_logprobs`` 20; -1: the
    vocabulary), then ``_validate_stop_token_ids``."""
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
    outside = [t for t in stop_token_ids if t < 0 or t >= vocab_size]
    if outside:
        raise EngineRefusal(str(_validation(
            f"token_id(s) {outside} in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab_size}",
            param="stop_token_ids", value=outside)), param="stop_token_ids")


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
    continuous_usage: bool  # usage on every chunk (``stream_options.continuous_usage_stats`` with include_usage)
    seed: Optional[int]
    ending: Ending  # where each generated sequence ends (the simulated text is the same for all)
    n: int = 1  # choices per prompt: each its own engine request, as vLLM's n child requests
    stop: StopRule = StopRule()
    priority: int = 0
    chat_echo: str = ""  # chat ``echo``: the last message's content when it is the assistant's
    tokens_as_ids: bool = False  # ``return_tokens_as_token_ids``: logprobs name tokens ``token_id:<id>``


def parse_request(body: Any, chat: bool, *, served_name: str, vocab_size: int) -> ApiRequest:
    """Validate ``body`` as vLLM 0.29 does; raises :class:`BadRequest` (or :class:`EngineRefusal`)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    _check_raw(body, chat)
    fields = _typed(body, chat)
    if fields.model not in (None, served_name):
        raise BadRequest(f"The model `{fields.model}` does not exist.", param="model", status=404,
                         err_type="NotFoundError")
    if not chat and fields.suffix is not None:
        raise BadRequest("suffix is not currently supported")
    if chat:
        check_tools(body)
    check_simulated(body)
    prompts = _chat_prompt(body, vocab_size) if chat else _completion_prompts(fields.prompt, vocab_size)
    order = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens", "max_completion_tokens")
    requested = next((getattr(fields, name) for name in order if getattr(fields, name) is not None), 16)  # 16: vLLM's default
    echo = bool(fields.echo) and not chat  # chat's echo is the last message's text (chat_echo)
    echo_only = echo and requested == 0
    max_tokens = 1 if echo_only else requested  # vLLM generates one token it does not return
    n = 1 if fields.n is None else fields.n
    _check_sampling(fields, n, max_tokens)
    if chat:
        logprobs = fields.top_logprobs if fields.logprobs else None
    else:
        logprobs = fields.logprobs
    prompt_logprobs = fields.prompt_logprobs
    if prompt_logprobs is None and echo:
        prompt_logprobs = logprobs
    stream = bool(fields.stream)
    stop = StopRule(_stop_strings(fields.stop), tuple(dict.fromkeys(fields.stop_token_ids or ())),
                    fields.include_stop_str_in_output, fields.min_tokens)
    try:
        _check_engine(logprobs, prompt_logprobs, stop.token_ids, vocab_size)
    except EngineRefusal as e:
        e.stream = stream
        raise
    options = fields.stream_options
    include_usage = bool(stream and options and options.include_usage)
    continuous_usage = include_usage and bool(options.continuous_usage_stats)  # vLLM: only with include_usage
    return ApiRequest(chat=chat, prompts=prompts, max_tokens=max_tokens, echo=echo, echo_only=echo_only,
                      logprobs=logprobs, prompt_logprobs=prompt_logprobs, stream=stream,
                      include_usage=include_usage, continuous_usage=continuous_usage, seed=fields.seed, n=n, stop=stop,
                      ending=plan_ending(stop, max_tokens, GENERATED_TEXT, generated_token_id(vocab_size)),
                      priority=fields.priority, chat_echo=_chat_echo(body) if chat and fields.echo else "",
                      tokens_as_ids=bool(fields.return_tokens_as_token_ids))


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


def _chat_echo(body: dict) -> str:
    """vLLM's chat ``echo``: the last message's content, when the assistant (the answer's role) wrote it."""
    last = body["messages"][-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return ""
    content = last.get("content") or ""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _chat_prompt(body: dict, vocab_size: int) -> tuple[Prompt, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list")
    text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
    return (Prompt(text_token_ids(text, vocab_size), text),)
