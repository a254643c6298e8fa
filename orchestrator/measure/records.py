"""The raw per-request record every engine path produces (HTTP load generator or virtual sim).

Times are seconds on one monotonic clock, measured from the start of the load window
(the moment the first request was due). Like vLLM's ``RequestFuncOutput``: the record
is raw observation; every derived number lives in :mod:`orchestrator.measure.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class RequestErrorKind(str, Enum):
    """Why a request did not complete."""

    HTTP_STATUS = "http_status"  # a non-200 answer
    CONNECTION = "connection"  # refused, reset, closed before the end of the stream
    TIMEOUT = "timeout"  # no end of stream within the per-request timeout
    BAD_RESPONSE = "bad_response"  # unparsable SSE / JSON, or no token at all
    CLIENT = "client"  # the load generator itself failed
    ABORTED = "aborted"  # cancelled by the load generator (a capacity level stopped at saturation)


@dataclass
class RequestRecord:
    """What happened to one request.

    ``scheduled_s``: when the workload wanted it sent; ``sent_s``: when the client
    actually sent it (the difference is the generator's scheduling lag);
    ``first_token_s``: first streamed token; ``token_times_s``: arrival of every
    streamed chunk that carried tokens (the first included); ``end_s``: the last
    token (as ``vllm bench serve``'s ``latency``, which ends at the last token);
    ``finished_s``: when the client stopped waiting (also for failed requests).
    """

    index: int
    scheduled_s: float
    sent_s: Optional[float] = None
    first_token_s: Optional[float] = None
    end_s: Optional[float] = None
    token_times_s: list[float] = field(default_factory=list)
    # When the client was done with the request, success or not (a timeout ends here).
    finished_s: Optional[float] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    expected_prompt_tokens: int = 0
    expected_output_tokens: int = 0
    error: Optional[str] = None
    error_kind: Optional[RequestErrorKind] = None
    warmup: bool = False
    prefix_group: Optional[int] = None
    # Multi-turn sessions: the session and turn (1-based) the request was; None / 0 for single requests.
    session: Optional[int] = None
    turn: int = 0
    # Prompt tokens the workload expects the prefix cache to hold (the previous turn's prompt).
    expected_cached_tokens: int = 0
    # Capacity search: the load level this request belonged to, and which of the level's
    # windows (0: its first; a level left undecided is measured again, with a clock of its own).
    level: int = 0
    window: int = 0
    # Seconds the client spent handling this request's streamed chunks (parsing, bookkeeping):
    # the load generator's own cost, reported per token as ``client_us_per_token``.
    client_s: float = 0.0

    @property
    def success(self) -> bool:
        return self.error is None and self.first_token_s is not None and self.end_s is not None

    @property
    def ttft_s(self) -> Optional[float]:
        if self.first_token_s is None or self.sent_s is None:
            return None
        return self.first_token_s - self.sent_s

    @property
    def latency_s(self) -> Optional[float]:
        if self.end_s is None or self.sent_s is None:
            return None
        return self.end_s - self.sent_s

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def output_tokens(self) -> int:
        """Tokens generated: the server's ``usage`` if it sent one, else streamed chunks."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.token_times_s)

    @property
    def tpot_s(self) -> Optional[float]:
        """(latency - TTFT) / (output tokens - 1), as vLLM's benchmark; None for one token."""
        n = self.output_tokens
        if not self.success or n <= 1:
            return None
        return (self.latency_s - self.ttft_s) / (n - 1)
