"""The boundary of a limit, defined once: when ``value op limit`` holds, and by how much it misses.

``<=`` and ``>=`` are met *at* the limit, ``<`` and ``>`` are not. A limit's margin is the
relative excess over it (<= 0: met), what Optuna's constrained samplers expect; a strict
limit reached exactly gets the smallest positive excess, so the sampler and every reader
agree that it missed. A missing or non-finite value never meets a limit. Used by the judge
(:mod:`orchestrator.study.judge`), the study's constraints, a request's SLO (goodput) and
the capacity verdict.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.numbers import finite_float

__all__ = ["STRICT_MISS", "log_margin", "met", "upper", "violation"]

# A strict limit reached exactly: missed by this much (relative), the least positive margin.
STRICT_MISS = 1e-12


_UPPER, _LOWER = ("<=", "<"), (">=", ">")


def upper(op: str) -> bool:
    """Whether ``op`` bounds from above (``<=``, ``<``: lower is better) or from below (``>=``, ``>``): the
    one place that says so."""
    if op in _UPPER:
        return True
    if op in _LOWER:
        return False
    raise ValueError(f"unknown comparison {op!r}; allowed: <=, >=, <, >")


def log_margin(op: str, limit: float, value: Any):
    """``log(value / limit)`` for an upper limit, ``log(limit / value)`` for a lower one (> 0: missed); None
    where either is not a positive number."""
    x = finite_float(value)
    if x is None or x <= 0 or limit <= 0:
        return None
    return math.log(x / limit) if upper(op) else math.log(limit / x)


def violation(op: str, limit: float, value: Any) -> float:
    """Relative excess of ``value`` over the limit ``op limit``: <= 0 met, > 0 missed.

    Missing or non-finite values miss by 1.0 (one whole limit)."""
    x = finite_float(value)
    if x is None:
        return 1.0
    scale = max(abs(limit), 1e-9)
    excess = (x - limit) / scale if upper(op) else (limit - x) / scale
    if op in ("<", ">") and excess >= 0:
        return max(excess, STRICT_MISS)
    return excess


def met(op: str, limit: float, value: Any) -> bool:
    return violation(op, limit, value) <= 0
