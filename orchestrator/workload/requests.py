"""One request of a workload, as the load generator and the virtual simulator see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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
