"""Server-side telemetry during a load window: the engine's Prometheus metrics and NVML.

A background thread samples both every ``interval_s``. Gauges become peak and
mean, counters become the increase over the window. A source that is not
available yields nulls, never invented numbers.

vLLM's own latency histograms (TTFT, ITL, TPOT, E2E, queue, prefill, decode) are
read over a measured window: :class:`EngineWindow` snapshots them when the
measured requests start (after the warm-up) and after they end, and
:func:`engine_window_metrics` turns the difference into the ``engine_*`` columns
(quantiles interpolated within buckets as Prometheus' ``histogram_quantile``
does; means exact from ``_sum`` / ``_count``; throughputs over the engine's
active time). See docs/metrics.md.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence

log = logging.getLogger(__name__)

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNaN]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_labels(text: Optional[str]) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def iter_samples(text: str, labels: Optional[Mapping[str, str]] = None,
                 prefix: str = "") -> Iterable[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample whose name starts with ``prefix`` and whose
    labels include ``labels``."""
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(prefix):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        have = parse_labels(m.group(2))
        if labels and any(have.get(k) != v for k, v in labels.items()):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        yield m.group(1), have, v


def parse_prometheus(text: str, labels: Optional[dict[str, str]] = None) -> dict[str, float]:
    """Sum each metric over its label sets (several engines or label values add up),
    keeping only samples whose labels include ``labels``."""
    out: dict[str, float] = {}
    for name, _, v in iter_samples(text, labels):
        out[name] = out.get(name, 0.0) + v
    return out


# Our names for the vLLM metrics we read (vLLM v1 names; identical in 0.26 and 0.29).
GAUGES = {
    "kv_cache_usage": "kv_cache_usage_perc",
    "num_requests_running": "num_requests_running",
    "num_requests_waiting": "num_requests_waiting",
}
COUNTERS = {
    "num_preemptions": "num_preemptions_total",
    "prefix_cache_queries": "prefix_cache_queries_total",
    "prefix_cache_hits": "prefix_cache_hits_total",
}


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
WINDOW_COUNTERS = {"generation_tokens": "generation_tokens_total", "request_success": "request_success_total"}
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


def _engine_latency_names() -> list[str]:
    from orchestrator.metrics import ENGINE_WINDOW_METRIC_NAMES

    return list(ENGINE_WINDOW_METRIC_NAMES)


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
    out: dict[str, Optional[float]] = {name: None for name in _engine_latency_names()}
    if start is None or end is None:
        return out
    from orchestrator.metrics import ENGINE_PERCENTILES

    for fam, h_end in end.histograms.items():
        d = h_end.minus(start.histograms.get(fam))
        if d is None or d.count <= 0:
            continue
        out[f"engine_{fam}_mean_ms"] = d.mean * 1000.0 if exact_sums else None
        for p in ENGINE_PERCENTILES:
            v = d.quantile(p / 100.0)
            out[f"engine_{fam}_p{p}_ms"] = v * 1000.0 if v is not None else None
        if fam == "ttft":
            upper = d.quantile_upper(0.5)
            out["engine_ttft_p50_upper_ms"] = upper * 1000.0 if upper is not None and math.isfinite(upper) else None

    tokens_end = end.counters.get("generation_tokens")
    if tokens_end is None:
        return out
    tokens = tokens_end - start.counters.get("generation_tokens", 0.0)  # Ray exports a counter once it moved
    begin = first_send_t if first_send_t is not None else start.t
    if tokens < 0:
        return out  # the engine restarted in the window
    if tokens == 0:
        out["engine_output_throughput"] = 0.0
        out["engine_request_throughput"] = 0.0 if "request_success" in end.counters else None
        return out
    done = end.t
    for t, v in sorted(series):
        if start.t < t < done and v >= tokens_end:
            done = t
            break
    active = done - begin
    if active <= 0:
        return out
    out["engine_output_throughput"] = tokens / active
    req_end = end.counters.get("request_success")
    if req_end is not None:
        reqs = req_end - start.counters.get("request_success", 0.0)
        out["engine_request_throughput"] = reqs / active if reqs >= 0 else None
    return out



