"""What one load window measured: the requests, the engine's side of it, and the warm-up before it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from orchestrator.measure.records import RequestRecord
from orchestrator.measure.warmup import WarmupOutcome

__all__ = ["LevelMeasurement"]


@dataclass(frozen=True)
class LevelMeasurement:
    """One load window (the trial's, or one capacity level's), as an engine path measured it.

    ``engine``: the engine's side, by column name: its histograms over the measured requests
    (``engine_*``), its gauges and counters, and facts a virtual engine knows (its KV cache);
    ``warmup``: the warm-up that preceded the window (none ran: zero seconds, zero requests)."""

    records: list[RequestRecord]
    engine: Mapping[str, Optional[float]] = field(default_factory=dict)
    warmup: WarmupOutcome = field(default_factory=WarmupOutcome)
