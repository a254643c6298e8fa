"""vLLM's own latency histograms and counters over one measured window: the ``engine_*`` columns.

:class:`~orchestrator.measure.telemetry.EngineWindow` snapshots the engine's histograms when the measured requests start
(after the warm-up) and again after they end, and :func:`engine_window_metrics` turns the
difference into the ``engine_*`` columns: quantiles interpolated within buckets as
Prometheus' ``histogram_quantile`` does, means exact from ``_sum`` / ``_count``,
throughputs over the engine's active time. See docs/metrics.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from orchestrator.measure.metrics import ENGINE_PERCENTILES, ENGINE_WINDOW_METRIC_NAMES

__all__ = ["EngineSnapshot", "HISTOGRAMS", "Histogram", "UNSUCCESSFUL_REASONS", "WINDOW_COUNTERS",
           "engine_segments_metrics", "engine_snapshot", "engine_window_metrics"]

# vLLM's latency histograms (seconds), by our family name: their names, newest first.
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("time_to_first_token_seconds",),
    "itl": ("inter_token_latency_seconds", "time_per_output_token_seconds"),  # the older name of the same
    "tpot": ("request_time_per_output_token_seconds",),
    "e2el": ("e2e_request_latency_seconds",),
    "queue": ("request_queue_time_seconds",),
    "prefill": ("request_prefill_time_seconds",),
    "decode": ("request_decode_time_seconds",),
}
# Counters read over a measured window.
WINDOW_COUNTERS = {"generation_tokens": "generation_tokens_total", "request_success": "request_success_total",
                   # speculative decoding (exported only with a speculative_config)
                   "spec_drafts": "spec_decode_num_drafts_total",
                   "spec_draft_tokens": "spec_decode_num_draft_tokens_total",
                   "spec_accepted_tokens": "spec_decode_num_accepted_tokens_total"}
# vllm:request_success is labelled by finished_reason; these are not what the client counts as completed.
UNSUCCESSFUL_REASONS = frozenset({"abort", "error"})


@dataclass(frozen=True)
class Histogram:
    """One Prometheus histogram: cumulative ``(le, count)`` buckets in ascending ``le`` (the
    last is ``+Inf``), ``sum`` and ``count`` of the observations."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, earlier: Optional["Histogram"]) -> Optional["Histogram"]:
        """The observations made after ``earlier`` (None: all of them). None when the two
        cannot be subtracted: other bucket bounds, or a counter went down (the engine restarted)."""
        if earlier is None:
            return self
        if [le for le, _ in earlier.buckets] != [le for le, _ in self.buckets]:
            return None
        buckets = tuple((le, c - c0) for (le, c), (_, c0) in zip(self.buckets, earlier.buckets))
        count = self.count - earlier.count
        if count < 0 or any(c < 0 for _, c in buckets):
            return None
        return Histogram(buckets, self.sum - earlier.sum, count)

    def plus(self, other: Optional["Histogram"]) -> Optional["Histogram"]:
        """Both histograms' observations (None when their bucket bounds differ)."""
        if other is None or [le for le, _ in other.buckets] != [le for le, _ in self.buckets]:
            return None
        return Histogram(tuple((le, c + c2) for (le, c), (_, c2) in zip(self.buckets, other.buckets)),
                         self.sum + other.sum, self.count + other.count)

    @property
    def mean(self) -> Optional[float]:
        return self.sum / self.count if self.count > 0 else None

    def _locate(self, q: float) -> Optional[tuple[int, float]]:
        total = self.buckets[-1][1] if self.buckets else 0.0
        if total <= 0 or not 0.0 <= q <= 1.0:
            return None
        rank = q * total
        for i, (_, c) in enumerate(self.buckets):
            if c >= rank:
                return i, rank
        return len(self.buckets) - 1, rank  # pragma: no cover - the +Inf bucket holds every observation

    def quantile(self, q: float) -> Optional[float]:
        """``histogram_quantile(q, ...)`` as Prometheus computes it: linear interpolation inside
        the bucket holding rank ``q * count``; the first bucket starts at 0; a rank in the
        ``+Inf`` bucket answers the largest finite bound. None without observations."""
        found = self._locate(q)
        if found is None:
            return None
        i, rank = found
        le, c = self.buckets[i]
        if math.isinf(le):
            return self.buckets[i - 1][0] if i > 0 else None
        lower, below = (self.buckets[i - 1][0], self.buckets[i - 1][1]) if i > 0 else (0.0, 0.0)
        if i == 0 and le <= 0:
            return le
        inside = c - below
        return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)

    def quantile_upper(self, q: float) -> Optional[float]:
        """Upper bound of the bucket holding rank ``q * count``: the true quantile of the
        observations is at most this (``inf`` in the ``+Inf`` bucket; None without observations)."""
        found = self._locate(q)
        return None if found is None else self.buckets[found[0]][0]


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's histograms and window counters at one moment (``t``: ``time.monotonic()``
    when the scrape answered)."""

    t: float
    histograms: dict[str, Histogram]  # by our family name (HISTOGRAMS)
    counters: dict[str, float]  # by our name (WINDOW_COUNTERS); absent: not exported

    @property
    def finished_requests(self) -> Optional[float]:
        """Requests the engine finished so far (the E2E histogram's count)."""
        h = self.histograms.get("e2el")
        return h.count if h is not None else None


def engine_snapshot(samples: Iterable[tuple[str, dict[str, str], float]], prefix: str, t: float) -> EngineSnapshot:
    """Histograms and window counters from parsed samples (``iter_samples``): each summed over
    its label sets (several engines add up), keeping buckets apart by ``le``."""
    by_name: dict[str, str] = {}
    for fam, names in HISTOGRAMS.items():
        for n in names:
            by_name[prefix + n] = fam
    counter_names = {prefix + theirs: ours for ours, theirs in WINDOW_COUNTERS.items()}
    buckets: dict[tuple[str, str], dict[float, float]] = {}
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    counters: dict[str, float] = {}
    for name, labels, v in samples:
        if name in counter_names:
            if labels.get("finished_reason", "").lower() in UNSUCCESSFUL_REASONS:
                continue
            ours = counter_names[name]
            counters[ours] = counters.get(ours, 0.0) + v
            continue
        base, _, suffix = name.rpartition("_")
        fam = by_name.get(base)
        if fam is None:
            continue
        key = (fam, base)
        if suffix == "bucket":
            try:
                le = float(labels.get("le", "nan"))
            except ValueError:
                continue
            if le != le:  # NaN: no bound
                continue
            per_le = buckets.setdefault(key, {})
            per_le[le] = per_le.get(le, 0.0) + v
        elif suffix == "sum":
            sums[key] = sums.get(key, 0.0) + v
        elif suffix == "count":
            counts[key] = counts.get(key, 0.0) + v
    histograms: dict[str, Histogram] = {}
    for fam, names in HISTOGRAMS.items():
        for n in names:  # the first name the engine exports
            key = (fam, prefix + n)
            if key in buckets:
                per_le = sorted(buckets[key].items())
                if not math.isinf(per_le[-1][0]):
                    per_le.append((math.inf, counts.get(key, per_le[-1][1])))
                histograms[fam] = Histogram(tuple(per_le), sums.get(key, 0.0), counts.get(key, per_le[-1][1]))
                break
    return EngineSnapshot(t, histograms, counters)


def engine_window_metrics(start: Optional[EngineSnapshot], end: Optional[EngineSnapshot],
                          series: Sequence[tuple[float, float]] = (), first_send_t: Optional[float] = None,
                          exact_sums: bool = True) -> dict[str, Optional[float]]:
    """The ``engine_*`` columns of one measured window, from snapshots at its start and end.

    Latencies: the histograms' difference (what the engine observed in the window):
    mean (exact, ``_sum / _count``) and p50/p90/p99 (``histogram_quantile``), in ms, plus
    ``engine_ttft_p50_upper_ms``, the upper bound of the bucket holding the median TTFT.
    Throughputs: the increase of ``generation_tokens`` (``request_success``, requests that
    finished normally) over the engine's active time, from ``first_send_t`` (when the
    client sent its first measured request; default the start snapshot) to the first
    scrape that already saw the counter's final value (``series``: ``(t, generation
    tokens)`` of every scrape). That end is at or after the engine's last token, so the
    throughput is at most one scrape interval pessimistic, never optimistic.
    Null where the engine does not export a metric or nothing was observed, and the means
    when ``exact_sums`` is False: Ray's metrics agent re-records a histogram from its bucket
    counts at the buckets' midpoints (``ray/_private/telemetry/open_telemetry_metric_recorder.py``),
    so its ``_sum`` is not the observations' sum.
    """
    if start is None or end is None:
        return {name: None for name in ENGINE_WINDOW_METRIC_NAMES}
    return engine_segments_metrics([(start, end, first_send_t)], series, exact_sums)


@dataclass(frozen=True)
class _Segment:
    histograms: dict[str, Histogram]  # what the engine observed in the segment
    tokens: Optional[float]  # generation tokens (None: not exported, or the engine restarted)
    requests: Optional[float]
    active: float  # seconds from the first send to the counter's final value
    spec: Optional[tuple[float, float, float]] = None  # drafts, draft tokens, accepted tokens in the segment


def _spec(start: EngineSnapshot, end: EngineSnapshot) -> Optional[tuple[float, float, float]]:
    names = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")
    if any(n not in end.counters for n in names):
        return None
    d = tuple(end.counters[n] - start.counters.get(n, 0.0) for n in names)
    return d if min(d) >= 0 else None  # a counter went down: the engine restarted


def _segment(start: EngineSnapshot, end: EngineSnapshot, series: Sequence[tuple[float, float]],
             first_send_t: Optional[float]) -> _Segment:
    hists = {}
    for fam, h_end in end.histograms.items():
        d = h_end.minus(start.histograms.get(fam))
        if d is not None and d.count > 0:
            hists[fam] = d
    tokens_end = end.counters.get("generation_tokens")
    if tokens_end is None:
        return _Segment(hists, None, None, 0.0)
    tokens = tokens_end - start.counters.get("generation_tokens", 0.0)  # Ray exports a counter once it moved
    if tokens < 0:
        return _Segment(hists, None, None, 0.0)  # the engine restarted in the window
    req_end = end.counters.get("request_success")
    reqs = None if req_end is None else req_end - start.counters.get("request_success", 0.0)
    done = end.t
    for t, v in sorted(series):
        if start.t < t < done and v >= tokens_end:
            done = t
            break
    begin = first_send_t if first_send_t is not None else start.t
    return _Segment(hists, tokens, reqs if reqs is None or reqs >= 0 else None, max(done - begin, 0.0),
                    _spec(start, end))


def engine_segments_metrics(segments: Sequence[tuple[EngineSnapshot, EngineSnapshot, Optional[float]]],
                            series: Sequence[tuple[float, float]] = (),
                            exact_sums: bool = True) -> dict[str, Optional[float]]:
    """:func:`engine_window_metrics` over several windows of one level (``(start, end, first send)``
    each): their histograms' differences added, their tokens over their summed active times."""
    out: dict[str, Optional[float]] = {name: None for name in ENGINE_WINDOW_METRIC_NAMES}
    if any(a is None or b is None for a, b, _ in segments):
        return out  # a scrape failed: the windows cannot be told apart from what came between
    parts = [_segment(a, b, series, t) for a, b, t in segments]
    if not parts:
        return out
    for fam in {f for p in parts for f in p.histograms}:
        hs = [p.histograms[fam] for p in parts if fam in p.histograms]
        d = hs[0]
        for h in hs[1:]:
            d = d.plus(h)
        if d is None or d.count <= 0:
            continue
        out[f"engine_{fam}_mean_ms"] = d.mean * 1000.0 if exact_sums else None
        for p in ENGINE_PERCENTILES:
            v = d.quantile(p / 100.0)
            out[f"engine_{fam}_p{p}_ms"] = v * 1000.0 if v is not None else None
        if fam == "ttft":
            upper = d.quantile_upper(0.5)
            out["engine_ttft_p50_upper_ms"] = upper * 1000.0 if upper is not None and math.isfinite(upper) else None
    if all(p.spec is not None for p in parts):
        drafts, drafted, accepted = (sum(p.spec[i] for p in parts) for i in range(3))
        out["engine_spec_acceptance_rate"] = accepted / drafted if drafted > 0 else None
        out["engine_spec_accepted_per_draft"] = accepted / drafts if drafts > 0 else None
    if any(p.tokens is None for p in parts):
        return out
    tokens = sum(p.tokens for p in parts)
    if all(p.spec is not None for p in parts) and tokens > 0:
        # How much of the output speculation made: high acceptance of rare proposals buys nothing.
        out["engine_spec_token_share"] = sum(p.spec[2] for p in parts) / tokens
    if tokens == 0:
        out["engine_output_throughput"] = 0.0
        out["engine_request_throughput"] = 0.0 if all(p.requests is not None for p in parts) else None
        return out
    active = sum(p.active for p in parts)
    if active <= 0:
        return out
    out["engine_output_throughput"] = tokens / active
    if all(p.requests is not None for p in parts):
        out["engine_request_throughput"] = sum(p.requests for p in parts) / active
    return out
