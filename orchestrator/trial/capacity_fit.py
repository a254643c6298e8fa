"""A trial's capacity from every level at once: one monotone fit, its interval from the same model.

Each SLO metric's **log margin** (``log(value / limit)`` for an upper limit, ``log(limit / value)``
for a lower one; > 0 is missed) is fitted against the offered rate by isotonic regression
(pool-adjacent-violators: the margin never falls as the load grows), the levels weighted by the
windows they pooled. A level that saturated or failed too many requests is missed by every
metric. The capacity is where the binding fit (the largest margin at each rate) crosses zero,
interpolated linearly in log rate between the two fitted levels around the crossing. Nothing
clamps it into the bracket the decided levels leave: where the levels disagree with each other,
the fit follows all of them.

Its interval comes from the same fit repeated on each bootstrap draw of the levels' metrics
(:func:`orchestrator.measure.confidence.metric_draws`: blocks of requests resampled, widened per
statistic, moved by the engine's window noise) plus one **start shift** per metric and draw, the
same at every level, and one shift of the whole curve along the rate (the engine's speed): the
engine's start-to-start noise (a prior per engine and GPU, :mod:`orchestrator.measure.engine_noise`),
which one start cannot see. A margin that hardly grows with
the rate near its limit turns a small shift into a large move of the capacity: the fit reports it
(``conditioned`` False, with the binding metric, its slope and its noise) instead of a number that
looks precise.

Contradictions, a level met at a rate above one that missed, are counted, never dropped: they are
the measurement's noise showing, and the fit pools them.

Pure: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

__all__ = ["CapacityFit", "FAILED_MARGIN", "ILL_CONDITIONED", "LevelMargins", "SPEED", "contradictions",
           "fit_capacity", "isotonic"]

# The log margin of a level missed by saturation, errors or a metric it could not measure: far above
# any limit, so that the fit puts the capacity below it.
FAILED_MARGIN = 3.0
# A capacity is ill-conditioned when one standard deviation of its binding margin's noise moves it by
# more than this share (noise / slope, the slope per unit of log rate): the metric hardly grows with
# the load near its limit, so a few percent of latency between starts moves the capacity by tens of
# percent (vLLM's defaults under an ITL p99 limit on an H100: 26 and 12 req/s on two starts).
ILL_CONDITIONED = 0.15
# The start shift that moves the rate axis, not a metric: an engine that runs faster or slower on one start
# than the next serves every rate of its curve at another load (log units; the prior's ``capacity_rps``).
SPEED = "capacity_rps"


@dataclass(frozen=True)
class LevelMargins:
    """One level of a capacity search, as the fit reads it: its rate, each SLO metric's point log
    margin and its draws (one per bootstrap resample; empty: the metric has no interval), whether it
    failed regardless of its metrics, and how many windows it pooled (its weight)."""

    rate: float
    margins: Mapping[str, float]
    draws: Mapping[str, np.ndarray] = field(default_factory=dict)
    failed: bool = False
    windows: int = 1
    met: Optional[bool] = None  # the level's verdict by its values (contradictions); None: margins decide
    raw_draws: Mapping[str, np.ndarray] = field(default_factory=dict)  # not widened per statistic (pairing)


@dataclass(frozen=True)
class CapacityFit:
    """The capacity of one trial: ``estimate`` (0: no level met; the highest rate measured when none
    missed, ``high`` None then), its interval at ``confidence``, the draws it came from (inf: above
    every level measured, 0: below every one) and how well the data pin it down."""

    estimate: float
    low: float
    high: Optional[float]
    draws: np.ndarray
    confidence: float
    binding: Optional[str] = None  # the SLO metric whose margin crosses zero first
    slope: Optional[float] = None  # its fitted margin's growth per unit of log rate at the crossing
    margin_sd: Optional[float] = None  # its margin's noise near the crossing (log units, start noise included)
    conditioned: Optional[bool] = None  # None: every level met (no crossing), or a single level
    contradictions: int = 0  # levels met at a rate above a level missed
    contradicting: tuple[int, ...] = ()  # indexes (in the order given) of every level in a contradiction
    # The two measured rates the point fit crosses zero between (None: no crossing inside the measured
    # rates): between them the fit interpolates, and the interval holds them when they lie further apart
    # than the resolution it was given.
    bracket: Optional[tuple[float, float]] = None
    # The capacity of each resample from the levels' draws not widened per statistic: what a paired
    # comparison with another trial differences (both sides' widening would not cancel there).
    paired_draws: Optional[np.ndarray] = None

    @property
    def condition(self) -> Optional[float]:
        """``margin_sd / slope``: the capacity's relative move per standard deviation of margin noise."""
        if self.slope is None or self.margin_sd is None:
            return None
        return math.inf if self.slope <= 0 else self.margin_sd / self.slope


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) regression along the last axis of ``y`` ((..., J), the
    rates in increasing order; ``w``: (J,) weights), by its min-max form: the fit at ``i`` is the
    largest over ``a <= i`` of the smallest over ``b >= i`` of the weighted mean of ``y[a..b]``.
    A handful of levels and hundreds of draws: O(J^3) vectorised over the draws."""
    y = np.asarray(y, dtype=float)
    w = np.asarray(w, dtype=float)
    j = y.shape[-1]
    cw = np.concatenate([[0.0], np.cumsum(w)])
    cy = np.concatenate([np.zeros(y.shape[:-1] + (1,)), np.cumsum(y * w, axis=-1)], axis=-1)
    # means[..., a, b]: weighted mean of y[a..b] (b >= a)
    num = cy[..., None, 1:] - cy[..., :-1, None]
    den = cw[None, 1:] - cw[:-1, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = num / np.where(den > 0, den, np.nan)
    upper = np.triu(np.ones((j, j), dtype=bool))
    means = np.where(upper, means, np.nan)
    out = np.empty_like(y)
    for i in range(j):
        inner = np.nanmin(means[..., : i + 1, i:], axis=-1)  # (..., a) min over b >= i
        out[..., i] = np.nanmax(inner, axis=-1)
    return out


def _crossings(fit: np.ndarray, log_rates: np.ndarray) -> np.ndarray:
    """Where each row of ``fit`` ((B, J), non-decreasing) crosses zero, as a rate: linear in log rate
    between the fitted levels around it; inf where no level is above zero, 0 where the first is."""
    above = fit > 0
    first = np.argmax(above, axis=1)
    none = ~above.any(axis=1)
    out = np.empty(len(fit))
    out[none] = np.inf
    at_start = ~none & (first == 0)
    out[at_start] = 0.0
    mid = ~none & (first > 0)
    i = first[mid]
    f0, f1 = fit[mid, i - 1], fit[mid, i]
    x0, x1 = log_rates[i - 1], log_rates[i]
    out[mid] = np.exp(x0 + (0.0 - f0) / (f1 - f0) * (x1 - x0))
    return out


def contradictions(met: Sequence[bool], rates: Sequence[float]) -> tuple[int, tuple[int, ...]]:
    """``(levels met above a missed level, indexes of every level in such a pair)``."""
    idx = set()
    count = 0
    for i, (m_i, r_i) in enumerate(zip(met, rates)):
        if not m_i:
            continue
        below = [j for j, (m_j, r_j) in enumerate(zip(met, rates)) if not m_j and r_j < r_i]
        if below:
            count += 1
            idx.add(i)
            idx.update(below)
    return count, tuple(sorted(idx))


def fit_capacity(levels: Sequence[LevelMargins], *, confidence: float, samples: int,
                 start_shift: Optional[Mapping[str, np.ndarray]] = None,
                 resolution: Optional[float] = None) -> Optional[CapacityFit]:
    """The capacity of ``levels`` (any order; a rate measured twice is two levels), or None without a
    level. ``start_shift``: per metric, one log shift per draw added to every level's draws (the
    engine's start-to-start noise; the caller draws it, once per trial); under :data:`SPEED`, one log
    factor per draw on the rate of the whole curve. ``resolution``: the widest
    gap between two levels (relative to the higher) across which a straight line is trusted; across a
    wider one the margin may bend anywhere, and the interval holds the whole gap."""
    if not levels:
        return None
    order = sorted(range(len(levels)), key=lambda i: levels[i].rate)
    lv = [levels[i] for i in order]
    rates = np.array([x.rate for x in lv], dtype=float)
    log_rates = np.log(rates)
    weights = np.array([max(x.windows, 1) for x in lv], dtype=float)
    metrics = sorted({m for x in lv for m in x.margins})

    def point_of(x: LevelMargins, m: str) -> float:
        v = x.margins.get(m)
        return FAILED_MARGIN if x.failed or v is None or not math.isfinite(v) else min(float(v), FAILED_MARGIN)

    shift = start_shift or {}
    point_fits, draw_fits, raw_fits = {}, {}, {}

    def fitted_draws(m: str, y: np.ndarray, which: str) -> np.ndarray:
        cols = []
        for x, p in zip(lv, y):
            d = getattr(x, which).get(m)
            if x.failed or d is None or len(d) != samples or p >= FAILED_MARGIN:
                col = np.full(samples, p)
            else:
                col = np.minimum(np.where(np.isfinite(d), d, FAILED_MARGIN), FAILED_MARGIN)
            cols.append(col)
        yd = np.column_stack(cols) if cols else np.zeros((samples, 0))
        if m in shift:
            yd = yd + np.asarray(shift[m], dtype=float)[:, None]
        return isotonic(yd, weights)

    for m in metrics:
        y = np.array([point_of(x, m) for x in lv])
        point_fits[m] = isotonic(y[None, :], weights)[0]
        draw_fits[m] = fitted_draws(m, y, "draws")
        raw_fits[m] = fitted_draws(m, y, "raw_draws") if any(x.raw_draws for x in lv) else None
    if not metrics:  # no SLO metric: a level meets or misses by failing only
        y = np.array([FAILED_MARGIN if x.failed else -1.0 for x in lv])
        point_fits[""] = isotonic(y[None, :], weights)[0]
        draw_fits[""] = np.tile(point_fits[""], (samples, 1))
        raw_fits[""] = None
        metrics = [""]

    point_cross = {m: float(_crossings(point_fits[m][None, :], log_rates)[0]) for m in metrics}
    binding = min(metrics, key=lambda m: point_cross[m])
    estimate = point_cross[binding]
    draws = np.min(np.column_stack([_crossings(draw_fits[m], log_rates) for m in metrics]), axis=1)
    paired = None
    if all(raw_fits[m] is not None for m in metrics):
        paired = np.min(np.column_stack([_crossings(raw_fits[m], log_rates) for m in metrics]), axis=1)
    if SPEED in shift:  # the engine's speed moves from start to start: every rate of the curve with it
        speed = np.exp(np.asarray(shift[SPEED], dtype=float))
        draws = draws * speed
        paired = paired * speed if paired is not None else None

    a = (1.0 - confidence) / 2.0
    lo_q, hi_q = np.quantile(draws, [a, 1.0 - a], method="inverted_cdf") if len(draws) else (estimate, estimate)
    top = float(rates.max())
    unbounded = not math.isfinite(estimate) or not math.isfinite(hi_q)
    if not math.isfinite(estimate):
        estimate = top  # every level met: at least the highest rate measured
    low = min(float(lo_q), estimate) if math.isfinite(lo_q) else estimate
    high = None if unbounded else max(float(hi_q), estimate)

    met = [x.met if x.met is not None else (not x.failed and all(point_of(x, m) <= 0 for m in x.margins))
           for x in lv]
    count, involved = contradictions(met, list(rates))
    involved = tuple(sorted(order[i] for i in involved))

    slope = sd = conditioned = bracket = None
    if 0 < point_cross[binding] < math.inf:
        i = int(np.argmax(point_fits[binding] > 0))
        bracket = (float(rates[i - 1]), float(rates[i]))
        if resolution is not None and (bracket[1] - bracket[0]) / bracket[1] > resolution:
            low, high = min(low, bracket[0]), max(high if high is not None else bracket[1], bracket[1])
    if point_cross[binding] == 0.0:  # every level missed: the capacity lies below the lowest one
        high = max(high if high is not None else 0.0, float(rates[0]))
    if binding and point_cross[binding] < math.inf and len(lv) > 1:
        # How well the binding margin pins the capacity down: its growth per unit of log rate between the two
        # levels around the crossing (the two lowest when every level missed) against its noise there.
        f = point_fits[binding]
        i = max(int(np.argmax(f > 0)), 1)
        slope = float((f[i] - f[i - 1]) / (log_rates[i] - log_rates[i - 1]))
        cols = []
        for k in (i - 1, i):
            d = lv[k].draws.get(binding)
            col = np.full(samples, point_of(lv[k], binding)) if d is None or len(d) != samples else \
                np.asarray(d, dtype=float)
            if binding in shift:
                col = col + np.asarray(shift[binding], dtype=float)
            cols.append(col[np.isfinite(col)])
        spreads = [float(np.std(c)) for c in cols if len(c) > 1]
        sd = float(np.mean(spreads)) if spreads else 0.0
        conditioned = bool(slope > 0 and sd / slope <= ILL_CONDITIONED)
    return CapacityFit(float(estimate), float(low), high, draws, confidence, binding or None, slope, sd,
                       conditioned, count, involved, bracket, paired)