@dataclass
class _Series:
    values: list[float] = field(default_factory=list)

    def add(self, v: Optional[float]) -> None:
        if v is not None:
            self.values.append(v)

    @property
    def peak(self) -> Optional[float]:
        return max(self.values) if self.values else None

    @property
    def mean(self) -> Optional[float]:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def increase(self) -> Optional[float]:
        return (self.values[-1] - self.values[0]) if len(self.values) >= 2 else None


class NvmlSampler:
    """Memory, utilisation, power and energy of the given GPU indices (all if None)."""

    def __init__(self, indices: Optional[list[int]] = None):
        from orchestrator.nvml import load_pynvml

        pynvml = load_pynvml()
        self.nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (indices or range(count))]
        self.energy0 = self._energy()

    def _energy(self) -> Optional[float]:
        try:
            return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1000.0
        except Exception:  # noqa: BLE001 - not all GPUs expose the counter
            return None

    def sample(self) -> dict[str, float]:
        mem = sum(self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles) / 2**30
        util = sum(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles) / len(self.handles)
        try:
            power = sum(self.nvml.nvmlDeviceGetPowerUsage(h) for h in self.handles) / 1000.0
        except Exception:  # noqa: BLE001
            power = None
        return {"mem_gib": mem, "util": util, "power_w": power}

    def energy_j(self) -> Optional[float]:
        e = self._energy()
        return (e - self.energy0) if (e is not None and self.energy0 is not None) else None


def try_nvml(indices: Optional[list[int]] = None) -> Optional[NvmlSampler]:
    try:
        return NvmlSampler(indices)
    except Exception as e:  # noqa: BLE001 - no driver / no GPU: telemetry stays null
        log.debug("NVML unavailable: %s", e)
        return None


class TelemetrySampler:
    """Samples while a load runs: ``with TelemetrySampler(...) as t: ...; t.summary()``."""

    def __init__(self, metrics_url: Optional[str], *, prefix: str = "vllm:", interval_s: float = 0.5,
                 labels: Optional[dict[str, str]] = None, nvml: Optional[NvmlSampler] = None,
                 fetch: Optional[Callable[[str], str]] = None, settle_timeout_s: Optional[float] = None):
        self.metrics_url = metrics_url
        self.prefix = prefix
        self.labels = labels or None
        self.interval_s = interval_s
        self.nvml = nvml
        self.fetch = fetch or _http_get
        # How long a window's edge waits for the engine's histograms to count the requests the
        # client saw finish: Ray's metrics agent exports ray.serve.llm's metrics every few seconds.
        self.settle_timeout_s = settle_timeout_s if settle_timeout_s is not None else (
            15.0 if prefix.startswith("ray_") else 2.0)
        # Ray's agent exports a histogram's _sum from bucket midpoints: no exact means through it.
        self.exact_sums = not prefix.startswith("ray_")
        self.gauges = {k: _Series() for k in GAUGES}
        self.counters = {k: _Series() for k in COUNTERS}
        self.gpu = {k: _Series() for k in ("mem_gib", "util", "power_w")}
        self.series: list[tuple[float, float]] = []  # (t, generation tokens) of every periodic scrape
        self.scrape_errors = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._energy_start_t = None

    def _scrape(self, record: bool) -> Optional[EngineSnapshot]:
        """One scrape of the engine's metrics; ``record``: into the gauge and counter series."""
        if not self.metrics_url:
            return None
        try:
            samples = list(iter_samples(self.fetch(self.metrics_url), self.labels, self.prefix))
            snap = engine_snapshot(samples, self.prefix, time.monotonic())
        except Exception:  # noqa: BLE001 - a missed scrape is not a failed trial
            self.scrape_errors += 1
            return None
        t = snap.t
        if record:
            values: dict[str, float] = {}
            for name, _, v in samples:
                values[name] = values.get(name, 0.0) + v
            for ours, theirs in GAUGES.items():
                self.gauges[ours].add(values.get(self.prefix + theirs))
            for ours, theirs in COUNTERS.items():
                self.counters[ours].add(values.get(self.prefix + theirs))
            if "generation_tokens" in snap.counters:
                self.series.append((t, snap.counters["generation_tokens"]))
        return snap

    def sample_once(self) -> None:
        self._scrape(record=True)
        if self.nvml is not None:
            try:
                for k, v in self.nvml.sample().items():
                    self.gpu[k].add(v)
            except Exception:  # noqa: BLE001
                pass

    def snapshot(self) -> Optional[EngineSnapshot]:
        """The engine's histograms and window counters now (None: no metrics, or the scrape failed)."""
        return self._scrape(record=False)

    def settled_snapshot(self, baseline: Optional[EngineSnapshot], finished: int) -> Optional[EngineSnapshot]:
        """A snapshot once the engine counts ``finished`` more finished requests than ``baseline``
        (the ones the client saw end), or after ``settle_timeout_s``: exporters that lag
        (Ray's metrics agent) would otherwise put a window's last requests into the next one."""
        snap = self.snapshot()
        if baseline is None or snap is None or finished <= 0 or baseline.finished_requests is None:
            return snap
        deadline = time.monotonic() + self.settle_timeout_s
        while ((snap.finished_requests or 0.0) - baseline.finished_requests < finished
               and time.monotonic() < deadline):
            time.sleep(0.1)
            snap = self.snapshot() or snap
        return snap

    def window(self) -> "EngineWindow":
        """A measured window's engine-side metrics (see :class:`EngineWindow`)."""
        return EngineWindow(self)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def __enter__(self) -> "TelemetrySampler":
        self.sample_once()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sample_once()

    def summary(self) -> dict[str, Optional[float]]:
        hits, queries = self.counters["prefix_cache_hits"].increase, self.counters["prefix_cache_queries"].increase
        if queries and hits is None and not self.counters["prefix_cache_hits"].values:
            hits = 0.0  # Ray exports a counter only once it moved: no series means no hit
        return {
            "kv_cache_usage_peak": self.gauges["kv_cache_usage"].peak,
            "kv_cache_usage_mean": self.gauges["kv_cache_usage"].mean,
            "num_requests_running_peak": self.gauges["num_requests_running"].peak,
            "num_requests_running_mean": self.gauges["num_requests_running"].mean,
            "num_requests_waiting_peak": self.gauges["num_requests_waiting"].peak,
            "num_requests_waiting_mean": self.gauges["num_requests_waiting"].mean,
            "num_preemptions": self.counters["num_preemptions"].increase,
            "prefix_cache_hit_rate": (hits / queries) if (hits is not None and queries) else None,
            "gpu_mem_peak_gib": self.gpu["mem_gib"].peak,
            "gpu_util_mean": self.gpu["util"].mean,
            "gpu_power_mean_w": self.gpu["power_w"].mean,
            "gpu_energy_j": self.nvml.energy_j() if self.nvml is not None else None,
        }


