"""The simulated engine's ``/metrics``: vLLM's gauges and counters (:func:`metrics_text`) and
its request-latency histograms.

The simulated replica records the timestamps vLLM's ``RequestStateStats`` records
(``vllm/v1/metrics/stats.py``) and observes the same intervals into histograms with
vLLM's names and bucket bounds (``vllm/v1/metrics/loggers.py``, PrometheusStatLogger),
so that the orchestrator reads the simulator's engine side exactly as a real engine's:

* arrival: the front end received the request (vLLM's ``arrival_time``); queued: the
  engine core took it (``QUEUED``); scheduled: the first step that ran it
  (``SCHEDULED``, preemptions ignored); first / last token: when a step's output with
  the request's first / latest token was processed;
* ``time_to_first_token_seconds`` = first token - arrival, observed at the first token;
  ``inter_token_latency_seconds``: every later output minus the previous one;
* at the end of a finished request: ``e2e_request_latency_seconds`` (end - arrival),
  ``request_queue_time_seconds`` (scheduled - queued), ``request_prefill_time_seconds``
  (first token - scheduled), ``request_decode_time_seconds`` (last - first token),
  ``request_inference_time_seconds`` (last token - scheduled) and
  ``request_time_per_output_token_seconds`` (decode / (tokens - 1), 0 for one token).

An aborted request (the client went away) is dropped without observations, as vLLM does.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Iterable, Optional

# vLLM's bucket bounds in seconds (0.29; unchanged since the V1 engine's metrics).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# (name, bucket bounds, help text) as vLLM registers them.
HISTOGRAMS: tuple[tuple[str, tuple[float, ...], str], ...] = (
    ("vllm:time_to_first_token_seconds", TTFT_BUCKETS, "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", TOKEN_LATENCY_BUCKETS, "Histogram of inter-token latency in seconds."),
    ("vllm:request_time_per_output_token_seconds", TOKEN_LATENCY_BUCKETS,
     "Histogram of time_per_output_token_seconds per request."),
    ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS, "Histogram of e2e request latency in seconds."),
    ("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS,
     "Histogram of time spent in WAITING phase for request."),
    ("vllm:request_inference_time_seconds", REQUEST_LATENCY_BUCKETS,
     "Histogram of time spent in RUNNING phase for request."),
    ("vllm:request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS,
     "Histogram of time spent in PREFILL phase for request."),
    ("vllm:request_decode_time_seconds", REQUEST_LATENCY_BUCKETS,
     "Histogram of time spent in DECODE phase for request."),
)


class LatencyHistogram:
    """A Prometheus histogram: per-bucket counts (``le`` inclusive), sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def exposition(self, name: str, labels: str) -> list[str]:
        """Sample lines (``labels``: ``k="v",...`` without braces), cumulative as Prometheus wants."""
        lines = [f"{name}_sum{{{labels}}} {self.sum!r}"]
        total = 0
        for bound, n in zip(self.bounds + (float("inf"),), self.counts):
            total += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(total)!r}')
        lines.append(f"{name}_count{{{labels}}} {float(self.count)!r}")
        return lines


class _Times:
    __slots__ = ("arrival", "queued", "scheduled", "first", "last", "tokens")

    def __init__(self, arrival: float, queued: float):
        self.arrival = arrival
        self.queued = queued
        self.scheduled: Optional[float] = None
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.tokens = 0


class SimRequestMetrics:
    """The request timestamps and histograms of one simulated engine (fed by the engine thread;
    :meth:`exposition` may be called from any thread)."""

    def __init__(self):
        self.histograms = {name: LatencyHistogram(bounds) for name, bounds, _ in HISTOGRAMS}
        self._h = [self.histograms[name] for name, _, _ in HISTOGRAMS]
        self._requests: dict[str, _Times] = {}
        self._lock = threading.Lock()

    def add(self, rid: str, arrival: float, queued: float) -> None:
        self._requests[rid] = _Times(arrival, queued)

    def abort(self, rid: str) -> None:
        self._requests.pop(rid, None)

    def step(self, outputs, scheduled_at: float, now: float) -> None:
        """One step's outputs (``TokenOutput``), processed at ``now``; the step started at ``scheduled_at``."""
        ttft, itl, tpot, e2e, queue, inference, prefill, decode = self._h
        with self._lock:
            for out in outputs:
                r = self._requests.get(out.request_id)
                if r is None:
                    continue
                if r.scheduled is None:
                    r.scheduled = scheduled_at
                if out.new_tokens:
                    if r.first is None:
                        r.first = now
                        ttft.observe(now - r.arrival)
                    else:
                        itl.observe(now - r.last)
                    r.last = now
                    r.tokens += out.new_tokens
                if out.finished:
                    del self._requests[out.request_id]
                    first = r.first if r.first is not None else now
                    last = r.last if r.last is not None else now
                    e2e.observe(now - r.arrival)
                    queue.observe(r.scheduled - r.queued)
                    prefill.observe(first - r.scheduled)
                    decode.observe(last - first)
                    inference.observe(last - r.scheduled)
                    tpot.observe((last - first) / (r.tokens - 1) if r.tokens > 1 else 0.0)

    def exposition(self, labels: str) -> list[str]:
        lines = []
        with self._lock:
            for name, _, doc in HISTOGRAMS:
                lines.append(f"# HELP {name} {doc}")
                lines.append(f"# TYPE {name} histogram")
                lines += self.histograms[name].exposition(name, labels)
        return lines


def metrics_text(runtime, model_name: str) -> str:
    """A simulated replica's ``/metrics`` (``runtime``: its :class:`~orchestrator.engines.sim.loop.SimRuntime`):
    vLLM's gauges, counters and histograms, with vLLM's names and labels."""
    s = runtime.core.stats()
    m = runtime.core.memory
    labels = f'{{model_name="{model_name}",engine="0"}}'
    rows = [
        ("vllm:num_requests_running", "gauge", s.num_requests_running),
        ("vllm:num_requests_waiting", "gauge", s.num_requests_waiting),
        ("vllm:kv_cache_usage_perc", "gauge", s.kv_cache_usage),
        ("vllm:num_preemptions_total", "counter", s.num_preemptions_total),
        ("vllm:prefix_cache_queries_total", "counter", s.prefix_cache_queries_total),
        ("vllm:prefix_cache_hits_total", "counter", s.prefix_cache_hits_total),
        ("vllm:prompt_tokens_total", "counter", s.prompt_tokens_total),
        ("vllm:generation_tokens_total", "counter", s.generation_tokens_total),
    ]
    out = []
    for name, kind, value in rows:
        out.append(f"# TYPE {name.removesuffix('_total')} {kind}")
        out.append(f"{name}{labels} {float(value)}")
    # A simulated request ends at max_tokens ("length") or at a stop string or stop token id ("stop").
    out.append("# TYPE vllm:request_success counter")
    for reason, count in runtime.request_success.items():
        out.append(f'vllm:request_success_total{{model_name="{model_name}",engine="0",finished_reason="{reason}"}} '
                   f"{float(count)}")
    out += runtime.metrics.exposition(f'model_name="{model_name}",engine="0"')
    out.append("# TYPE vllm:cache_config_info gauge")
    out.append(f'vllm:cache_config_info{{block_size="{m.block_size}",num_gpu_blocks="{m.num_blocks}",'
               f'engine="0"}} 1.0')
    return "\n".join(out) + "\n"
