"""What one trial produced: a frozen, typed record, built once when the trial ends.

:func:`orchestrator.trial.run.execute_trial` returns a :class:`TrialResult`; nothing changes it
afterwards. What it is worth is the judge's business (:func:`orchestrator.study.judge.judge`),
and its trials row is derived from both (:func:`orchestrator.search.row.trial_row`), so
the path trial -> result -> judgement -> row -> sampler reads in one direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Optional

from orchestrator.failures import Failure, TrialStatus
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.pricing import UnitMetrics
from orchestrator.measure.columns import EngineColumns, ProbeColumns, SessionColumns
from orchestrator.measure.confidence import Interval, intervals_to_columns
from orchestrator.measure.harness import HarnessVerdict
from orchestrator.measure.metrics import START_PHASE_NAMES, LoadMetrics
from orchestrator.measure.records import RequestRecord
from orchestrator.measure.warmup import WarmupOutcome


@dataclass(frozen=True)
class PhaseTimings:
    """Seconds spent in each phase (None: the phase did not happen)."""

    queue_s: Optional[float] = None  # waiting for the trial's GPUs in the run's ledger
    startup_s: Optional[float] = None  # deploy until the endpoint answered
    load_window_s: Optional[float] = None  # warm-up + measured load (+ capacity levels)
    teardown_s: Optional[float] = None
    wall_time_s: Optional[float] = None  # the whole trial, as the trial process saw it

    @property
    def overhead_s(self) -> Optional[float]:
        """Wall time outside start-up, load and queueing (None without a load window)."""
        if self.load_window_s is None or self.wall_time_s is None:
            return None
        return max(0.0, self.wall_time_s - (self.startup_s or 0.0) - self.load_window_s - (self.queue_s or 0.0))

    def columns(self) -> dict[str, Optional[float]]:
        return {"queue_s": self.queue_s, "startup_s": self.startup_s, "load_window_s": self.load_window_s,
                "teardown_s": self.teardown_s, "wall_time_s": self.wall_time_s, "overhead_s": self.overhead_s}


@dataclass(frozen=True)
class CapacityOutcome:
    """A capacity search's answer: the highest rate within the SLOs (an estimate inside an
    interval at ``confidence``: ``low`` was decided met, ``high`` decided missed, None when no
    level was), and its levels' curve."""

    capacity_rps: Optional[float]
    capacity_goodput: Optional[float]
    levels: int
    stop_reason: str
    level_of_row: int  # the level whose metrics are the row's
    curve: tuple[tuple[float, float, bool], ...]  # (offered rate, served req/s, met)
    low: Optional[float] = None
    high: Optional[float] = None
    confidence: Optional[float] = None
    conditioned: Optional[bool] = None  # False: the binding margin hardly grows with the rate (see capacity_fit)
    binding: Optional[str] = None  # the SLO metric whose margin crosses zero first
    margin_slope: Optional[float] = None  # its growth per unit of log rate at the crossing
    margin_sd: Optional[float] = None  # its noise there (log units, start noise included)
    contradictions: int = 0  # levels met at a rate above a level missed
    windows: int = 0  # load windows measured (levels and their measurements again)


@dataclass(frozen=True)
class TrialResult:
    """One trial, end to end: who it was, what ran, how it ended and what it measured."""

    # identity
    run_id: str
    trial_id: str
    trial_number: int
    params: Mapping[str, Any]
    args: Optional[EngineArgs]
    started_at: datetime
    finished_at: datetime
    # outcome
    status: TrialStatus
    failure: Optional[Failure] = None  # for a completed trial: a warning (e.g. a teardown leak)
    # measurements (a trial that never ran a load has none)
    metrics: Optional[LoadMetrics] = None
    telemetry: EngineColumns = field(default_factory=EngineColumns)  # engine histograms/gauges, NVML
    warmup: Optional[WarmupOutcome] = None  # the warm-up before the (first) measured window
    harness: Optional[HarnessVerdict] = None  # was the serving path or the client the limit?
    # What the engine said of its start (endpoint, command line, KV-cache size, start phases, ...): recorded
    # in the row's extra_json as the engine gave it; the KV-cache size and the start phases are columns.
    engine_facts: Mapping[str, Any] = field(default_factory=dict)
    timings: PhaseTimings = PhaseTimings()
    capacity: Optional[CapacityOutcome] = None
    records: tuple[RequestRecord, ...] = ()
    levels: tuple[Mapping[str, Any], ...] = ()  # capacity search: one levels-table row per level
    unit_metrics: Optional[UnitMetrics] = None  # per GPU and per dollar (orchestrator.hardware.pricing)
    probe: ProbeColumns = field(default_factory=ProbeColumns)  # agreement with the baseline (orchestrator.trial.probe)
    intervals: Mapping[str, Interval] = field(default_factory=dict)  # where each metric's true value lies
    confidence: Optional[float] = None  # ... at this confidence (orchestrator.measure.confidence)
    measurement: int = 0  # which measurement of its configuration (> 0: measured again, racing)
    sessions: SessionColumns = field(default_factory=SessionColumns)  # multi-turn session columns (session_metrics)
    turns: tuple[Mapping[str, Any], ...] = ()  # multi-turn: one row per turn index (session_metrics.turn_table)
    # The bootstrap draws of the compared metrics (orchestrator.results.paired), and where the start noise
    # in them comes from.
    draws: Mapping[str, Any] = field(default_factory=dict)
    draws_seed: Optional[int] = None
    start_noise: Optional[str] = None

    @property
    def completed(self) -> bool:
        return self.status is TrialStatus.COMPLETED

    def measured(self) -> dict[str, Any]:
        """Every measured value by column name: what the judge and the row read."""
        out: dict[str, Any] = dict(self.metrics.as_dict()) if self.metrics is not None else {}
        out.update(self.telemetry)
        if self.capacity is not None:
            cap = self.capacity
            out["capacity_rps"] = cap.capacity_rps
            out["capacity_goodput"] = cap.capacity_goodput
            out["capacity_conditioned"] = cap.conditioned
            out["capacity_binding"] = cap.binding
            out["capacity_margin_slope"] = cap.margin_slope
            out["capacity_margin_sd"] = cap.margin_sd
            out["capacity_contradictions"] = float(cap.contradictions)
        for k in ("kv_cache_tokens", "kv_cache_gib", *START_PHASE_NAMES):
            if self.engine_facts.get(k) is not None:
                out[k] = float(self.engine_facts[k])
        if self.engine_facts.get("start_compile_cached") is not None:
            out["start_compile_cached"] = bool(self.engine_facts["start_compile_cached"])
        out.update(self.timings.columns())
        if self.warmup is not None:
            out.update(self.warmup.columns())
        if self.harness is not None:
            out.update(self.harness.columns())
        if self.unit_metrics is not None:
            out.update(self.unit_metrics.columns())
        out.update(self.probe)
        out.update(self.sessions)
        out.update(intervals_to_columns(self.intervals))
        if self.intervals:
            out["confidence"] = self.confidence
        return out
