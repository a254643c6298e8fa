"""Paired comparisons: is one trial better than another, worse, equivalent, or not yet known?

Two trials of a study replay the same requests where they were measured at the same rate (one
draw per rate and seed, :func:`orchestrator.trial.capacity.draw_level`), and the bootstrap resamples
the same blocks of those requests in both (:func:`orchestrator.measure.confidence.metric_draws`). So
a row's draws (``draws_json``) pair with another row's draw by draw: the difference of their logs is
the bootstrap of the **paired difference**, in which the workload's own noise (a burst both saw)
cancels and what is left is the configurations' difference, each trial's window noise and each
engine start's shift (drawn per trial, never shared). Rows measured on other requests (another seed)
pair draws that share nothing: the same arithmetic then gives the unpaired difference.

A comparison's interval of ``a / b - 1`` (at the study's confidence) decides:

* **equivalent** when the whole interval lies within ``+-margin`` (``analysis.equivalence_margin``,
  5% by default): the configurations are the same for this purpose, and ``recommend`` picks
  among them by a stated rule;
* **better** / **worse** when it excludes 0 (and is not within the margin);
* **tied** otherwise: the interval straddles the margin; more measurement could decide it.

Rows without draws (written before they existed, or imported) are compared by their intervals,
taken as independent normal errors in log space.

Pure functions of rows and frames.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, z_of

__all__ = ["BETTER", "Comparison", "DEFAULT_EQUIVALENCE_MARGIN", "EQUIVALENT", "MEASUREMENTS", "PAIRED_WIDEN", "TIED",
           "WORSE", "compare", "decode_draws", "draw_metrics", "encode_draws", "verdict_matrix"]

DEFAULT_EQUIVALENCE_MARGIN = 0.05
BETTER, WORSE, EQUIVALENT, TIED = "better", "worse", "equivalent", "tied"

# A metric with no draws of its own moves with another's: per GPU with the whole (the same GPUs in every
# draw of a row), a cost per token against the tokens per second (more tokens, less cost).
DERIVED: dict[str, tuple[str, int]] = {
    "capacity_rps_per_gpu": ("capacity_rps", 1), "goodput_per_gpu": ("goodput", 1),
    "cost_per_mtok": ("output_throughput", -1), "output_throughput_per_gpu": ("output_throughput", 1),
}
_DIGITS = 5
# How much wider than its bootstrap a paired difference's interval is drawn, around the measured difference:
# the resamples see the requests both trials replayed, not what a window cannot show (benchmarks/decisions.py
# measures how often the interval holds the true difference on the simulator; docs/benchmarks.md).
PAIRED_WIDEN = 1.5


def draw_metrics(metrics: Sequence[str]) -> tuple[str, ...]:
    """The metrics whose draws a row must keep so that ``metrics`` can be compared (a derived metric's
    base beside it)."""
    out = []
    for m in metrics:
        out.append(m)
        if m in DERIVED:
            out.append(DERIVED[m][0])
    return tuple(dict.fromkeys(out))


def encode_draws(draws: Mapping[str, Any], seed: Optional[int]) -> Optional[str]:
    """``draws_json``: each metric's draws (5 significant digits; null for an unbounded draw)."""
    if not draws:
        return None

    def enc(x: float) -> Optional[float]:
        return float(f"{x:.{_DIGITS}g}") if math.isfinite(x) else None

    return json.dumps({"seed": seed, "metrics": {m: [enc(float(x)) for x in np.asarray(d, dtype=float)]
                                                 for m, d in draws.items()}}, separators=(",", ":"))


def decode_draws(text: Any) -> tuple[Optional[int], dict[str, np.ndarray]]:
    """``(seed, {metric: draws})`` of a ``draws_json`` value (null draws: +inf); empty when absent. Decoded
    once per text: a front compares every pair of its rows."""
    if not isinstance(text, str) or not text:
        return None, {}
    return _decoded(text)


