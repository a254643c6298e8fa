"""vLLM's error answers: a refused request's status and ``{"error": {message, type, param, code}}`` body."""

from __future__ import annotations

from typing import Any, Optional


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


def validation_error(message: str, *, param: Optional[str] = None, value: Any = None) -> BadRequest:
    """vLLM's ``VLLMValidationError``: the message carries ``(parameter=..., value=...)`` when given."""
    extras = [f"parameter={param}"] if param is not None else []
    if value is not None:
        extras.append(f"value={value}")
    return BadRequest(f"{message} ({', '.join(extras)})" if extras else message, param=param)
