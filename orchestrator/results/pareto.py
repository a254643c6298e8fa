"""Pareto fronts over a trials DataFrame: pure functions, N objectives, any directions.

Every objective is first turned into a loss (minimise: the value; maximise: minus
the value), then the front is found as in Optuna's ``optuna/study/_multi_objective.py``:
duplicate loss vectors are merged with ``numpy.unique`` (which also sorts them
lexicographically), so that no point can be dominated by a later one; two
objectives then need one cumulative minimum (O(n log n)); more objectives take
Optuna's loop (the first remaining point is on the front; drop every point it
dominates) a block of 256 points at a time, so the work is O(n * front size)
comparisons in a few dozen numpy calls even when nearly every point is on the front. Rows with identical objective vectors share one
fate: all on the front or none.

A row is a candidate when its ``status`` is ``"completed"`` (when the frame has a
status column), every constraint is met (:mod:`orchestrator.study.judge`: a missing value
never meets one) and every objective value is present.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import pandas as pd

from orchestrator.measure.metrics import DIRECTIONS, default_direction
from orchestrator.study import judge
from orchestrator.study.spec import Constraint, Objective, parse_objective

ObjectiveLike = Union[Objective, tuple[str, str], str]
ConstraintLike = Union[Constraint, str]


def normalize_objectives(objectives: Sequence[ObjectiveLike]) -> list[tuple[str, str]]:
    """``(column, direction)`` pairs from Objectives, ``(column, direction)`` tuples or strings.

    A string is ``"maximize col"``/``"minimize col"`` or a bare column, read as a
    study's objective is (:func:`orchestrator.study.spec.parse_objective`); a bare column's
    direction comes from :func:`orchestrator.measure.metrics.default_direction`. Columns of
    tuples and strings need not be known metrics (any numeric column works).
    """
    if isinstance(objectives, (str, Objective)) or (
            isinstance(objectives, tuple) and len(objectives) == 2 and objectives[1] in DIRECTIONS):
        objectives = [objectives]  # one objective passed bare
    out: list[tuple[str, str]] = []
    for o in objectives:
        if isinstance(o, Objective):
            name, direction = o.metric, o.resolved_direction
        elif isinstance(o, str):
            name, direction = parse_objective(o)
            direction = direction or default_direction(name)
        else:
            name, direction = o
        if direction not in DIRECTIONS:
            raise ValueError(f"objective {name!r}: direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
        out.append((name, direction))
    if not out:
        raise ValueError("at least one objective is needed")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"each objective column at most once, got {names}")
    return out


def normalize_constraints(constraints: Sequence[ConstraintLike]) -> list[Constraint]:
    """Constraints from :class:`Constraint` objects or strings such as ``"ttft_p99_ms <= 200"``."""
    if isinstance(constraints, (str, Constraint)):
        constraints = [constraints]
    return [c if isinstance(c, Constraint) else Constraint.model_validate(c) for c in constraints]


def _numeric(df: pd.DataFrame, column: str) -> np.ndarray:
    if column not in df.columns:
        raise KeyError(f"no column {column!r} in the trials frame")
    return pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def constraints_mask(df: pd.DataFrame, constraints: Sequence[ConstraintLike]) -> np.ndarray:
    """Rows meeting every constraint, by the one judge (:func:`orchestrator.study.judge.constraints_mask`)."""
    return judge.constraints_mask(df, normalize_constraints(constraints))


def feasible_mask(df: pd.DataFrame, constraints: Sequence[ConstraintLike] = ()) -> np.ndarray:
    """Completed rows (if ``df`` has a ``status`` column) that meet every constraint."""
    return judge.feasible_mask(df, normalize_constraints(constraints))


def to_losses(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """An ``(n, k)`` array in which smaller is better in every column."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] != len(directions):
        raise ValueError(f"expected an (n, {len(directions)}) array, got shape {values.shape}")
    for d in directions:
        if d not in DIRECTIONS:
            raise ValueError(f"direction {d!r} is not one of {', '.join(DIRECTIONS)}")
    sign = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    return values * sign


def _front_of_unique_sorted(losses: np.ndarray) -> np.ndarray:
    n, k = losses.shape
    on_front = np.zeros(n, dtype=bool)
    if n == 0:
        return on_front
    if k == 1:
        on_front[0] = True
        return on_front
    if k == 2:
        # Sorted by the first loss, then the second: a point is on the front when its
        # second loss beats every earlier point's.
        cummin = np.minimum.accumulate(losses[:, 1])
        on_front[0] = True
        on_front[1:] = cummin[1:] < cummin[:-1]
        return on_front
    return _front_nd(losses)