@functools.lru_cache(maxsize=1024)
def _decoded(text: str) -> tuple[Optional[int], dict[str, np.ndarray]]:
    try:
        doc = json.loads(text)
        return doc.get("seed"), {m: np.array([np.inf if x is None else x for x in v], dtype=float)
                                 for m, v in (doc.get("metrics") or {}).items()}
    except (ValueError, TypeError, AttributeError):
        return None, {}


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` on one metric: ``a / b - 1`` and its interval, and what that decides."""

    metric: str
    direction: str
    ratio: float
    low: float
    high: float
    verdict: str
    margin: float
    paired: bool  # both rows replayed the same requests (the same seed) and kept their draws

    def describe(self) -> str:
        """``+12.3% [+8.1%, +16.0%]`` (relative difference of a to b, and its interval)."""
        def pct(x: float) -> str:
            return ("inf" if x > 0 else "-inf") if math.isinf(x) else f"{x * 100:+.1f}%"
        return f"{pct(self.ratio)} [{pct(self.low)}, {pct(self.high)}]"


def _log_draws(row: Mapping[str, Any], metric: str, draws: Mapping[str, np.ndarray]) -> Optional[np.ndarray]:
    """log of ``row``'s draws of ``metric`` (its own, or its base's scaled to it), or None."""
    value = _value(row, metric)
    if value is None or value <= 0:
        return None
    if metric in draws:
        d = draws[metric]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(np.where(d > 0, d, 0.0))
    base = DERIVED.get(metric)
    if base is None or base[0] not in draws:
        return None
    b_value = _value(row, base[0])
    if b_value is None or b_value <= 0:
        return None
    d = draws[base[0]]
    with np.errstate(divide="ignore", invalid="ignore"):
        dev = np.log(np.where(d > 0, d, 0.0)) - math.log(b_value)
    return math.log(value) + base[1] * dev


def _value(row: Mapping[str, Any], metric: str) -> Optional[float]:
    v = row.get(metric)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _interval_sd(row: Mapping[str, Any], metric: str, z: float) -> Optional[float]:
    """The log-scale standard error a row's interval of ``metric`` implies (inf: unbounded)."""
    value, low, high = _value(row, metric), _value(row, f"{metric}_low"), row.get(f"{metric}_high")
    if value is None or value <= 0:
        return None
    if low is None:
        return 0.0
    try:
        high = float(high) if high is not None else math.inf
    except (TypeError, ValueError):
        high = math.inf
    if math.isnan(high):
        high = math.inf
    if low <= 0 or math.isinf(high):
        return math.inf
    return max(math.log(high / value), math.log(value / low)) / z


MEASUREMENTS = "measurements_of"  # a pooled row's own measurements (row dicts), where it has several


def _diff(a: Mapping[str, Any], b: Mapping[str, Any], metric: str) -> Optional[tuple[float, Optional[np.ndarray], bool]]:
    """``(log a - log b, its draws or None, paired)`` of one measurement of each; None without both values."""
    va, vb = _value(a, metric), _value(b, metric)
    if va is None or vb is None:
        return None
    seed_a, draws_a = decode_draws(a.get("draws_json"))
    seed_b, draws_b = decode_draws(b.get("draws_json"))
    la, lb = _log_draws(a, metric, draws_a), _log_draws(b, metric, draws_b)
    if va <= 0 or vb <= 0:  # a measurement that met nothing (a zero capacity): an unbounded difference
        d = 0.0 if va <= 0 and vb <= 0 else (math.inf if va > 0 else -math.inf)
        known = la if la is not None else lb
        return d, None if known is None else np.full(len(known), d), seed_a is not None and seed_a == seed_b
    d = math.log(va) - math.log(vb)
    if la is None or lb is None or len(la) != len(lb) or len(la) == 0:
        return d, None, False
    with np.errstate(invalid="ignore"):
        return d, la - lb, seed_a is not None and seed_a == seed_b


def _measurements(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    got = row.get(MEASUREMENTS)
    return list(got) if isinstance(got, (list, tuple)) and got else [row]


def _paired_diffs(a: Mapping[str, Any], b: Mapping[str, Any], metric: str) -> list[tuple[float, Optional[np.ndarray], bool]]:
    """The differences a comparison pools: every pair of ``a``'s and ``b``'s measurements that replayed the
    same requests (the same seed), or, with none, their latest measurements against each other."""
    ma, mb = _measurements(a), _measurements(b)
    seeds_b = {}
    for r in mb:
        seeds_b.setdefault(decode_draws(r.get("draws_json"))[0], []).append(r)
    out = []
    for ra in ma:
        seed = decode_draws(ra.get("draws_json"))[0]
        for rb in seeds_b.get(seed, []) if seed is not None else []:
            got = _diff(ra, rb, metric)
            if got is not None:
                out.append(got)
    if not out and len(ma) + len(mb) > 2:
        got = _diff(ma[-1], mb[-1], metric)
        out = [got] if got is not None else []
    return out


def compare(a: Mapping[str, Any], b: Mapping[str, Any], metric: str, direction: str, *,
            margin: float = DEFAULT_EQUIVALENCE_MARGIN, confidence: float = DEFAULT_CONFIDENCE) -> Optional[Comparison]:
    """``a`` against ``b`` on ``metric`` (rows as mappings; ``direction``: maximize or minimize), or None
    when either lacks the value. A row pooled from several measurements of its configuration
    (:data:`MEASUREMENTS`) is compared measurement by measurement where both replayed the same requests,
    the paired differences averaged draw by draw."""
    va, vb = _value(a, metric), _value(b, metric)
    if va is None or vb is None:
        return None
    if va <= 0 or vb <= 0:  # a zero capacity: no ratio, the values alone decide
        if va == vb:
            return Comparison(metric, direction, 0.0, 0.0, 0.0, EQUIVALENT, margin, False)
        better = (va > vb) == (direction == "maximize")
        r = (va / vb - 1.0) if vb > 0 else math.inf
        return Comparison(metric, direction, r, r, r, BETTER if better else WORSE, margin, False)
    alpha = (1.0 - confidence) / 2.0
    diffs = _paired_diffs(a, b, metric) if MEASUREMENTS in a or MEASUREMENTS in b else []
    if not diffs:
        got = _diff(a, b, metric)
        diffs = [got] if got is not None else []
    with_draws = [x for x in diffs if x[1] is not None]
    if diffs and len(with_draws) == len(diffs):
        # Several measurements pool by the mean of their differences; where one is unbounded (one side met
        # nothing on one engine start) a mean would be that one measurement: the median of them instead.
        bounded = all(math.isfinite(x[0]) for x in diffs)
        d = float((np.mean if bounded else np.median)([x[0] for x in diffs]))
        stack = np.vstack([x[1] for x in diffs])
        with np.errstate(invalid="ignore"):
            # (the median passes over a pair unknown in a resample: both sides unbounded there)
            draws = np.mean(stack, axis=0) if bounded else np.nanmedian(stack, axis=0)
        unknown = np.isnan(draws)  # both unbounded in one resample
        if unknown.mean() > alpha:
            lo, hi = -math.inf, math.inf
        else:
            draws = np.where(unknown, 0.0, draws)
            lo, hi = (float(x) for x in np.quantile(draws, [alpha, 1.0 - alpha], method="inverted_cdf"))
            centre = float(np.median(draws))
            if math.isfinite(centre) and math.isfinite(d):
                lo = d + PAIRED_WIDEN * (lo - centre) if math.isfinite(lo) else lo
                hi = d + PAIRED_WIDEN * (hi - centre) if math.isfinite(hi) else hi
        paired = all(x[2] for x in diffs)
    else:
        z = z_of(confidence)
        d = math.log(va) - math.log(vb)
        sa, sb = _interval_sd(a, metric, z), _interval_sd(b, metric, z)
        if sa is None or sb is None:
            return None
        se = math.hypot(sa, sb) if math.isfinite(sa) and math.isfinite(sb) else math.inf
        lo, hi = d - z * se, d + z * se
        paired = False
    lo, hi = min(lo, d), max(hi, d)
    ratio, r_lo, r_hi = (math.expm1(x) if math.isfinite(x) else x for x in (d, lo, hi))
    if -margin <= r_lo and r_hi <= margin:
        verdict = EQUIVALENT
    elif r_lo > 0:
        verdict = BETTER if direction == "maximize" else WORSE
    elif r_hi < 0:
        verdict = WORSE if direction == "maximize" else BETTER
    else:
        verdict = TIED
    return Comparison(metric, direction, ratio, r_lo, r_hi, verdict, margin, paired)


def verdict_matrix(frame: pd.DataFrame, metric: str, direction: str, *, margin: float = DEFAULT_EQUIVALENCE_MARGIN,
                   confidence: float = DEFAULT_CONFIDENCE) -> np.ndarray:
    """``(n, n)`` verdicts of row ``i`` against row ``j`` (object array of :data:`BETTER`, :data:`WORSE`,
    :data:`EQUIVALENT`, :data:`TIED`; the diagonal equivalent)."""
    rows = frame.to_dict("records")
    n = len(rows)
    out = np.full((n, n), EQUIVALENT, dtype=object)
    for i in range(n):
        for j in range(i + 1, n):
            c = compare(rows[i], rows[j], metric, direction, margin=margin, confidence=confidence)
            v = TIED if c is None else c.verdict
            out[i, j] = v
            out[j, i] = {BETTER: WORSE, WORSE: BETTER}.get(v, v)
    return out
