"""Racing: before a run names its winner, measure again the configurations it cannot tell apart.

A single measurement of a configuration is one draw of the workload and one engine start; two
configurations whose paired difference straddles the study's equivalence margin are **tied**: not
yet told apart (:mod:`orchestrator.results.paired`; equivalent ones are decided, and need nothing
more). The last ``search.remeasure`` trials of a run's budget (and any trial the run would otherwise
leave unused because its search stopped) go to the **leading contenders**: the best configuration by
the first objective and every feasible configuration tied with it, pooled over their measurements.
Each such trial measures the contender measured least often (the best first among equals) again, on
a new engine start, with the workload seed of its k-th measurement
(:func:`orchestrator.workload.synthesis.measurement_seed`): the leader and the runner-up measured a
k-th time replay the same requests, so each round of racing is one more paired comparison between
them (pooled draw by draw with the rounds before). Once the best is ahead of every other or
equivalent to it, racing ends and the sampler has the budget back.

A :class:`Racer` is state the searcher keeps (results it was told, trials it started); the
choice itself is a pure function of that state. :class:`RacingPart` is racing as a part of the search
(:mod:`orchestrator.search.parts`): it queues racing's trial when it is racing's turn, or when the
search stops, and tells its :class:`Racer` what started and what was measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np

from orchestrator.failures import TrialStatus
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, z_of
from orchestrator.numbers import finite_float
from orchestrator.results.paired import DEFAULT_EQUIVALENCE_MARGIN, MEASUREMENTS, TIED, compare
from orchestrator.results.ties import bounds, pool
from orchestrator.search.parts import Outcome, SearchPart, waiting

__all__ = ["REMEASURE_ATTR", "REMEASURE_KEY", "Racer", "RacingPart", "remeasure_trials"]

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
    margin: float = DEFAULT_EQUIVALENCE_MARGIN
    params: dict[str, dict] = field(default_factory=dict)
    measured: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)  # key -> (v, low, high)
    draws: dict[str, list[Optional[str]]] = field(default_factory=dict)  # key -> each measurement's draws_json
    started: dict[str, int] = field(default_factory=dict)  # key -> measurements started (told or not)

    @classmethod
    def for_study(cls, study, trials_left: int) -> Optional["Racer"]:
        reserve = remeasure_trials(study)
        if reserve <= 0:
            return None
        first = study.objectives[0]
        confidence = study.capacity.confidence if study.capacity is not None else DEFAULT_CONFIDENCE
        return cls(first.metric, first.resolved_direction == "maximize", trials_left, reserve, confidence,
                   study.analysis.equivalence_margin)

    def trial_started(self, params: Mapping[str, Any]) -> None:
        self.left -= 1
        k = _key(params)
        self.params.setdefault(k, dict(params))
        self.started[k] = self.started.get(k, 0) + 1

    def observe(self, params: Mapping[str, Any], feasible: bool, value: Optional[float],
                low: Optional[float] = None, high: Optional[float] = None, draws_json: Optional[str] = None) -> None:
        """A finished trial: only feasible ones with a value can lead (``draws_json``: its paired draws)."""
        k = _key(params)
        self.params.setdefault(k, dict(params))
        self.started.setdefault(k, 1)
        if not feasible or value is None or not np.isfinite(value):
            return
        lo = value if low is None else min(low, value)
        hi = (value if low is None else np.inf) if high is None else max(high, value)
        self.measured.setdefault(k, []).append((float(value), float(lo), float(hi)))
        self.draws.setdefault(k, []).append(draws_json if isinstance(draws_json, str) else None)

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
            self.observe(params, feasible, finite_float(row.get(self.metric)), float(lo), float(hi),
                         row.get("draws_json"))

    def _row(self, k: str, pooled: tuple[float, float, float]) -> dict[str, Any]:
        """Configuration ``k`` as a row :func:`orchestrator.results.paired.compare` reads: its pooled value
        and interval, and each measurement (value, interval, draws) to pair with another's."""
        m = self.metric
        rows = [{m: v, f"{m}_low": lo, f"{m}_high": (None if np.isinf(hi) else hi), "draws_json": d}
                for (v, lo, hi), d in zip(self.measured[k], self.draws.get(k, []))]
        value, lo, hi = pooled
        out = {m: value, f"{m}_low": lo, f"{m}_high": None if np.isinf(hi) else hi,
               "draws_json": rows[-1]["draws_json"] if rows else None}
        if len(rows) > 1:
            out[MEASUREMENTS] = rows
        return out

    def contenders(self) -> list[str]:
        """The best configuration (pooled measurements) first, then those not yet told apart from it
        (their paired difference straddles the equivalence margin)."""
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
        direction = "maximize" if self.maximize else "minimize"
        best_row = self._row(best, pooled[best])
        tied = []
        for k in pooled:
            if k == best:
                continue
            c = compare(self._row(k, pooled[k]), best_row, self.metric, direction, margin=self.margin,
                        confidence=self.confidence)
            if c is not None and c.verdict == TIED:
                tied.append(k)
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


class RacingPart(SearchPart):
    """Racing in the search: a racing trial goes on Optuna's queue before the sampler is asked."""

    def __init__(self, racer: Racer):
        self.racer = racer

    def queue(self, ostudy, pending) -> bool:
        self._enqueue(ostudy, stopping=False)
        return True  # racing never holds the sampler back

    def last_call(self, ostudy) -> bool:
        return self._enqueue(ostudy, stopping=True)

    def _enqueue(self, ostudy, stopping: bool) -> bool:
        """Queue the next racing trial, if it is racing's turn (or the search is ``stopping``)."""
        if waiting(ostudy):
            return True  # queued already: it goes first
        race = self.racer.next_remeasure(stopping)
        if race is None:
            return False
        params, k = race
        ostudy.enqueue_trial(params, user_attrs={REMEASURE_ATTR: k}, skip_if_exists=False)
        return True

    def started(self, trial, params) -> dict[str, Any]:
        self.racer.trial_started(params)
        measurement = trial.user_attrs.get(REMEASURE_ATTR)
        return {REMEASURE_KEY: int(measurement)} if measurement else {}

    def observe(self, params, outcome: Outcome) -> None:
        if outcome.screened:
            return  # never measured
        r, metric = outcome.result, self.racer.metric
        self.racer.observe(params, bool(r.get("feasible")), r.get(metric), r.get(f"{metric}_low"),
                           r.get(f"{metric}_high"), r.get("draws_json"))

    def observe_rows(self, trials, levels) -> None:
        self.racer.observe_rows(trials)
