"""Racing: before a run names its winner, measure again the configurations it cannot tell apart.

A single measurement of a configuration is one draw of the workload; two configurations whose
intervals overlap are tied within that noise (:mod:`orchestrator.results.ties`). The last
``search.remeasure`` trials of a run's budget (and any trial the run would otherwise leave unused
because its search stopped) go to the **leading contenders**: the best configuration by the first
objective and every feasible configuration tied with it, pooled over their measurements. Each such
trial measures the contender measured least often (the best first among equals) again, with a
workload seed of its own (:func:`orchestrator.workload.synthesis.measurement_seed`), instead of a
new draw from a far corner of the space. Once the best is ahead of every other beyond the noise,
racing ends and the sampler has the budget back.

A :class:`Racer` is state the searcher keeps (results it was told, trials it started); the
choice itself is a pure function of that state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np

from orchestrator.failures import TrialStatus
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, z_of
from orchestrator.numbers import finite_float
from orchestrator.results.ties import bounds, pool

__all__ = ["REMEASURE_ATTR", "REMEASURE_KEY", "Racer", "remeasure_trials"]

REMEASURE_KEY = "__measurement"  # in a trial's config: which measurement of its configuration it is
REMEASURE_ATTR = "remeasure"  # Optuna user attr of a trial queued to measure a configuration again


def remeasure_trials(study) -> int:
    """Trials of the budget kept for racing (``search.remeasure``; default an eighth, 0 below 8)."""
    if study.search.remeasure is not None:
        return study.search.remeasure
    return study.budget.trials // 8


def _key(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, default=str)


@dataclass
class Racer:
    """The racing state of one run: ``left`` trials it may still start, ``reserve`` of them racing's."""

    metric: str
    maximize: bool
    left: int
    reserve: int
    confidence: float = DEFAULT_CONFIDENCE
    params: dict[str, dict] = field(default_factory=dict)
    measured: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)  # key -> (v, low, high)
    started: dict[str, int] = field(default_factory=dict)  # key -> measurements started (told or not)

    @classmethod
    def for_study(cls, study, trials_left: int) -> Optional["Racer"]:
        reserve = remeasure_trials(study)
        if reserve <= 0:
            return None
        first = study.objectives[0]
        confidence = study.capacity.confidence if study.capacity is not None else DEFAULT_CONFIDENCE
        return cls(first.metric, first.resolved_direction == "maximize", trials_left, reserve, confidence)

    def trial_started(self, params: Mapping[str, Any]) -> None:
        self.left -= 1
        k = _key(params)
        self.params.setdefault(k, dict(params))
        self.started[k] = self.started.get(k, 0) + 1

    def observe(self, params: Mapping[str, Any], feasible: bool, value: Optional[float],
                low: Optional[float] = None, high: Optional[float] = None) -> None:
        """A finished trial: only feasible ones with a value can lead."""
        k = _key(params)
        self.params.setdefault(k, dict(params))
        self.started.setdefault(k, 1)
        if not feasible or value is None or not np.isfinite(value):
            return
        lo = value if low is None else min(low, value)
        hi = (value if low is None else np.inf) if high is None else max(high, value)
        self.measured.setdefault(k, []).append((float(value), float(lo), float(hi)))

    def observe_rows(self, frame) -> None:
        """Trials recorded before (a resumed run): their rows."""
        if frame is None or len(frame) == 0 or self.metric not in frame.columns:
            return
        low, high = bounds(frame, self.metric)
        for (_, row), lo, hi in zip(frame.iterrows(), low, high):
            params = json.loads(row["params_json"]) if isinstance(row.get("params_json"), str) else None
            if params is None:
                continue
            feasible = row.get("status") == TrialStatus.COMPLETED and bool(row.get("feasible"))
            self.observe(params, feasible, finite_float(row.get(self.metric)), float(lo), float(hi))

    def contenders(self) -> list[str]:
        """The best configuration (pooled measurements) first, then those tied with it."""
        z = z_of(self.confidence)
        pooled = {}
        for k, ms in self.measured.items():
            a = np.array(ms)
            got = pool(a[:, 0], a[:, 1], a[:, 2], z)
            if got is not None:
                pooled[k] = got
        if not pooled:
            return []
        best = max(pooled, key=lambda k: pooled[k][0] if self.maximize else -pooled[k][0])
        _, lo, hi = pooled[best]
        tied = [k for k, (_, l2, h2) in pooled.items() if k != best and l2 <= hi and lo <= h2]
        return [best] + sorted(tied, key=lambda k: -pooled[k][0] if self.maximize else pooled[k][0])

    def next_remeasure(self, stopping: bool = False) -> Optional[tuple[dict, int]]:
        """``(params, measurement index)`` of the next trial to race, or None: not racing's turn
        (more than ``reserve`` trials left and the search not ``stopping``), or nothing tied."""
        if self.left <= 0 or (self.left > self.reserve and not stopping):
            return None
        lead = self.contenders()
        if len(lead) < 2:
            return None
        k = min(lead, key=lambda c: (self.started.get(c, 1), lead.index(c)))
        return dict(self.params[k]), self.started.get(k, 1)
