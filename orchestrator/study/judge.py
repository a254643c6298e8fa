"""The one judge of a trial: its objective values, each SLO's margin, and whether it is feasible.

Everything that asks "does this trial meet the SLOs?" or "what does the sampler see?" asks
here: the trials row (``feasible``, ``constraint_violation``), the Pareto front and
``recommend`` (:func:`feasible_mask`), a capacity level's verdict, the progress line, and
what Optuna is told, live or on resume (:meth:`Judgement.optuna_values`,
:meth:`Judgement.optuna_constraints`).

The boundary, defined once (:func:`orchestrator.measure.limits.violation`): ``<=`` and ``>=`` are met *at* the limit,
``<`` and ``>`` are not. A constraint's value is its relative excess over the limit
(<= 0: met), which is what Optuna's constrained samplers expect; a strict limit reached
exactly gets the smallest positive excess, so the sampler and every reader agree that it
missed. A missing or non-finite metric never meets a constraint.

Pure: no I/O, no Ray, no Optuna import; the study's types are only annotations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import numpy as np

from orchestrator.failures import TrialStatus
from orchestrator.measure.limits import met, violation
from orchestrator.numbers import finite_float

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from orchestrator.study.spec import Constraint, Study

# Optuna needs a number for every objective; a trial that measured none reports these.
# The constraint values (not these) are what tell the sampler the point was infeasible.
PENALTY = {"maximize": 0.0, "minimize": 1e9}
# The sampler's constraint that the engine started and was measured (0: yes, 1: no).
START_CONSTRAINT = "engine_started"
@dataclass(frozen=True)
class ConstraintCheck:
    """One SLO against one measured value."""

    constraint: "Constraint"
    value: Optional[float]
    violation: float

    @property
    def met(self) -> bool:
        return self.violation <= 0

    def describe(self) -> str:
        got = "none" if self.value is None else f"{self.value:.4g}"
        return f"{self.constraint} (got {got})"


def check(constraint: "Constraint", value: Any) -> ConstraintCheck:
    return ConstraintCheck(constraint, finite_float(value), violation(constraint.op, constraint.value, value))


def check_all(constraints: Sequence["Constraint"], metrics: Mapping[str, Any]) -> tuple[ConstraintCheck, ...]:
    return tuple(check(c, metrics.get(c.metric)) for c in constraints)


@dataclass(frozen=True)
class Judgement:
    """What a finished trial is worth, to the rows, the front and the sampler."""

    completed: bool
    directions: tuple[str, ...]
    objectives: tuple[Optional[float], ...]  # measured values (None: not measured)
    checks: tuple[ConstraintCheck, ...]

    @property
    def feasible(self) -> bool:
        """Completed, and every SLO met."""
        return self.completed and all(c.met for c in self.checks)

    @property
    def constraint_violation(self) -> Optional[float]:
        """The largest margin (<= 0: all met; 0 without SLOs); None for a trial that was not measured."""
        if not self.completed:
            return None
        return max((c.violation for c in self.checks), default=0.0)

    def columns(self) -> dict[str, Any]:
        """The trials row's judgement columns."""
        return {"feasible": self.feasible, "constraint_violation": self.constraint_violation}

    def optuna_values(self) -> list[float]:
        return [PENALTY[d] if v is None or not self.completed else v
                for d, v in zip(self.directions, self.objectives)]

    def optuna_constraints(self) -> dict[str, float]:
        """``engine_started`` and ``slo<i>`` (<= 0 satisfied); a trial not measured misses all."""
        out = {START_CONSTRAINT: 0.0 if self.completed else 1.0}
        for i, c in enumerate(self.checks):
            out[f"slo{i}"] = c.violation if self.completed else 1.0
        return out

    def reasons(self) -> list[str]:
        return [c.describe() for c in self.checks if not c.met]


def judge(study: "Study", metrics: Mapping[str, Any], status: Any) -> Judgement:
    """Judge a trial's metrics (a row, or any mapping of metric name -> value) under its status."""
    return judge_against(study.objectives, study.constraints, metrics, status)


def judge_against(objectives: Sequence[Any], constraints: Sequence["Constraint"], metrics: Mapping[str, Any],
                  status: Any) -> Judgement:
    """:func:`judge` with the objectives and SLOs given directly (no study at hand)."""
    completed = isinstance(status, str) and status == TrialStatus.COMPLETED  # a str enum, or a row's text
    return Judgement(
        completed=completed,
        directions=tuple(o.resolved_direction for o in objectives),
        objectives=tuple(finite_float(metrics.get(o.metric)) for o in objectives),
        checks=check_all(constraints, metrics),
    )


def judge_row(study: "Study", row: Mapping[str, Any]) -> Judgement:
    return judge(study, row, row.get("status"))


def constraints_mask(df: "pd.DataFrame", constraints: Sequence["Constraint"]) -> np.ndarray:
    """Rows of ``df`` meeting every constraint, by :func:`violation` (a missing column never meets)."""
    ok = np.ones(len(df), dtype=bool)
    for c in constraints:
        if c.metric not in df.columns:
            ok &= False
            continue
        ok &= np.fromiter((met(c.op, c.value, v) for v in df[c.metric].to_numpy(dtype=object)),
                          dtype=bool, count=len(df))
    return ok


def feasible_mask(df: "pd.DataFrame", constraints: Sequence["Constraint"] = ()) -> np.ndarray:
    """Completed rows (if ``df`` has a ``status`` column) that meet every constraint."""
    ok = constraints_mask(df, constraints)
    if "status" in df.columns:
        ok &= (df["status"].astype(object) == TrialStatus.COMPLETED).to_numpy(dtype=bool)
    return ok
