"""The boundary of a limit, defined once: when ``value op limit`` holds, and by how much it misses.

``<=`` and ``>=`` are met *at* the limit, ``<`` and ``>`` are not. A limit's margin is the
relative excess over it (<= 0: met), what Optuna's constrained samplers expect; a strict
limit reached exactly gets the smallest positive excess, so the sampler and every reader
agree that it missed. A missing or non-finite value never meets a limit. Used by the judge
(:mod:`orchestrator.study.judge`), the study's constraints, a request's SLO (goodput) and
the capacity verdict.
"""

from __future__ import annotations

from typing import Any

from orchestrator.numbers import finite_float

__all__ = ["STRICT_MISS", "met", "violation"]

# A strict limit reached exactly: missed by this much (relative), the least positive margin.
STRICT_MISS = 1e-12


def violation(op: str, limit: float, value: Any) -> float:
    """Relative excess of ``value`` over the limit ``op limit``: <= 0 met, > 0 missed.

    Missing or non-finite values miss by 1.0 (one whole limit)."""
    x = finite_float(value)
    if x is None:
        return 1.0
    scale = max(abs(limit), 1e-9)
    if op in ("<=", "<"):
        excess = (x - limit) / scale
    elif op in (">=", ">"):
        excess = (limit - x) / scale
    else:
        raise ValueError(f"unknown comparison {op!r}; allowed: <=, >=, <, >")
    if op in ("<", ">") and excess >= 0:
        return max(excess, STRICT_MISS)
    return excess


def met(op: str, limit: float, value: Any) -> bool:
    return violation(op, limit, value) <= 0
