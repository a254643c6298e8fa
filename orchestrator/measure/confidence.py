"""How sure one measurement is: confidence intervals of a load window's metrics, from its requests.

The requests of one window are not independent draws. Requests sent close together share
the engine's queue: one burst of arrivals lifts the TTFT of every request behind it, and a
p99 over 600 requests is decided by the few bursts of that window. So the intervals come
from a **block bootstrap** (Kunsch 1989): each window is cut into blocks of consecutive
requests (``block_s`` seconds of them at the window's rate, or a number the caller fixes),
each block is weighted Poisson(1) (the Poisson bootstrap: a resample of the blocks), the metric
is computed on the weighted requests, and the interval is the central ``confidence`` share of
:data:`BOOTSTRAP_SAMPLES` resamples. A block's weight is drawn from a stream named by the seed,
its window and its position: two sets of records cut from one draw of requests (two
configurations, or two load levels replaying one draw at other rates) resample the same blocks
alike, so their draws are **paired** (:func:`metric_draws`, :mod:`orchestrator.results.paired`).
Windows measured apart (a level measured again) are never joined inside a block. Alone, that
interval is too narrow for tails: a window cannot see fluctuations slower than itself, and a
redrawn p99 never exceeds the window's largest values (on the simulator, 90% bootstrap intervals
of a 12 s window's tails cover the truth far less often than 90%: ``benchmarks/ci_coverage.py
--blocks``). So each is widened by a factor
per statistic (:data:`INFLATION`), the one that made the simulator's intervals cover as
often as they say; ``benchmarks/ci_coverage.py`` measures that coverage, and the
repeatability benchmark checks the capacity intervals on real engines. The engine adds noise
the requests do not show: between windows (:data:`GPU_WINDOW_NOISE`) and between engine starts
(:data:`GPU_START_NOISE`), each a log-scale standard deviation per metric.

Which metrics: the per-request latencies (``ttft``, ``tpot``, ``e2el``: mean and
percentiles; ``itl``: the same over every token gap, a request's gaps staying in its
block) and the window's throughputs (``request``, ``input``, ``output``,
``total_token``, ``goodput``, per GPU), each as :func:`orchestrator.measure.metrics.summarise`
defines it: a throughput is drawn as the drawn requests' amount per request times the
window's request rate (the load fixes how many requests arrive; how much they carry, and
how many succeed, is what varies). Quantiles here are the
inverted empirical CDF of the drawn requests (the point value stays ``summarise``'s
linear interpolation). Every other metric has no interval (a single number).

Pure: numpy only, seeded (the same records give the same interval).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

from orchestrator.measure.blocks import BLOCK_S, SortedByBlock, block_weights, cut_blocks, weighted_means
from orchestrator.measure.engine_noise import NO_WINDOW_NOISE, WindowNoise
from orchestrator.measure.metrics import LATENCY_FAMILIES, PERCENTILES, RequestSLO
from orchestrator.measure.records import RequestRecord

__all__ = ["BOOTSTRAP_SAMPLES", "DEFAULT_CONFIDENCE", "INTERVAL_METRICS", "Interval", "MetricDraws", "interval_columns",
           "metric_draws", "metric_intervals", "t_of", "z_of"]

DEFAULT_CONFIDENCE = 0.90
BOOTSTRAP_SAMPLES = 400
# How much wider than the block bootstrap's an interval must be to cover the truth as often as it
# says, by statistic, (below, above) the value: what the simulator needed over many seeds
# (benchmarks/ci_coverage.py). A window cannot see fluctuations slower than itself (near capacity
# the queue remembers a burst for longer than a level lasts), and a resampled tail quantile never
# exceeds the window's largest values: a tail's interval needs widening above its value, hardly
# below (a window with a burst has a high p99, and the draws without that burst's block reach
# below the truth already). Applied in log space around the point value.
INFLATION = {"mean": (1.25, 1.25), "p50": (1.25, 1.5), "p90": (1.0, 1.5), "p95": (1.0, 2.5),
             "p99": (1.0, 4.0), "throughput": (1.5, 1.5)}
# A request's TPOT and E2E latency (and a token gap's) average over its whole life, so their
# tails move with the batch size over many seconds: slower than TTFT's, and they need more.
SLOW_TAIL_INFLATION = {"p95": (1.5, 4.0), "p99": (2.0, 6.0)}  # tpot, e2el, itl
# A tail quantile of few values is one or two requests: with fewer than this many above it (p99
# of fewer than 500), both sides widen by sqrt(MIN_TAIL / those above), so that a p99 of 60
# requests, their largest, is not taken for a measurement of the tail.
MIN_TAIL = 5.0
# Widening multiplies a band's log width: past a tenfold ratio it says nothing more than "unknown",
# and the numbers only grow absurd. A band stops at a tenth and ten times the value.
MAX_RATIO = 10.0
_ITL_CAP = 200_000  # token gaps kept for the ITL interval (a seeded subsample beyond: memory, not accuracy)


_STATS = ("mean",) + tuple(f"p{p}" for p in PERCENTILES)
LATENCY_INTERVAL_METRICS = tuple(f"{fam}_{s}_ms" for fam in LATENCY_FAMILIES for s in _STATS)
THROUGHPUT_INTERVAL_METRICS = ("request_throughput", "input_throughput", "output_throughput",
                               "total_token_throughput", "output_throughput_per_gpu", "goodput")
# Metrics with an interval (a trials row's and a level's ``<metric>_low`` / ``<metric>_high``),
# plus the capacity search's own bracket (orchestrator.trial.capacity) and what pricing derives from them.
INTERVAL_METRICS = LATENCY_INTERVAL_METRICS + THROUGHPUT_INTERVAL_METRICS + (
    "capacity_rps", "capacity_goodput", "goodput_per_gpu", "capacity_rps_per_gpu", "cost_per_mtok")


def interval_columns(metrics: Iterable[str] = INTERVAL_METRICS) -> list[str]:
    return [c for m in metrics for c in (f"{m}_low", f"{m}_high")]


@dataclass(frozen=True)
class Interval:
    """Where a metric's true value lies, at the stated confidence (None: unbounded on that side)."""

    low: Optional[float]
    high: Optional[float]

    def columns(self, metric: str) -> dict[str, Optional[float]]:
        return {f"{metric}_low": self.low, f"{metric}_high": self.high}


