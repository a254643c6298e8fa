"""Noise-aware ranking: which trials are better than others, equivalent to them, or not yet told apart.

Each metric with an interval has ``<metric>_low`` / ``<metric>_high`` columns
(:mod:`orchestrator.measure.confidence`; the capacity fit's interval for ``capacity_rps``). Two trials
are compared on a metric by their **paired difference** (:mod:`orchestrator.results.paired`: the same
requests, the same resamples; each row's ``draws_json``): **better** or **worse** when its interval
excludes 0, **equivalent** when it lies within the study's equivalence margin, **tied** otherwise.
Rows without draws are compared by their intervals.

* :func:`tie_mask`: the rows whose interval of one metric overlaps a given row's (no direction:
  what a single column can say).
* :func:`noise_front`: the rows no other row dominates by decided comparisons, with
  ``strict_front`` (on the point values' front too), ``tied_with`` (front rows not yet told apart
  from it), ``equivalent_with`` and ``equivalence_class``.
* :func:`combine_repeats`: one row per configuration measured more than once, its values
  pooled (inverse-variance weights, the interval of their mean).

Pure functions of a trials frame.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

import numpy as np
import pandas as pd

from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, z_of
from orchestrator.results.paired import (BETTER, DEFAULT_EQUIVALENCE_MARGIN, EQUIVALENT, MEASUREMENTS, TIED, WORSE,
                                         verdict_matrix)
from orchestrator.results.pareto import (ConstraintLike, ObjectiveLike, _candidates, _order_best_first,
                                         normalize_objectives, pareto_mask, to_losses)

__all__ = ["bounds", "better_mask", "tie_mask", "noise_front", "front_with_ties", "combine_repeats", "pool",
           "tie_note", "shown_with_intervals"]


def _num(df: pd.DataFrame, column: str) -> np.ndarray:
    if column not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def bounds(df: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` of ``metric`` per row: its interval, its value where it has none
    (high: +inf where only the low end is known)."""
    value = _num(df, metric)
    low, high = _num(df, f"{metric}_low"), _num(df, f"{metric}_high")
    has_low = ~np.isnan(low)
    low = np.where(has_low, np.fmin(low, value), value)
    high = np.where(~np.isnan(high), np.fmax(high, value), np.where(has_low, np.inf, value))
    return low, high


def better_mask(df: pd.DataFrame, i: int, metric: str, direction: str) -> np.ndarray:
    """Rows (positions) that row ``i`` beats beyond the noise on ``metric``."""
    low, high = bounds(df, metric)
    if direction == "maximize":
        return low[i] > high
    return high[i] < low


def tie_mask(df: pd.DataFrame, i: int, metric: str) -> np.ndarray:
    """Rows (positions) whose ``metric`` interval overlaps row ``i``'s (row ``i`` included)."""
    low, high = bounds(df, metric)
    return (low <= high[i]) & (low[i] <= high)


