"""One request of a workload, as the load generator and the virtual simulator see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from orchestrator.workload.warmup_stream import WarmupStream


@dataclass(frozen=True)
class Request:
    index: int
    arrival_s: float  # due time from the start of the load window (0 for closed-loop workloads)
    prompt_token_ids: tuple[int, ...]
    output_len: int
    prefix_group: Optional[int] = None
    warmup: bool = False
    # Text to send instead of the token ids (traces and datasets with real prompts);
    # ``prompt_token_ids`` is then its word-level encoding (see generate.text_token_ids).
    prompt_text: Optional[str] = None
    # Multi-turn sessions (orchestrator.workload.sessions): the session and its turn (1-based);
    # turn k > 1 is due ``think_s`` after turn k-1's answer ended (``arrival_s``: the session's start).
    session: Optional[int] = None
    turn: int = 0
    think_s: float = 0.0
    # Lengths of the prompt's messages, user and assistant alternating (the chat API sends them
    # as messages); ``history_len``: the leading tokens that were the previous turn's whole prompt.
    segments: tuple[int, ...] = ()
    history_len: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class RequestSet:
    """The deterministic requests of one (workload, seed, level): warm-up first, then the measured ones.

    ``warmup`` is the burst (``workload.warmup_requests``, sent at once and awaited);
    ``warmup_stream``, when set, the steady warm-up that follows it: requests made on
    demand at the trial's own load until the engine is steady (:mod:`orchestrator.warmup`).
    """

    warmup: tuple[Request, ...]
    measured: tuple[Request, ...]
    closed_loop_concurrency: Optional[int] = None  # set for `arrival: concurrency`
    requested_rate: Optional[float] = None  # the nominal rate (a trace's: its own, after scaling)
    warmup_stream: Optional["WarmupStream"] = None
    sessions: int = 0  # multi-turn: the sessions the measured requests (their turns) belong to

    @property
    def requests_per_arrival(self) -> float:
        """Requests each arrival brings: the mean turns of a session (1 for single requests)."""
        return len(self.measured) / self.sessions if self.sessions else 1.0