def z_of(confidence: float) -> float:
    """The two-sided normal quantile of ``confidence`` (0.90 -> 1.645)."""

    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def t_of(confidence: float, dof: float) -> float:
    """The two-sided Student-t quantile of ``confidence`` with ``dof`` degrees of freedom (exact for
    one; a Cornish-Fisher expansion in 1/dof otherwise, within 1% from two on; the normal's beyond)."""
    if dof >= 1e6:
        return z_of(confidence)
    if dof <= 1:
        return math.tan(math.pi * confidence / 2.0)
    z = z_of(confidence)
    g1 = (z ** 3 + z) / 4.0
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96.0
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384.0
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160.0
    return z + g1 / dof + g2 / dof ** 2 + g3 / dof ** 3 + g4 / dof ** 4


def _band(draws: np.ndarray, confidence: float, point: float, inflation: tuple[float, float]) -> Optional[Interval]:
    """The central ``confidence`` share of the draws, widened ``inflation`` (below, above) times in
    log space around ``point`` (a band that does not hold the point is first stretched to it)."""
    draws = draws[np.isfinite(draws)]
    if len(draws) == 0 or not math.isfinite(point):
        return None
    a = (1.0 - confidence) / 2.0
    lo, hi = (float(x) for x in np.quantile(draws, [a, 1.0 - a]))
    lo, hi = min(lo, point), max(hi, point)
    below, above = inflation
    if point <= 0 or lo <= 0:
        return Interval(point - below * (point - lo), point + above * (hi - point))
    return Interval(max(point * (lo / point) ** below, point / MAX_RATIO),
                    min(point * (hi / point) ** above, point * MAX_RATIO))


# ------------------------------------------------------------------ the intervals
def _with_window_noise(band: Interval, point: float, half_width: float) -> Interval:
    """``band`` widened on both sides by ``half_width`` (log units) in quadrature."""
    if half_width <= 0 or point <= 0 or band.low is None or band.high is None or band.low <= 0:
        return band
    below = math.hypot(math.log(point / band.low), half_width)
    above = math.hypot(math.log(band.high / point), half_width)
    cap = math.log(MAX_RATIO)
    return Interval(point * math.exp(-min(below, cap)), point * math.exp(min(above, cap)))


@dataclass(frozen=True)
class MetricDraws:
    """One metric's bootstrap: its point value and ``draws`` (one per resample, the same resamples for
    every metric of one call), each draw already widened as the metric's interval is (per statistic,
    :data:`INFLATION`; by the engine's window noise and start noise). Two calls over the same request
    set with the same ``seed`` resample the same blocks: their draws are paired, and a difference of
    two configurations' draws is the paired difference's bootstrap (:mod:`orchestrator.results.paired`)."""

    point: float
    draws: np.ndarray
    raw: Optional[np.ndarray] = None  # the same resamples not widened per statistic (the engine's noise still
    # added): what a paired comparison differences, where both sides' widening would not cancel


