"""The study's goals: objectives (what to optimise) and constraints (the SLOs), read from text.

``parse_objective`` reads an objective string for a study and for the Pareto front alike;
every metric name is checked against :func:`orchestrator.measure.metrics.known_metric_names`.
"""

from __future__ import annotations

import difflib
import re
from typing import Literal, Optional

from pydantic import field_validator, model_validator

from orchestrator.measure import limits
from orchestrator.measure.metrics import DIRECTIONS, default_direction, known_metric_names
from orchestrator.strict_model import StrictModel

__all__ = ["Constraint", "Objective", "parse_objective"]


def parse_objective(text: str) -> tuple[str, Optional[str]]:
    """``"maximize NAME"`` -> ``(NAME, "maximize")``; a bare ``"NAME"`` -> ``(NAME, None)`` (default direction)."""
    parts = text.split()
    if len(parts) == 2 and parts[0] in DIRECTIONS:
        return parts[1], parts[0]
    if len(parts) == 1:
        return parts[0], None
    raise ValueError(f"cannot read objective {text!r}; expected 'COLUMN' or 'maximize|minimize COLUMN'")


class Objective(StrictModel):
    metric: str
    direction: Optional[Literal["maximize", "minimize"]] = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        if isinstance(data, str):  # "maximize output_throughput"
            try:
                metric, direction = parse_objective(data)
            except ValueError:  # reported by the metric check, with the closest known metric
                return {"metric": data}
            return {"metric": metric} | ({"direction": direction} if direction else {})
        return data

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        return _check_metric(v)

    @property
    def resolved_direction(self) -> str:
        return self.direction or default_direction(self.metric)


_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


class Constraint(StrictModel):
    """An SLO on a trial metric, e.g. ``ttft_p99_ms <= 200``."""

    metric: str
    op: Literal["<=", ">=", "<", ">"]
    value: float

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data):
        if isinstance(data, str):
            m = _CONSTRAINT_RE.match(data)
            if not m:
                raise ValueError(f"cannot parse {data!r}; expected 'METRIC <= NUMBER' (or >=, <, >)")
            return {"metric": m.group(1), "op": m.group(2), "value": float(m.group(3))}
        return data

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        return _check_metric(v)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"

    def violation(self, value: Optional[float]) -> float:
        """Optuna constraint value: <= 0 when met, else the relative excess (:func:`orchestrator.measure.limits.violation`)."""
        return limits.violation(self.op, self.value, value)

    def met(self, value: Optional[float]) -> bool:
        return limits.met(self.op, self.value, value)


def _check_metric(v: str) -> str:
    names = known_metric_names()
    if v not in names:
        close = difflib.get_close_matches(v, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown metric{hint}; allowed: {', '.join(sorted(names))}")
    return v
