"""Pooled comparisons over engine starts: a start on which one configuration met nothing (capacity 0)
is an unbounded difference, and it must neither be dropped (that hides the starts worst for the
baseline) nor swallow the pooled estimate (a mean of log differences would be that one start)."""

from __future__ import annotations

import math

import numpy as np

from orchestrator.results.paired import BETTER, MEASUREMENTS, compare, encode_draws

RNG = np.random.default_rng(3)


def row(capacity: float, spread: float = 0.05) -> dict:
    """One start's row: its capacity, its interval and bootstrap draws on seed 0 (the same requests)."""
    if capacity <= 0:
        draws = np.zeros(200)
    else:
        draws = capacity * np.exp(RNG.normal(0.0, spread, 200))
    return {"capacity_rps": capacity, "capacity_rps_low": capacity * (1 - 2 * spread) if capacity else 0.0,
            "capacity_rps_high": capacity * (1 + 2 * spread) if capacity else 20.0,
            "draws_json": encode_draws({"capacity_rps": draws}, seed=0)}


def pooled(rows: list[dict]) -> dict:
    out = dict(rows[-1])
    out[MEASUREMENTS] = rows
    out["capacity_rps"] = float(np.median([r["capacity_rps"] for r in rows]))
    return out


def test_a_start_that_met_nothing_counts_and_the_median_pools():
    tuned = pooled([row(47.0), row(46.0), row(42.0), row(40.0)])
    defaults = pooled([row(28.0), row(24.0), row(25.0), row(0.0)])
    c = compare(tuned, defaults, "capacity_rps", "maximize")
    # 16 pairs (the same requests on every start), 4 of them unbounded: the median difference
    pairs = [math.log(a / b) if b else math.inf for a in (47, 46, 42, 40) for b in (28, 24, 25, 0)]
    assert math.isclose(c.ratio, math.expm1(float(np.median(pairs))), rel_tol=1e-9)
    assert c.verdict == BETTER and 0 < c.low < c.ratio and c.paired, c.describe()


def test_pooling_measured_values_is_still_their_mean():
    a = pooled([row(50.0), row(52.0)])
    b = pooled([row(40.0), row(41.0)])
    c = compare(a, b, "capacity_rps", "maximize")
    mean = np.mean([math.log(x / y) for x in (50, 52) for y in (40, 41)])
    assert math.isclose(c.ratio, math.expm1(mean), rel_tol=1e-9) and c.verdict == BETTER


def test_an_interval_unbounded_on_both_sides_prints_both_signs():
    a = {"capacity_rps": 30.0, "capacity_rps_low": 0.0, "capacity_rps_high": math.inf}
    b = {"capacity_rps": 25.0, "capacity_rps_low": 0.0, "capacity_rps_high": math.inf}
    c = compare(a, b, "capacity_rps", "maximize")
    assert c.verdict == "tied" and c.describe() == "+20.0% [-inf, inf]"