def _widened(draws: np.ndarray, point: float, inflation: tuple[float, float]) -> np.ndarray:
    """Each draw moved away from ``point`` by the statistic's inflation (in log space, capped at
    :data:`MAX_RATIO`; linearly where a value is not positive): the draws whose quantiles are the
    interval :func:`_band` gives."""
    below, above = inflation
    out = np.array(draws, dtype=float)
    if not math.isfinite(point):
        return out
    if point > 0:
        pos = out > 0
        d = np.log(np.where(pos, out, 1.0) / point)
        d = np.clip(np.where(d < 0, d * below, d * above), -math.log(MAX_RATIO), math.log(MAX_RATIO))
        return np.where(pos, point * np.exp(d), point - below * (point - out))
    return np.where(out < point, point - below * (point - out), point + above * (out - point))


def _bootstrap(records: Sequence[RequestRecord], metrics: Iterable[str], *, gpus: int, slo: RequestSLO,
               block_s: float, samples: int, seed: int, block_requests: Optional[int] = None):
    """``(windows, {metric: (point, raw draws, inflation)})``: the block bootstrap of each metric
    over the measured records (see :func:`metric_intervals`)."""
    wanted = [m for m in dict.fromkeys(metrics) if m in LATENCY_INTERVAL_METRICS or m in THROUGHPUT_INTERVAL_METRICS]
    measured = [r for r in records if not r.warmup and r.sent_s is not None]
    if not wanted or not measured:
        return 0, {}
    blocks = cut_blocks(measured, block_s, block_requests)
    windows = len({r.window for r in measured})
    k = blocks.count
    counts = block_weights(blocks, seed, samples)  # (B, k)
    ok = np.array([r.success for r in measured])
    g_all = blocks.of_request
    out: dict[str, tuple[float, np.ndarray, tuple[float, float]]] = {}

    def latency(fam: str) -> tuple[np.ndarray, np.ndarray]:
        if fam == "itl":
            vals, grp = [], []
            for r, g in zip(measured, g_all):
                if r.success:
                    gaps = r.itl_s
                    vals.extend(gaps)
                    grp.extend([g] * len(gaps))
            v, gr = np.asarray(vals, dtype=float), np.asarray(grp, dtype=np.int64)
            if len(v) > _ITL_CAP:
                keep = np.sort(np.random.default_rng(seed + 1).choice(len(v), _ITL_CAP, replace=False))
                v, gr = v[keep], gr[keep]
            return v * 1000.0, gr
        attr = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "latency_s"}[fam]
        pairs = [(getattr(r, attr), g) for r, g, s in zip(measured, g_all, ok) if s and getattr(r, attr) is not None]
        return (np.array([p[0] for p in pairs], dtype=float) * 1000.0, np.array([p[1] for p in pairs], dtype=np.int64))

    for fam in LATENCY_FAMILIES:
        names = [m for m in wanted if m.startswith(f"{fam}_")]
        if not names:
            continue
        values, groups = latency(fam)
        if len(values) == 0:
            continue
        ordered = None
        for m in names:
            stat = m[len(fam) + 1:-3]
            if stat == "mean":
                draws, point = weighted_means(values, groups, counts), float(values.mean())
            else:
                q = int(stat[1:])
                ordered = ordered or SortedByBlock(values, groups, k)
                draws, point = ordered.quantiles(counts, q / 100.0), float(np.percentile(values, q))
            widen = SLOW_TAIL_INFLATION.get(stat, INFLATION[stat]) if fam != "ttft" else INFLATION[stat]
            if stat != "mean" and stat != "p50":
                few = max(1.0, math.sqrt(MIN_TAIL / max(len(values) * (1.0 - int(stat[1:]) / 100.0), 1e-9)))
                widen = (widen[0] * few, widen[1] * few)
            out[m] = (point, draws, widen)

    through = [m for m in wanted if m in THROUGHPUT_INTERVAL_METRICS]
    if through:
        # The load sets the rate at which requests arrive (Poisson and gamma windows realise it
        # exactly): what varies is what the requests carry and how many succeed. So a throughput is
        # drawn as a ratio, (per-request amount over the drawn blocks) x (the window's requests per
        # second); drawing the blocks' seconds too would add arrival noise the window does not have.
        duration = blocks.duration
        rate = len(measured) / duration if duration > 0 else 0.0

        def per_block(weights: Iterable[float]) -> np.ndarray:
            return np.bincount(g_all, weights=np.fromiter(weights, dtype=float, count=len(measured)), minlength=k)

        n_drawn = counts @ per_block(1.0 for _ in measured)
        in_tokens = per_block((r.prompt_tokens if r.prompt_tokens is not None else r.expected_prompt_tokens) if s
                              else 0 for r, s in zip(measured, ok))
        out_tokens = per_block(r.output_tokens if s else 0 for r, s in zip(measured, ok))
        sums = {"request_throughput": per_block(ok.astype(float)),
                "input_throughput": in_tokens, "output_throughput": out_tokens,
                "total_token_throughput": in_tokens + out_tokens,
                "output_throughput_per_gpu": out_tokens / max(gpus, 1),
                "goodput": per_block((1.0 if s and (slo.empty or slo.met_by(r)) else 0.0)
                                     for r, s in zip(measured, ok))}
        for m in through:
            point = float(sums[m].sum()) / max(len(measured), 1) * rate
            out[m] = (point, (counts @ sums[m]) / np.maximum(n_drawn, 1e-12) * rate, INFLATION["throughput"])
    return windows, out


