"""The requests of one (workload, seed, level): warm-up, measured, and the steady warm-up's stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.workload.requests import Request
from orchestrator.workload.warmup_stream import WarmupStream


@dataclass(frozen=True)
class RequestSet:
    """The deterministic requests of one (workload, seed, level): warm-up first, then the measured ones.

    ``warmup`` is the burst (``workload.warmup_requests``, sent at once and awaited);
    ``warmup_stream``, when set, the steady warm-up that follows it: requests made on
    demand at the trial's own load until the engine is steady (:mod:`orchestrator.measure.warmup`).
    """

    warmup: tuple[Request, ...]
    measured: tuple[Request, ...]
    closed_loop_concurrency: Optional[int] = None  # set for `arrival: concurrency`
    requested_rate: Optional[float] = None  # the nominal rate (a trace's: its own, after scaling)
    warmup_stream: Optional[WarmupStream] = None
    sessions: int = 0  # multi-turn: the sessions the measured requests (their turns) belong to

    @property
    def requests_per_arrival(self) -> float:
        """Requests each arrival brings: the mean turns of a session (1 for single requests)."""
        return len(self.measured) / self.sessions if self.sessions else 1.0
