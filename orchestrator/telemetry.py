"""Server-side telemetry during a load window: the engine's Prometheus metrics and NVML.

A background thread samples both every ``interval_s``. Gauges become peak and
mean, counters become the increase over the window. A source that is not
available yields nulls, never invented numbers.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Optional

log = logging.getLogger(__name__)

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNaN]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_labels(text: Optional[str]) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def parse_prometheus(text: str, labels: Optional[dict[str, str]] = None) -> dict[str, float]:
    """Sum each metric over its label sets (several engines or label values add up),
    keeping only samples whose labels include ``labels``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        if labels:
            have = parse_labels(m.group(2))
            if any(have.get(k) != v for k, v in labels.items()):
                continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
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
                 fetch: Optional[Callable[[str], str]] = None):
        self.metrics_url = metrics_url
        self.prefix = prefix
        self.labels = labels or None
        self.interval_s = interval_s
        self.nvml = nvml
        self.fetch = fetch or _http_get
        self.gauges = {k: _Series() for k in GAUGES}
        self.counters = {k: _Series() for k in COUNTERS}
        self.gpu = {k: _Series() for k in ("mem_gib", "util", "power_w")}
        self.scrape_errors = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._energy_start_t = None

    def sample_once(self) -> None:
        if self.metrics_url:
            try:
                values = parse_prometheus(self.fetch(self.metrics_url), self.labels)
                for ours, theirs in GAUGES.items():
                    self.gauges[ours].add(values.get(self.prefix + theirs))
                for ours, theirs in COUNTERS.items():
                    self.counters[ours].add(values.get(self.prefix + theirs))
            except Exception:  # noqa: BLE001 - a missed scrape is not a failed trial
                self.scrape_errors += 1
        if self.nvml is not None:
            try:
                for k, v in self.nvml.sample().items():
                    self.gpu[k].add(v)
            except Exception:  # noqa: BLE001
                pass

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
            "num_requests_waiting_peak": self.gauges["num_requests_waiting"].peak,
            "num_preemptions": self.counters["num_preemptions"].increase,
            "prefix_cache_hit_rate": (hits / queries) if (hits is not None and queries) else None,
            "gpu_mem_peak_gib": self.gpu["mem_gib"].peak,
            "gpu_util_mean": self.gpu["util"].mean,
            "gpu_power_mean_w": self.gpu["power_w"].mean,
            "gpu_energy_j": self.nvml.energy_j() if self.nvml is not None else None,
        }


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode("utf-8", "replace")