class EngineWindow:
    """The engine's side of one measured window (a load, or one capacity level)::

        window = sampler.window()                       # before the warm-up requests
        records = run_load_sync(..., on_measure_start=window.begin)
        columns = window.finish(records)                # the engine_* columns

    ``begin`` (called by the load generator once the warm-up requests are done, right
    before the measured clock starts) snapshots the histograms; ``finish`` snapshots
    them again once the engine counts every request the client saw complete, and
    returns :func:`engine_window_metrics` of the two.
    """

    def __init__(self, sampler: TelemetrySampler):
        self.sampler = sampler
        self.before = sampler.snapshot() if sampler.metrics_url else None
        self.start: Optional[EngineSnapshot] = None
        self.t0: Optional[float] = None  # time.monotonic() when the measured clock started

    def begin(self, warmup_records: Sequence = ()) -> None:
        done = sum(1 for r in warmup_records if r.success)
        self.start = self.sampler.settled_snapshot(self.before, done) if done else self.sampler.snapshot()
        self.t0 = time.monotonic()

    def finish(self, records: Sequence) -> dict[str, Optional[float]]:
        measured = [r for r in records if not r.warmup]
        if self.start is None or self.t0 is None or not measured:
            return engine_window_metrics(None, None)
        end = self.sampler.settled_snapshot(self.start, sum(1 for r in measured if r.success))
        sends = [r.sent_s for r in measured if r.sent_s is not None]
        first_send = self.t0 + min(sends) if sends else None
        return engine_window_metrics(self.start, end, list(self.sampler.series), first_send,
                                     exact_sums=self.sampler.exact_sums)


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode("utf-8", "replace")
