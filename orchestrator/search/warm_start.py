"""Warm start: earlier results' best configurations, mapped into this study's space, tried first.

Pure functions over pandas frames and the search space. A point from another study
may name parameters this space does not have (dropped), values outside its ranges
(clamped to the range and snapped to its step), numbers between categorical choices
(the nearest choice, on a log scale for positive numbers), or parameters this space
switches off with a ``when`` condition (dropped). A parameter the point lacks is
left to the sampler. Points equal to each other or to a trial the study already has
are skipped.
"""

from __future__ import annotations

import json
import logging
import math
from numbers import Real
from typing import Any, Iterable, Optional, Sequence

import pandas as pd

from orchestrator.results import load_trials, pareto_front
from orchestrator.study.space import CategoricalParam, FixedParam, FloatParam, IntParam, SearchSpace

log = logging.getLogger(__name__)

_DROP = object()


def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(float(v))


def snap_value(spec, value: Any) -> Any:
    """``value`` moved into ``spec``'s domain, or ``_DROP`` if it has no counterpart there."""
    if isinstance(spec, FixedParam):
        return _DROP  # not sampled: nothing to enqueue
    if isinstance(spec, IntParam):
        if not _is_number(value):
            return _DROP
        v = min(max(float(value), spec.low), spec.high)
        if spec.log:
            return int(round(v))
        k = min(round((v - spec.low) / spec.step), (spec.high - spec.low) // spec.step)
        return int(spec.low + k * spec.step)
    if isinstance(spec, FloatParam):
        if not _is_number(value):
            return _DROP
        v = min(max(float(value), spec.low), spec.high)
        if spec.step is not None:
            k = min(round((v - spec.low) / spec.step), math.floor((spec.high - spec.low) / spec.step + 1e-9))
            v = round(spec.low + k * spec.step, 10)
        return v
    if isinstance(spec, CategoricalParam):
        for c in spec.choices:
            if type(c) is type(value) and c == value:
                return c
            if _is_number(c) and _is_number(value) and float(c) == float(value):
                return c
        numeric = [c for c in spec.choices if _is_number(c)]
        if _is_number(value) and numeric and len(numeric) == len(spec.choices):
            if float(value) > 0 and all(float(c) > 0 for c in numeric):
                return min(numeric, key=lambda c: abs(math.log(float(c)) - math.log(float(value))))
            return min(numeric, key=lambda c: abs(float(c) - float(value)))
        return _DROP
    return _DROP


def map_point(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` in ``space``'s terms: known, active and in range (see the module doc)."""
    out: dict[str, Any] = {}
    context: dict[str, Any] = {}  # values the `when` conditions see (fixed ones included)
    for name in space.ordered_names():
        spec = space.params[name]
        if not spec.active(context):
            continue
        if isinstance(spec, FixedParam):
            context[name] = spec.value
            continue
        if name not in params or params[name] is None:
            continue
        v = snap_value(spec, params[name])
        if v is _DROP:
            continue
        out[name] = v
        context[name] = v
    return out


def _key(point: dict[str, Any]) -> tuple:
    return tuple(sorted((k, round(float(v), 9) if _is_number(v) else repr(v)) for k, v in point.items()))


def covered(point: dict[str, Any], existing: Iterable[dict[str, Any]]) -> bool:
    """True if some existing configuration has every value of ``point``."""
    mine = dict(_key(point))
    for other in existing:
        theirs = dict(_key({k: other[k] for k in point if k in other}))
        if len(theirs) == len(mine) and theirs == mine:
            return True
    return False


def front_params(study, trials: pd.DataFrame) -> list[dict[str, Any]]:
    """Parameters of ``trials``' Pareto front under this study's objectives and SLOs.

    If no earlier trial meets this study's SLOs, the front of the completed trials
    without them (the best trade-offs seen, still better starts than random ones).
    Best first by the first objective.
    """
    needed = [o.metric for o in study.objectives] + ["params_json"]
    if trials.empty or any(c not in trials.columns for c in needed):
        return []
    front = pareto_front(trials, study.objectives, study.constraints)
    if front.empty:
        front = pareto_front(trials, study.objectives, [])
    first = study.objectives[0]
    front = front.sort_values(first.metric, ascending=first.resolved_direction == "minimize")
    return [json.loads(p) for p in front["params_json"] if isinstance(p, str)]


def warm_start_points(study, frames: Sequence[pd.DataFrame], existing: Sequence[dict[str, Any]] = (),
                      limit: Optional[int] = None) -> list[dict[str, Any]]:
    """The points to enqueue, in order: mapped, de-duplicated, at most ``limit``."""
    if limit is None:
        limit = study.search.warm_start_trials
    if limit is None:
        limit = max(1, study.budget.trials // 2)
    seen = list(existing)
    out: list[dict[str, Any]] = []
    for frame in frames:
        for params in front_params(study, frame):
            point = map_point(study.space, params)
            if not point or covered(point, seen):
                continue
            out.append(point)
            seen.append(point)
            if len(out) >= limit:
                return out
    return out


def load_frames(paths: Sequence[str]) -> list[pd.DataFrame]:
    """Trials of each earlier result dataset (unreadable ones are skipped with a warning)."""
    frames = []
    for path in paths:
        try:
            frames.append(load_trials(path))
        except Exception as e:  # noqa: BLE001 - a missing dataset must not stop the study
            log.warning("warm start: cannot read %s: %s", path, e)
    return frames
