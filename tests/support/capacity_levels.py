"""What a capacity search's levels say about its capacity, read from the levels alone (each level's
rate and its verdict by value), to hold the fit's estimate against."""

from __future__ import annotations

import math
from typing import Sequence


def level_bracket(rates: Sequence[float], met: Sequence[bool]) -> tuple[float, float]:
    """``(lower, upper)``: the highest rate met below every missed level (0 if none) and the lowest rate
    missed above every met level (inf if none). A monotone fit of the levels' margins crosses its limit
    between the two whatever the other levels contradict: at a level met below every missed one, each
    mean the fit can pool there is of met levels only (at or below the limit); at a level missed above
    every met one, of missed levels only."""
    met_rates = [r for r, m in zip(rates, met) if m]
    missed_rates = [r for r, m in zip(rates, met) if not m]
    lowest_miss, highest_met = min(missed_rates, default=math.inf), max(met_rates, default=0.0)
    lower = max((r for r in met_rates if r < lowest_miss), default=0.0)
    upper = min((r for r in missed_rates if r > highest_met), default=math.inf)
    return lower, upper


def contradictions(rates: Sequence[float], met: Sequence[bool]) -> int:
    """Levels met at a rate above a level that missed."""
    missed = [r for r, m in zip(rates, met) if not m]
    return sum(1 for r, m in zip(rates, met) if m and any(x < r for x in missed))


def contradicting(rates: Sequence[float], met: Sequence[bool]) -> set[int]:
    """Indexes of every level in a contradiction: met above a missed level, or missed below a met one."""
    return {i for i, (r, m) in enumerate(zip(rates, met))
            if any((m and not m2 and r2 < r) or (not m and m2 and r2 > r) for r2, m2 in zip(rates, met))}
