"""The capacity a trial must beat to matter: its load phase stops once it is decided below it.

A study whose one objective is ``maximize capacity_rps`` (or ``capacity_rps_per_gpu``) compares every
trial with the best so far. A capacity search that has found a level decided missed at or below the best
trial's lower bound (or whose levels' fit lies below it) has decided that comparison: this configuration
is worse, and the windows left would only say by how much. The search then stops
(:func:`orchestrator.trial.capacity.next_rate`, ``beat``), and the row says why. What this part tells the
trial is that lower bound, through the trial's config (:data:`BEAT_KEY`), per trial in absolute
requests per second (a per-GPU objective times the trial's GPUs).

Off with ``capacity.stop_below_best: false``, for studies of several objectives (a configuration worse
on capacity may still be on the front) and for racing's measurements again (they exist to pin a leader's
number down).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from orchestrator.search.parts import Outcome, Params, SearchPart

BEAT_KEY = "__beat_rps"  # in a trial's config: the capacity (req/s) it must beat to matter
METRICS = ("capacity_rps", "capacity_rps_per_gpu")


def applies(study) -> bool:
    """One objective, a capacity to maximize, and the capacity search's rule on."""
    objectives = study.objectives
    return (study.capacity is not None and study.capacity.stop_below_best and len(objectives) == 1
            and objectives[0].metric in METRICS and objectives[0].resolved_direction == "maximize")


class BestCapacity(SearchPart):
    """Keeps the best lower bound of the objective among feasible trials, and hands it to each new trial."""

    def __init__(self, study):
        self.study = study
        self.metric = study.objectives[0].metric
        self.best_low: Optional[float] = None  # of the objective, as measured (per GPU where it is)

    def _see(self, feasible: bool, low: Any) -> None:
        try:
            low = float(low)
        except (TypeError, ValueError):
            return
        if feasible and math.isfinite(low) and low > 0 and (self.best_low is None or low > self.best_low):
            self.best_low = low

    def observe(self, params: Params, outcome: Outcome) -> None:
        if not outcome.screened:
            r = outcome.result
            self._see(bool(r.get("feasible")), r.get(f"{self.metric}_low"))

    def observe_rows(self, trials, levels) -> None:
        column = f"{self.metric}_low"
        if trials is None or len(trials) == 0 or column not in trials.columns:
            return
        for _, row in trials.iterrows():
            self._see(row.get("status") == "completed" and bool(row.get("feasible", True)), row.get(column))

    def started(self, trial, params: Params) -> dict[str, Any]:
        if self.best_low is None:
            return {}
        scale = 1
        if self.metric == "capacity_rps_per_gpu":
            scale = self.study.engine_args(params).gpus
        return {BEAT_KEY: self.best_low * scale}
