"""The ``capacity`` section: how a capacity search measures one deployment (see :mod:`orchestrator.trial.capacity`)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator, model_validator

from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, LATENCY_INTERVAL_METRICS
from orchestrator.measure.metrics import LOAD_METRIC_NAMES
from orchestrator.strict_model import StrictModel
from orchestrator.study.goals import Constraint
from orchestrator.workload.spec import MAX_RATE

__all__ = ["CapacitySpec", "MAX_LEVEL_REQUESTS", "SaturationSettings"]


class SaturationSettings(StrictModel):
    """When a capacity level counts as saturated (queue growing without bound) and stops early."""

    window_s: float = Field(default=5.0, gt=0, description="trailing window the backlog growth is measured over "
                                                           "(at least twice the service time)")
    check_interval_s: float = Field(default=0.5, gt=0, le=60)
    min_growth: int = Field(default=8, ge=1, description="the backlog must grow by at least this many requests")
    growth_fraction: float = Field(default=0.25, gt=0, le=1,
                                   description="... and by this share of the requests sent in the window")
    confirm: int = Field(default=2, ge=1, le=100, description="consecutive windows the backlog must grow in")


MAX_LEVEL_REQUESTS = 1_000_000  # as workload.num_requests


class CapacitySpec(StrictModel):
    """Capacity search: one deployment, several load levels, the highest rate that meets the SLOs."""

    start_rate: Optional[float] = Field(default=None, gt=0, description="first level (default: the workload's rate)")
    min_rate: float = Field(default=0.1, gt=0)
    max_rate: float = Field(default=1000.0, gt=0, le=MAX_RATE)
    growth: float = Field(default=2.0, gt=1, le=16, description="rate factor between levels until one fails")
    tolerance: float = Field(default=0.05, gt=0, lt=1,
                             description="stop when (lowest failing - highest passing) / lowest failing <= this")
    max_levels: int = Field(default=10, ge=1, le=100)
    requests_per_level: Optional[int] = Field(default=None, ge=1, le=MAX_LEVEL_REQUESTS,
                                              description="default: workload.num_requests")
    level_duration_s: Optional[float] = Field(default=None, gt=0,
                                              description="requests per level = rate x this (instead of a count)")
    min_requests: int = Field(default=20, ge=1, le=MAX_LEVEL_REQUESTS,
                              description="fewest requests of a level (with level_duration_s)")
    max_error_rate: float = Field(default=0.0, ge=0, lt=1, description="share of failed requests a level may have")
    stop_below_best: bool = Field(
        default=True, description="stop a trial's search once its capacity is decided below the best trial's lower "
                                  "bound so far (studies whose one objective is the capacity; not racing's measurements)")
    confidence: float = Field(default=DEFAULT_CONFIDENCE, ge=0.5, le=0.999,
                              description="a level's verdict is decided when each SLO metric's interval at this "
                                          "confidence lies on one side of its limit; the capacity interval holds it")
    repeats: int = Field(default=1, ge=0, le=10,
                         description="times an undecided level is measured again (fresh arrivals and prompts, "
                                     "pooled with what it measured) before it is left undecided")
    max_windows: Optional[int] = Field(default=None, ge=1, le=1000,
                                       description="load windows (levels and their measurements again) a search "
                                                   "may spend in all; default: max_levels x (1 + repeats)")
    window_noise: Optional[dict[str, float]] = Field(
        default=None, description="a latency metric's log-scale standard deviation between windows at one rate "
                                  "beyond what a window's requests show (e.g. {ttft_p99_ms: 0.27}); widens its "
                                  "intervals. Default: measured for the engine (none for the simulator); {}: none")
    start_noise: Optional[dict[str, float]] = Field(
        default=None, description="a latency metric's log-scale standard deviation between engine starts of one "
                                  "configuration (e.g. {itl_p99_ms: 0.12}), and the engine's speed's "
                                  "(capacity_rps: the whole curve along the rate); widens the capacity's "
                                  "interval and every comparison. Default: measured for the engine (none for "
                                  "the simulator); {}: none")
    slo: Optional[list[Constraint]] = Field(
        default=None, description="what a level must meet; default: the study's constraints on load metrics")
    saturation: SaturationSettings = SaturationSettings()

    @field_validator("slo")
    @classmethod
    def _load_metrics_only(cls, v):
        for c in v or []:
            if c.metric not in LOAD_METRIC_NAMES:
                raise ValueError(f"{c.metric} is not measured per level; use a load metric "
                                 f"(e.g. ttft_p99_ms, tpot_p50_ms, e2el_p99_ms, goodput)")
        return v

    @field_validator("window_noise", "start_noise")
    @classmethod
    def _latency_metrics_only(cls, v, info):
        allowed = LATENCY_INTERVAL_METRICS + (("capacity_rps",) if info.field_name == "start_noise" else ())
        for metric, sd in (v or {}).items():
            if metric not in allowed:
                raise ValueError(f"{metric!r} has no interval to widen; use one of {', '.join(allowed)}")
            if not 0 <= sd <= 2:
                raise ValueError(f"{metric}: {sd:g} is not a log-scale standard deviation in [0, 2]")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.min_rate >= self.max_rate:
            raise ValueError(f"min_rate ({self.min_rate:g}) must be < max_rate ({self.max_rate:g})")
        if self.requests_per_level is not None and self.level_duration_s is not None:
            raise ValueError("give requests_per_level or level_duration_s, not both")
        if self.start_rate is not None and not self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError(f"start_rate ({self.start_rate:g}) must lie in [min_rate, max_rate]")
        if self.level_duration_s is not None and self.max_rate * self.level_duration_s > MAX_LEVEL_REQUESTS:
            raise ValueError(f"level_duration_s ({self.level_duration_s:g}) at max_rate ({self.max_rate:g}) is "
                             f"{self.max_rate * self.level_duration_s:.3g} requests a level, more than "
                             f"{MAX_LEVEL_REQUESTS:,}; lower one of them")
        return self


# Keys added after studies were recorded: a fingerprint hashes them only when set away from these,
# so that a study recorded before them still resumes.
CAPACITY_DEFAULTS_ADDED_LATER = {"confidence": DEFAULT_CONFIDENCE, "repeats": 1, "max_windows": None,
                                 "window_noise": None, "start_noise": None, "stop_below_best": True}
