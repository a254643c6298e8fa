"""Server-side telemetry during a load window: the engine's Prometheus metrics and NVML.

A background thread samples both every ``interval_s``. Gauges become peak and
mean, counters become the increase over the window. A source that is not
available yields nulls, never invented numbers.

The same sampler scrapes the snapshots of vLLM's latency histograms that
:class:`EngineWindow` takes around each measured window
(the ``engine_*`` columns, see :mod:`orchestrator.measure.engine_window`). The text format is
read by :mod:`orchestrator.measure.prometheus_text`, the GPUs by :mod:`orchestrator.measure.nvml`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from orchestrator.measure.engine_window import (EngineSnapshot, engine_segments_metrics, engine_snapshot,
                                                engine_window_metrics)
from orchestrator.measure.nvml import NvmlSampler
from orchestrator.measure.prometheus_text import fetch_metrics_text, iter_samples

__all__ = ["COUNTERS", "EngineWindow", "GAUGES", "TelemetrySampler"]

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
        self.fetch = fetch or fetch_metrics_text
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

    def window(self) -> EngineWindow:
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
        self.segments: list[tuple[EngineSnapshot, EngineSnapshot, Optional[float]]] = []

    def begin(self, warmup_records: Sequence = ()) -> None:
        done = sum(1 for r in warmup_records if r.success)
        base = self.segments[-1][1] if self.segments else self.before
        self.start = self.sampler.settled_snapshot(base, done) if done else self.sampler.snapshot()
        self.t0 = time.monotonic()

    def finish(self, records: Sequence) -> dict[str, Optional[float]]:
        """The engine_* columns over every window measured so far (a level measured again
        continues its window: ``begin`` again, then ``finish``)."""
        measured = [r for r in records if not r.warmup]
        if self.start is None or self.t0 is None or not measured:
            return engine_segments_metrics(self.segments, list(self.sampler.series), self.sampler.exact_sums) \
                if self.segments else engine_window_metrics(None, None)
        end = self.sampler.settled_snapshot(self.start, sum(1 for r in measured if r.success))
        sends = [r.sent_s for r in measured if r.sent_s is not None]
        first_send = self.t0 + min(sends) if sends else None
        self.segments.append((self.start, end, first_send))
        self.start = None
        return engine_segments_metrics(self.segments, list(self.sampler.series), exact_sums=self.sampler.exact_sums)