def noise_front(candidates: pd.DataFrame, objectives: Sequence[tuple[str, str]], *,
                margin: float = DEFAULT_EQUIVALENCE_MARGIN, confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """The rows of ``candidates`` (feasible rows, every objective present) that no other row dominates
    by a decided comparison (:mod:`orchestrator.results.paired`: better on one objective, better or
    equivalent on every other), in their order, with columns added: ``strict_front`` (also on the
    front of the point values), ``tied_with`` (other front rows it is not yet told apart from: no
    objective decided either way, not equivalent on all), ``equivalent_with`` (other front rows
    equivalent to it on every objective, within ``margin``) and ``equivalence_class`` (front rows
    linked by equivalence share one: the lowest position among them)."""
    n = len(candidates)
    if n == 0:
        return candidates.assign(strict_front=pd.Series(dtype=bool), tied_with=pd.Series(dtype=int),
                                 equivalent_with=pd.Series(dtype=int), equivalence_class=pd.Series(dtype=int))
    verdicts = [verdict_matrix(candidates, m, d, margin=margin, confidence=confidence) for m, d in objectives]
    better_somewhere = np.zeros((n, n), dtype=bool)  # [a, b]: a is better than b, decided, somewhere
    worse_somewhere = np.zeros((n, n), dtype=bool)
    equivalent_all = np.ones((n, n), dtype=bool)
    undecided_all = np.ones((n, n), dtype=bool)  # no objective decided either way
    for v in verdicts:
        better_somewhere |= v == BETTER
        worse_somewhere |= v == WORSE
        equivalent_all &= v == EQUIVALENT
        undecided_all &= (v == TIED) | (v == EQUIVALENT)
    dominated_by = better_somewhere & ~worse_somewhere  # [j, i]: j dominates i
    on_front = ~dominated_by.any(axis=0)
    values = np.column_stack([candidates[m].to_numpy(dtype=float) for m, _ in objectives])
    strict = pareto_mask(values, [d for _, d in objectives])
    np.fill_diagonal(equivalent_all, False)
    np.fill_diagonal(undecided_all, False)
    tied = undecided_all & ~equivalent_all & on_front[None, :]
    equivalent = equivalent_all & on_front[None, :]
    classes = np.arange(n)
    for i in range(n):  # linked by equivalence: one class, named by its lowest position
        for j in range(i + 1, n):
            if equivalent_all[i, j] and on_front[i] and on_front[j]:
                lo, hi = min(classes[i], classes[j]), max(classes[i], classes[j])
                classes[classes == hi] = lo
    out = candidates[on_front].copy()
    out["strict_front"] = strict[on_front]
    out["tied_with"] = tied.sum(axis=1)[on_front].astype(int)
    out["equivalent_with"] = equivalent.sum(axis=1)[on_front].astype(int)
    out["equivalence_class"] = classes[on_front].astype(int)
    return out


def front_with_ties(df: pd.DataFrame, objectives: Sequence[ObjectiveLike],
                    constraints: Sequence[ConstraintLike] = (), *, margin: float = DEFAULT_EQUIVALENCE_MARGIN,
                    confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """:func:`noise_front` of ``df``'s candidates (completed, every constraint met, every objective
    present), best first by the first objective: the point values' front and the rows that only
    an undecided comparison keeps off it (``strict_front`` False)."""
    objs = normalize_objectives(objectives)
    if "params_json" in df.columns and len(df):  # a configuration measured again is one candidate
        done = df[df["status"] == "completed"] if "status" in df.columns else df
        df = combine_repeats(done, [m for m, _ in objs], confidence)
    cand, values = _candidates(df, objs, constraints)
    front = noise_front(cand, objs, margin=margin, confidence=confidence)
    if front.empty:
        return front
    vals = np.column_stack([front[m].to_numpy(dtype=float) for m, _ in objs])
    return front.iloc[_order_best_first(to_losses(vals, [d for _, d in objs]))]


def shown_with_intervals(frame: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """A copy of ``frame`` whose ``metrics`` columns read ``value [low, high]`` where an interval is
    known (``value`` alone otherwise): for printing."""
    out = frame.copy()
    for m in metrics:
        if m not in out.columns:
            continue
        low, high = bounds(out, m)
        value = _num(out, m)
        has = ~np.isnan(_num(out, f"{m}_low")) | ~np.isnan(_num(out, f"{m}_high"))
        out[m] = [("-" if math.isnan(v) else f"{v:,.4g}" + (f" [{lo:,.4g}, {'inf' if math.isinf(hi) else f'{hi:,.4g}'}]"
                                                          if h else ""))
                  for v, lo, hi, h in zip(value, low, high, has)]
    return out


def tie_note(tied: int) -> str:
    """``"tied with 3 others within the noise"`` (empty for none)."""
    if tied <= 0:
        return ""
    return f"tied with {tied} other{'s' if tied != 1 else ''} within the noise"


def combine_repeats(df: pd.DataFrame, metrics: Sequence[str], confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """One row per configuration (``params_json``): configurations measured once keep their row;
    one measured several times keeps its latest row with each of ``metrics`` pooled: the
    inverse-variance mean of the measurements (variance from each interval at ``confidence``),
    its interval the mean's, widened when the measurements disagree more than their intervals say
    (never narrower than their spread's standard error). ``measurements`` counts the rows pooled."""
    if df.empty or "params_json" not in df.columns:
        return df.assign(measurements=1)
    z = z_of(confidence)
    key = df["params_json"].map(lambda t: json.dumps(json.loads(t), sort_keys=True) if isinstance(t, str) else t)
    rows = []
    for _, group in df.groupby(key, sort=False):
        group = group.sort_values("started_at", kind="stable") if "started_at" in group else group
        row = group.iloc[-1].copy()
        row["measurements"] = len(group)
        if len(group) > 1:
            row[MEASUREMENTS] = group.to_dict("records")  # compared measurement by measurement (paired)
            for m in metrics:
                pooled = _pool(group, m, z)
                if pooled is not None:
                    row[m], row[f"{m}_low"], row[f"{m}_high"] = pooled
        rows.append(row)
    return pd.DataFrame(rows)


def _pool(group: pd.DataFrame, metric: str, z: float):
    value = _num(group, metric)
    low, high = bounds(group, metric)
    return pool(value, low, high, z)


def pool(value: np.ndarray, low: np.ndarray, high: np.ndarray, z: float):
    """``(mean, low, high)`` of several measurements of one value (intervals at the normal quantile
    ``z``): the inverse-variance mean, the interval of that mean, never narrower than the
    measurements' spread says; None without a measurement."""
    value, low, high = (np.asarray(a, dtype=float) for a in (value, low, high))
    ok = ~np.isnan(value)
    if ok.sum() == 0:
        return None
    value, low, high = value[ok], low[ok], high[ok]
    if not np.all(np.isfinite(high)):
        return float(np.mean(value)), float(np.max(low)), math.inf
    sd = np.maximum((high - low) / (2 * z), 1e-12 * np.maximum(np.abs(value), 1.0))
    w = 1.0 / sd ** 2
    mean = float(np.sum(w * value) / np.sum(w))
    se = math.sqrt(1.0 / float(np.sum(w)))
    if len(value) > 1:
        se = max(se, float(np.std(value, ddof=1)) / math.sqrt(len(value)))
    return mean, mean - z * se, mean + z * se