def _weakly_better(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[i, j]``: ``a[i] <= b[j]`` in every objective (one pass per objective, no 3-D array)."""
    out = a[:, 0, None] <= b[None, :, 0]
    for j in range(1, a.shape[1]):
        out &= a[:, j, None] <= b[None, :, j]
    return out


def _front_nd(losses: np.ndarray, block: int = 256, chunk: int = 8192) -> np.ndarray:
    # Optuna's loop, a block of points at a time. Rows are unique and lexsorted, so
    # "a <= b everywhere" means "a dominates b" and only earlier rows can dominate.
    # The points of ``rest`` are dominated by no front point found so far; a point
    # dominated by a dropped point is dominated by the front point that dropped it.
    on_front = np.zeros(len(losses), dtype=bool)
    index = np.arange(len(losses))
    rest = np.ascontiguousarray(losses)
    while len(rest):
        head = rest[:block]
        inside = _weakly_better(head, head)
        np.fill_diagonal(inside, False)
        new = ~inside.any(axis=0)
        on_front[index[:block][new]] = True
        front = head[new]
        tail, tail_index = rest[block:], index[block:]
        keep = np.ones(len(tail), dtype=bool)
        for start in range(0, len(tail), chunk):
            keep[start:start + chunk] = ~_weakly_better(front, tail[start:start + chunk]).any(axis=0)
        rest, index = tail[keep], tail_index[keep]
    return on_front


def pareto_mask(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``values`` (no NaN allowed).

    A row is dominated when another row is at least as good in every column and
    strictly better in one; identical rows do not dominate each other.
    """
    losses = to_losses(values, directions)
    if np.isnan(losses).any():
        raise ValueError("objective values contain NaN; drop those rows first")
    if len(losses) == 0:
        return np.zeros(0, dtype=bool)
    unique, inverse = np.unique(losses, axis=0, return_inverse=True)
    return _front_of_unique_sorted(unique)[inverse.reshape(-1)]


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str]) -> bool:
    """Whether point ``a`` dominates point ``b``."""
    la, lb = to_losses(np.asarray([a, b], dtype=np.float64), directions)
    return bool(np.all(la <= lb) and np.any(la < lb))


def is_dominated(point: Sequence[float], others: np.ndarray, directions: Sequence[str]) -> bool:
    """Whether any row of ``others`` dominates ``point``."""
    others = np.asarray(others, dtype=np.float64).reshape(-1, len(directions))
    lp = to_losses(np.asarray([point], dtype=np.float64), directions)[0]
    lo = to_losses(others, directions)
    return bool(np.any(np.all(lo <= lp, axis=1) & np.any(lo < lp, axis=1)))


def dominated_mask(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """Rows dominated by some other row (the complement of :func:`pareto_mask`)."""
    return ~pareto_mask(values, directions)


def _candidates(df: pd.DataFrame, objectives: list[tuple[str, str]],
                constraints: Sequence[ConstraintLike]) -> tuple[pd.DataFrame, np.ndarray]:
    values = np.column_stack([_numeric(df, name) for name, _ in objectives]) if len(df) else \
        np.zeros((0, len(objectives)))
    ok = feasible_mask(df, constraints) & ~np.isnan(values).any(axis=1)
    return df[ok], values[ok]


def _order_best_first(losses: np.ndarray) -> np.ndarray:
    # np.lexsort sorts by its last key first.
    return np.lexsort(tuple(losses[:, j] for j in reversed(range(losses.shape[1]))))


def pareto_front(df: pd.DataFrame, objectives: Sequence[ObjectiveLike],
                 constraints: Sequence[ConstraintLike] = ()) -> pd.DataFrame:
    """The non-dominated candidate rows of ``df``, best first by the first objective.

    Ties in the first objective are ordered by the next objectives; rows with
    identical objective vectors are all kept. The original index is preserved.
    """
    objs = normalize_objectives(objectives)
    directions = [d for _, d in objs]
    cand, values = _candidates(df, objs, constraints)
    if len(cand) == 0:
        return cand
    front = pareto_mask(values, directions)
    losses = to_losses(values[front], directions)
    return cand[front].iloc[_order_best_first(losses)]


def knee_point(front: pd.DataFrame, objectives: Sequence[ObjectiveLike]) -> pd.Series:
    """The row closest (Euclidean) to the ideal point after min-max normalising each objective.

    Each objective is scaled to [0, 1] over ``front`` with 0 the best value (an
    objective with one value everywhere scales to 0); the ideal point is the origin.
    Ties go to the earlier row. Rows with a missing objective are ignored.
    """
    objs = normalize_objectives(objectives)
    values = np.column_stack([_numeric(front, name) for name, _ in objs]) if len(front) else \
        np.zeros((0, len(objs)))
    present = ~np.isnan(values).any(axis=1)
    if not present.any():
        raise ValueError("knee_point needs at least one row with every objective present")
    losses = to_losses(values[present], [d for _, d in objs])
    lo, hi = losses.min(axis=0), losses.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    scaled = (losses - lo) / span
    distance = np.sqrt((scaled ** 2).sum(axis=1))
    return front[present].iloc[int(np.argmin(distance))]