def metric_intervals(records: Sequence[RequestRecord], metrics: Iterable[str], *, confidence: float = DEFAULT_CONFIDENCE,
                     gpus: int = 1, slo: RequestSLO = RequestSLO(), block_s: float = BLOCK_S,
                     samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
                     window_noise: WindowNoise = NO_WINDOW_NOISE,
                     start_noise: WindowNoise = NO_WINDOW_NOISE,
                     block_requests: Optional[int] = None) -> dict[str, Interval]:
    """Intervals of ``metrics`` (those of :data:`INTERVAL_METRICS` a window has; the rest are left
    out) over the measured ``records`` of one or more windows (``RequestRecord.window``), already
    restricted to the measurement window as :func:`orchestrator.measure.metrics.summarise` does.
    ``window_noise``: the engine's between-window noise, added to the latency metrics it names;
    ``start_noise``: its between-start noise (every window of one trial shares one engine start)."""
    windows, boot = _bootstrap(records, metrics, gpus=gpus, slo=slo, block_s=block_s, samples=samples, seed=seed,
                               block_requests=block_requests)
    out: dict[str, Interval] = {}
    if not boot:
        return out
    noise_scale = z_of(confidence) / math.sqrt(windows)  # pooled windows average it
    z = z_of(confidence)
    for m, (point, draws, widen) in boot.items():
        band = _band(draws, confidence, point, widen)
        if band is not None:
            half = math.hypot(window_noise.sd_of(m) * noise_scale, start_noise.sd_of(m) * z)
            out[m] = _with_window_noise(band, point, half)
    return out


def metric_draws(records: Sequence[RequestRecord], metrics: Iterable[str], *, gpus: int = 1,
                 slo: RequestSLO = RequestSLO(), block_s: float = BLOCK_S, samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = 0, window_noise: WindowNoise = NO_WINDOW_NOISE,
                 start_noise: WindowNoise = NO_WINDOW_NOISE, noise_seed: Optional[int] = None,
                 start_shift: Optional[Mapping[str, np.ndarray]] = None,
                 block_requests: Optional[int] = None) -> dict[str, MetricDraws]:
    """The bootstrap :func:`metric_intervals` takes its intervals from, as draws: the same blocks
    resampled (``seed``), each draw widened per statistic, then moved by the engine's noise. Window
    noise is drawn per call (``noise_seed``: this trial's own, never shared with another trial);
    start noise is ``start_shift[metric]`` (log units, one per draw) where given, so that every level
    of one engine start moves together, or drawn here from ``start_noise``."""
    windows, boot = _bootstrap(records, metrics, gpus=gpus, slo=slo, block_s=block_s, samples=samples, seed=seed,
                               block_requests=block_requests)
    noise = np.random.default_rng(noise_seed)
    out: dict[str, MetricDraws] = {}
    for m, (point, draws, widen) in boot.items():
        d = _widened(draws, point, widen)
        raw = np.array(draws, dtype=float)
        shift = np.zeros(len(d))
        w_sd = window_noise.sd_of(m) / math.sqrt(max(windows, 1))
        if w_sd > 0:
            shift += noise.normal(0.0, w_sd, len(d))
        if start_shift is not None and m in start_shift:
            shift += start_shift[m]
        elif start_noise.sd_of(m) > 0:
            shift += noise.normal(0.0, start_noise.sd_of(m), len(d))
        if np.any(shift != 0):
            d = np.where(d > 0, d * np.exp(shift), d)
            raw = np.where(raw > 0, raw * np.exp(shift), raw)
        out[m] = MetricDraws(point, d, raw)
    return out


def scaled(interval: Optional[Interval], factor: Optional[float]) -> Optional[Interval]:
    """``interval`` times a positive constant (per GPU, per dollar); None when either is missing."""
    if interval is None or factor is None or not math.isfinite(factor) or factor <= 0:
        return None
    return Interval(None if interval.low is None else interval.low * factor,
                    None if interval.high is None else interval.high * factor)


def intervals_to_columns(intervals: Mapping[str, Interval]) -> dict[str, Optional[float]]:
    out: dict[str, Optional[float]] = {}
    for m, iv in intervals.items():
        out.update(iv.columns(m))
    return out
