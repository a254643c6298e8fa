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

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class RequestSet:
    """The deterministic requests of one (workload, seed): warm-up first, then the measured ones."""

    warmup: tuple[Request, ...]
    measured: tuple[Request, ...]
    closed_loop_concurrency: Optional[int] = None  # set for `arrival: concurrency`
