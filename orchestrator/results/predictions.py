"""A ``search.fidelity: sim`` study's predictions next to its measurements.

Every real trial of such a study carries the prediction it was picked on, ``predicted_<m>``, and
the prediction's stated error, ``predicted_<m>_low`` .. ``predicted_<m>_high``: where the simulator
says the measurement falls, from its out-of-sample error on the study's GPU
(:mod:`orchestrator.search.fidelity.margin`). A prediction is **within its stated error** when the
measurement falls in that range, ends included; a trial's predictions are within when every one
of them is. The progress line after each trial and ``orchestrator show`` read them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import pandas as pd

from orchestrator.failures import TrialStatus
from orchestrator.numbers import finite_float


@dataclass(frozen=True)
class PredictionCheck:
    """One metric of one trial: what the simulator predicted, its stated error, what was measured."""

    metric: str
    predicted: float
    low: float
    high: float
    measured: float

    @property
    def within(self) -> bool:
        return self.low <= self.measured <= self.high

    @property
    def error(self) -> float:
        """(measured - predicted) / predicted, as the row's ``prediction_error_<m>``."""
        return (self.measured - self.predicted) / abs(self.predicted)


@dataclass(frozen=True)
class PredictionShare:
    """How many trials' predictions fell within their stated error."""

    within: int  # trials whose every checked prediction fell within its stated error
    trials: int  # trials with at least one prediction to check
    by_metric: dict[str, tuple[int, int]]  # metric -> (within, checked)


def predicted_metrics(columns: Iterable[str]) -> list[str]:
    """The metrics with a stated error among ``columns`` (a row's keys or a frame's columns), in order."""
    return [c[len("predicted_"):-len("_low")] for c in columns if c.startswith("predicted_") and c.endswith("_low")]


def prediction_checks(row: Mapping[str, Any]) -> list[PredictionCheck]:
    """``row``'s predictions next to its measurements: each metric with a prediction, a stated error and
    a measurement."""
    out = []
    for m in predicted_metrics(row.keys()):
        values = [finite_float(row.get(c)) for c in (f"predicted_{m}", f"predicted_{m}_low", f"predicted_{m}_high", m)]
        if None not in values:
            out.append(PredictionCheck(m, *values))  # type: ignore[arg-type] - no None left
    return out


def prediction_share(trials: pd.DataFrame) -> Optional[PredictionShare]:
    """Of the completed trials with a prediction to check, how many fell within their stated error
    (None: no such trial)."""
    if trials is None or len(trials) == 0 or not predicted_metrics(trials.columns):
        return None
    done = trials[trials["status"] == TrialStatus.COMPLETED] if "status" in trials else trials
    within = checked = 0
    by_metric: dict[str, list[int]] = {m: [0, 0] for m in predicted_metrics(trials.columns)}
    for row in done.to_dict("records"):
        checks = prediction_checks(row)
        if not checks:
            continue
        checked += 1
        within += all(c.within for c in checks)
        for c in checks:
            by_metric[c.metric][0] += c.within
            by_metric[c.metric][1] += 1
    if not checked:
        return None
    return PredictionShare(within, checked, {m: (w, n) for m, (w, n) in by_metric.items() if n})


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def describe_range(low: float, high: float) -> str:
    return f"{_num(low)}–{_num(high)}"


def describe_check(c: PredictionCheck) -> str:
    """``capacity_rps 47 predicted, 50.1 measured (+6.6%, within 34.4–64.3)``."""
    return (f"{c.metric} {_num(c.predicted)} predicted, {_num(c.measured)} measured "
            f"({c.error:+.1%}, {'within' if c.within else 'outside'} {describe_range(c.low, c.high)})")


def describe_share(share: PredictionShare) -> str:
    """``predictions within their stated error: 7 of 9 trials (capacity_rps 8 of 9, ttft_p99_ms 7 of 9)``."""
    return f"predictions within their stated error: {share.within} of {share.trials} trials ({describe_by_metric(share)})"


def describe_by_metric(share: PredictionShare) -> str:
    """``capacity_rps 8 of 9, ttft_p99_ms 7 of 9``."""
    return ", ".join(f"{m} {w} of {n}" for m, (w, n) in share.by_metric.items())
