"""The OpenAI-style streaming APIs the load generator speaks, and where it sends requests.

The differences between ``/v1/completions`` and ``/v1/chat/completions`` (request body,
which chunk carries a token) live in the small :data:`APIS` registry; everything else
about a request is the same for both (:func:`~orchestrator.loadgen.request.send_request`).
The API key is sent only in the ``Authorization`` header and :meth:`Endpoint.scrub`
removes it from any error text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Optional

from orchestrator.redaction import join_url, scrub
from orchestrator.workload.requests import Request
from orchestrator.workload.tokens import token_ids_to_text

__all__ = ["APIS", "ApiFormat", "ApiName", "Endpoint", "MAX_ERROR_CHARS"]

MAX_ERROR_CHARS = 500

ApiName = Literal["completions", "chat"]


@dataclass(frozen=True)
class ApiFormat:
    """What differs between two OpenAI-style streaming APIs."""

    path: str  # appended to Endpoint.base_url
    build_body: Callable[["Endpoint", Request, bool], dict]  # (endpoint, request, ignore_eos) -> JSON body
    carries_token: Callable[[dict], bool]  # choices[0] of a chunk -> does it carry generated tokens?


def _common(endpoint: "Endpoint", req: Request, ignore_eos: bool) -> dict:
    return {
        "model": endpoint.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
        "temperature": 0,
    }


def _completions_body(endpoint: "Endpoint", req: Request, ignore_eos: bool) -> dict:
    body = _common(endpoint, req, ignore_eos)
    # Token ids (the server does not tokenize), or a trace's / dataset's own text.
    body["prompt"] = req.prompt_token_ids if req.prompt_text is None else req.prompt_text
    body["max_tokens"] = req.output_len
    body.update(endpoint.extra_body)
    return body


def _messages(req: Request) -> list[dict]:
    """The conversation: one user message, or a session turn's user and assistant messages in turn."""
    words = req.prompt_text.split() if req.prompt_text is not None else None
    if not req.segments:
        text = token_ids_to_text(req.prompt_token_ids) if words is None else req.prompt_text
        return [{"role": "user", "content": text}]
    out, at = [], 0
    for i, n in enumerate(req.segments):
        part = req.prompt_token_ids[at:at + n] if words is None else words[at:at + n]
        content = token_ids_to_text(part) if words is None else " ".join(part)
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
        at += n
    return out


def _chat_body(endpoint: "Endpoint", req: Request, ignore_eos: bool) -> dict:
    body = _common(endpoint, req, ignore_eos)
    body["messages"] = _messages(req)
    # The chat API's name for the output limit (``max_tokens`` is deprecated there),
    # as ``vllm bench serve`` sends it.
    body["max_completion_tokens"] = req.output_len
    body.update(endpoint.extra_body)
    return body


def _completions_token(choice: dict) -> bool:
    # ``text`` may be "" for a token that detokenizes to nothing; it still is a token.
    return choice.get("text") is not None


def _chat_token(choice: dict) -> bool:
    delta = choice.get("delta")
    if not delta:
        return False
    content = delta.get("content")
    if content is not None:
        # vLLM's first chunk is {"role": "assistant", "content": ""}: no token yet.
        return content != "" or "role" not in delta
    # Reasoning parsers stream thinking tokens outside ``content``.
    return delta.get("reasoning_content") is not None or delta.get("reasoning") is not None


APIS: dict[str, ApiFormat] = {
    "completions": ApiFormat("/v1/completions", _completions_body, _completions_token),
    "chat": ApiFormat("/v1/chat/completions", _chat_body, _chat_token),
}


@dataclass
class Endpoint:
    """Where to send requests: ``base_url`` (e.g. ``http://127.0.0.1:8000/trial-3``) + API path."""

    base_url: str
    model: str
    api: ApiName = "completions"
    api_key: Optional[str] = field(default=None, repr=False)
    extra_body: dict = field(default_factory=dict)  # merged into every request body (overrides ours)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"unknown api {self.api!r}; valid: {sorted(APIS)}")

    @property
    def url(self) -> str:
        return join_url(self.base_url, APIS[self.api].path)

    @property
    def models_url(self) -> str:
        return join_url(self.base_url, "/v1/models")

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def scrub(self, text: str) -> str:
        """``text`` without the API key (nor URL credentials), cut to :data:`MAX_ERROR_CHARS`."""
        return (scrub(text, [self.api_key] if self.api_key else []) or "")[:MAX_ERROR_CHARS]
