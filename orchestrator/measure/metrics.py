"""Trial metrics: pure functions from request records to numbers.

Definitions follow ``vllm bench serve`` (``vllm/benchmarks/serve.py``,
``calculate_metrics``) so numbers can be compared with it directly:

* TTFT: first streamed token minus send time, per successful request.
* TPOT: ``(latency - ttft) / (output_tokens - 1)`` for successful requests with more
  than one output token.
* ITL: every gap between consecutive token-carrying chunks, pooled over requests.
* E2E latency (``e2el``): last token minus send time.
* Throughputs divide by the benchmark duration: from the first send to the last
  request's end (a failed request ends when the client gave up on it, as vLLM's
  wall clock includes it).
* Goodput: successful requests meeting every per-request SLO (ttft, tpot, e2el), per
  second. A limit is met as the study's constraint says (``<`` is not met at the limit:
  :func:`orchestrator.measure.limits.met`); a request with one output token has no TPOT, and a TPOT
  limit does not apply to it (``RequestSLO.met_by``).
* Percentiles: ``numpy.percentile`` with linear interpolation.

Warm-up requests are excluded before anything is computed, and so are requests due
outside the measurement ``window`` (the workload's warm-up and cool-down seconds, see
:func:`measurement_window`): they load the server but are not measured.

The load generator's own cost is reported beside the latencies: scheduling lag
(actual minus intended send time) percentiles, ``client_us_per_token`` (client time
spent handling streamed chunks, per token) and ``loadgen_overloaded`` (1 when the
p99 lag exceeds the allowed lag: the numbers then describe the client, not only the
server).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from orchestrator.measure import limits
from orchestrator.measure.records import RequestErrorKind, RequestRecord

PERCENTILES = (50, 90, 95, 99)
LATENCY_FAMILIES = ("ttft", "tpot", "itl", "e2el")


# The families a per-request limit can name, and the record's value for each (seconds).
REQUEST_SLO_FAMILIES = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class RequestSLO:
    """Per-request latency limits used for goodput (milliseconds; None = no limit).

    ``strict``: the families whose limit is ``<`` (not met *at* the limit). Every comparison
    is :func:`orchestrator.measure.limits.met`'s, the boundary the trial's constraints use.
    """

    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    e2el_ms: Optional[float] = None
    strict: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None

    def met_by(self, record: RequestRecord) -> bool:
        if not record.success:
            return False
        values = {"ttft": record.ttft_s, "tpot": record.tpot_s, "e2el": record.latency_s}
        for fam in REQUEST_SLO_FAMILIES:
            limit = getattr(self, f"{fam}_ms")
            if limit is None:
                continue
            if fam == "tpot" and values[fam] is None:
                # The one rule for a missing TPOT: a successful request with one output token
                # has no time per output token, so a TPOT limit does not apply to it (vllm bench
                # serve counts its TPOT as 0, which meets every limit). docs/metrics.md.
                continue
            if not limits.met("<" if fam in self.strict else "<=", limit, values[fam] * 1000):
                return False
        return True


def _latency_fields() -> list[str]:
    names = []
    for fam in LATENCY_FAMILIES:
        names.append(f"{fam}_mean_ms")
        names += [f"{fam}_p{p}_ms" for p in PERCENTILES]
    return names


@dataclass(frozen=True)
class LoadMetrics:
    """Client-side measurements of one load window."""

    num_requests: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_token_throughput: float
    output_throughput_per_gpu: float
    goodput: float
    slo_attainment: float
    total_input_tokens: int
    total_output_tokens: int
    max_concurrency: int  # peak requests in flight (successful ones), as vLLM's "peak concurrent"
    requested_rate: Optional[float]
    achieved_rate: Optional[float]
    sched_lag_p50_ms: Optional[float]
    sched_lag_p99_ms: Optional[float]
    sched_lag_max_ms: Optional[float]
    failed_timeout: int
    failed_http: int
    failed_connection: int
    failed_bad_response: int
    ttft_mean_ms: Optional[float] = None
    ttft_p50_ms: Optional[float] = None
    ttft_p90_ms: Optional[float] = None
    ttft_p95_ms: Optional[float] = None
    ttft_p99_ms: Optional[float] = None
    tpot_mean_ms: Optional[float] = None
    tpot_p50_ms: Optional[float] = None
    tpot_p90_ms: Optional[float] = None
    tpot_p95_ms: Optional[float] = None
    tpot_p99_ms: Optional[float] = None
    itl_mean_ms: Optional[float] = None
    itl_p50_ms: Optional[float] = None
    itl_p90_ms: Optional[float] = None
    itl_p95_ms: Optional[float] = None
    itl_p99_ms: Optional[float] = None
    e2el_mean_ms: Optional[float] = None
    e2el_p50_ms: Optional[float] = None
    e2el_p90_ms: Optional[float] = None
    e2el_p95_ms: Optional[float] = None
    e2el_p99_ms: Optional[float] = None
    failed_aborted: int = 0
    client_us_per_token: Optional[float] = None
    loadgen_overloaded: Optional[float] = None  # 1.0 / 0.0; None when not judged (capped concurrency)

    def as_dict(self) -> dict:
        return asdict(self)


LOAD_METRIC_NAMES: tuple[str, ...] = tuple(f.name for f in fields(LoadMetrics))

# Metrics where larger is better; every other metric is "smaller is better".
HIGHER_IS_BETTER = frozenset({
    "completed", "request_throughput", "input_throughput", "output_throughput",
    "total_token_throughput", "output_throughput_per_gpu", "goodput", "slo_attainment",
    "total_input_tokens", "total_output_tokens", "achieved_rate", "capacity_rps",
    "capacity_goodput", "kv_cache_tokens", "prefix_cache_hit_rate", "gpu_util_mean",
    "engine_output_throughput", "engine_request_throughput", "goodput_per_gpu", "capacity_rps_per_gpu",
    "token_agreement", "prefix_agreement", "first_divergence_mean", "engine_spec_acceptance_rate",
    "floor_token_agreement",
    "engine_spec_accepted_per_draft", "engine_spec_token_share",
    "sessions", "session_goodput", "session_slo_attainment", "expected_prefix_hit_rate",
})
DIRECTIONS = ("minimize", "maximize")


def default_direction(metric: str) -> str:
    """How ``metric`` is optimised when nobody says: maximised if in :data:`HIGHER_IS_BETTER`, else minimised."""
    return "maximize" if metric in HIGHER_IS_BETTER else "minimize"


def percentile_summary(values_s: Sequence[float], family: str) -> dict[str, Optional[float]]:
    """Mean and percentiles in milliseconds of ``values_s`` (seconds); None if empty."""
    out: dict[str, Optional[float]] = {}
    if len(values_s) == 0:
        out[f"{family}_mean_ms"] = None
        for p in PERCENTILES:
            out[f"{family}_p{p}_ms"] = None
        return out
    arr = np.asarray(values_s, dtype=float) * 1000.0
    out[f"{family}_mean_ms"] = float(arr.mean())
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"{family}_p{p}_ms"] = float(v)
    return out


def peak_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """Most requests in flight at once, over half-open intervals [start, end)."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    # At equal times, ends (-1) sort before starts: [a, b) and [b, c) do not overlap.
    events.sort()
    peak = cur = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return peak


def measurement_window(records: Sequence[RequestRecord], warmup_s: float = 0.0,
                       cooldown_s: float = 0.0) -> Optional[dict[int, tuple[float, float]]]:
    """``{window: (first, last)}`` due time of the requests to measure, or None for "all".

    Requests due in the first ``warmup_s`` seconds of their load window, or in its
    last ``cooldown_s`` seconds (counted back from its last due time), are left out:
    the queue is still filling, or draining, then. Each window (``RequestRecord.window``:
    a level measured again has a clock of its own) is cut on its own.
    """
    if warmup_s <= 0 and cooldown_s <= 0:
        return None
    due: dict[int, list[float]] = {}
    for r in records:
        if not r.warmup:
            due.setdefault(r.window, []).append(r.scheduled_s)
    if not due:
        return None
    return {w: (min(d) + warmup_s, max(d) - cooldown_s) for w, d in due.items()}


def in_window(records: Sequence[RequestRecord],
              window: Optional[Union[tuple[float, float], Mapping[int, tuple[float, float]]]] = None
              ) -> list[RequestRecord]:
    """The measured requests: warm-up ones dropped, and those due outside ``window`` (one
    ``(first, last)`` for every window, or one per window as :func:`measurement_window` gives)."""
    measured = [r for r in records if not r.warmup]
    if window is None:
        return measured
    if isinstance(window, tuple):
        lo, hi = window
        return [r for r in measured if lo <= r.scheduled_s <= hi]
    return [r for r in measured if r.window in window and window[r.window][0] <= r.scheduled_s <= window[r.window][1]]


def _span(records: Sequence[RequestRecord]) -> tuple[float, Optional[float], int]:
    """``(duration, achieved-rate span, sends)`` of one window's measured requests: the duration runs
    from the first send to the last end (a failed request ends when the client gave up on it)."""
    sends = [r.sent_s for r in records if r.sent_s is not None]
    ends = [r.end_s if r.success else (r.finished_s if r.finished_s is not None else r.end_s) for r in records]
    ends = [e for e in ends if e is not None]
    if not sends:
        return 0.0, None, 0
    duration = max(max(ends + sends) - min(sends), 1e-9)
    return duration, (max(sends) - min(sends)) if len(sends) >= 2 else None, len(sends)


def summarise(records: Sequence[RequestRecord], *, gpus: int = 1, slo: RequestSLO = RequestSLO(),
              requested_rate: Optional[float] = None,
              window: Optional[Union[tuple[float, float], Mapping[int, tuple[float, float]]]] = None,
              max_sched_lag_ms: Optional[float] = None) -> LoadMetrics:
    """Summarise one load window, or the windows of one level measured again (warm-up requests,
    and those due outside ``window``, are dropped here; see :func:`in_window`). Several windows
    (``RequestRecord.window``) pool their requests; their durations add up.

    ``max_sched_lag_ms``: the p99 scheduling lag above which ``loadgen_overloaded`` is 1
    (None: not judged).
    """
    measured = in_window(records, window)
    ok = [r for r in measured if r.success]
    failed = [r for r in measured if not r.success]

    by_window: dict[int, list[RequestRecord]] = {}
    for r in measured:
        by_window.setdefault(r.window, []).append(r)
    spans = [_span(rs) for rs in by_window.values()]
    duration = sum(d for d, _, _ in spans)

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    total_in = sum((r.prompt_tokens if r.prompt_tokens is not None else r.expected_prompt_tokens) for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    good = sum(1 for r in ok if slo.met_by(r)) if not slo.empty else len(ok)

    achieved = None
    timed = [(s, n) for _, s, n in spans if s is not None and s > 0]
    if timed:
        achieved = sum(n - 1 for _, n in timed) / sum(s for s, _ in timed)

    lags = [(r.sent_s - r.scheduled_s) for r in measured if r.sent_s is not None]

    def count(kind: RequestErrorKind) -> int:
        return sum(1 for r in failed if r.error_kind == kind)

    latency: dict[str, Optional[float]] = {}
    latency.update(percentile_summary([r.ttft_s for r in ok], "ttft"))
    latency.update(percentile_summary([r.tpot_s for r in ok if r.tpot_s is not None], "tpot"))
    latency.update(percentile_summary([x for r in ok for x in r.itl_s], "itl"))
    latency.update(percentile_summary([r.latency_s for r in ok], "e2el"))

    lag_ms = np.asarray(lags, dtype=float) * 1000.0 if lags else None
    chunks = sum(len(r.token_times_s) for r in measured)
    client_us = sum(r.client_s for r in measured) / chunks * 1e6 if chunks else None
    lag_p99 = float(np.percentile(lag_ms, 99)) if lag_ms is not None else None
    overloaded = None
    if max_sched_lag_ms is not None and lag_p99 is not None:
        overloaded = 1.0 if lag_p99 > max_sched_lag_ms else 0.0
    return LoadMetrics(
        num_requests=len(measured),
        completed=len(ok),
        failed=len(failed),
        duration_s=duration,
        request_throughput=per_s(len(ok)),
        input_throughput=per_s(total_in),
        output_throughput=per_s(total_out),
        total_token_throughput=per_s(total_in + total_out),
        output_throughput_per_gpu=per_s(total_out) / max(gpus, 1),
        goodput=per_s(good),
        slo_attainment=(good / len(measured)) if measured else 0.0,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        max_concurrency=max((peak_concurrency((r.sent_s, r.end_s) for r in rs if r.success)
                             for rs in by_window.values()), default=0),
        requested_rate=requested_rate,
        achieved_rate=achieved,
        sched_lag_p50_ms=float(np.percentile(lag_ms, 50)) if lag_ms is not None else None,
        sched_lag_p99_ms=lag_p99,
        sched_lag_max_ms=float(lag_ms.max()) if lag_ms is not None else None,
        failed_timeout=count(RequestErrorKind.TIMEOUT),
        failed_http=count(RequestErrorKind.HTTP_STATUS),
        failed_connection=count(RequestErrorKind.CONNECTION),
        failed_bad_response=count(RequestErrorKind.BAD_RESPONSE) + count(RequestErrorKind.CLIENT),
        failed_aborted=count(RequestErrorKind.ABORTED),
        client_us_per_token=client_us,
        loadgen_overloaded=overloaded,
        **latency,
    )


# Metrics that come from the engine and the devices rather than the client
# (see orchestrator.measure.telemetry); null where a source is unavailable.
TELEMETRY_METRIC_NAMES: tuple[str, ...] = (
    "gpu_mem_peak_gib", "gpu_util_mean", "gpu_power_mean_w", "gpu_energy_j",
    "kv_cache_usage_peak", "kv_cache_usage_mean", "num_requests_running_peak",
    "num_requests_waiting_peak", "num_preemptions", "prefix_cache_hit_rate",
    "num_requests_running_mean", "num_requests_waiting_mean",
)
# The engine's own latency histograms and counters over the measured window (the requests the
# client measures; in a capacity search, the row's level): ``engine_<family>_{mean,p50,p90,p99}_ms``,
# the bound ``engine_ttft_p50_upper_ms``, and the engine's throughputs. See
# orchestrator.measure.engine_window.engine_window_metrics; null where the engine does not export them.
ENGINE_LATENCY_FAMILIES = ("ttft", "itl", "tpot", "e2el", "queue", "prefill", "decode")
ENGINE_PERCENTILES = (50, 90, 99)


def _engine_window_fields() -> list[str]:
    names = []
    for fam in ENGINE_LATENCY_FAMILIES:
        names.append(f"engine_{fam}_mean_ms")
        names += [f"engine_{fam}_p{p}_ms" for p in ENGINE_PERCENTILES]
        if fam == "ttft":
            names.append("engine_ttft_p50_upper_ms")
    # speculative decoding: accepted / proposed tokens, accepted tokens per proposal, accepted / output tokens
    return names + ["engine_output_throughput", "engine_request_throughput", "engine_spec_acceptance_rate",
                    "engine_spec_accepted_per_draft", "engine_spec_token_share"]


ENGINE_WINDOW_METRIC_NAMES: tuple[str, ...] = tuple(_engine_window_fields())
# Facts of the engine start.
ENGINE_METRIC_NAMES: tuple[str, ...] = ("startup_s", "kv_cache_tokens", "kv_cache_gib", "gpus")
# Where a trial's wall time went: waiting for GPUs, the load window (warm-up included),
# tear-down, and the rest (orchestration overhead: everything but start-up and load).
PHASE_NAMES: tuple[str, ...] = ("queue_s", "load_window_s", "teardown_s", "overhead_s")
# Where a real engine's start went, from its own log (orchestrator.engines.vllm.start_log): process and
# imports, weights, torch.compile, CUDA graphs, profiling and KV cache, the server answering; null where a
# phase did not happen or could not be read. (``start_compile_cached`` is a bool column of the schema.)
START_PHASE_NAMES: tuple[str, ...] = ("start_import_s", "start_load_s", "start_compile_s", "start_graphs_s",
                                      "start_profile_s", "start_ready_s")
# Capacity search (highest SLO-compliant request rate of one configuration).
CAPACITY_METRIC_NAMES: tuple[str, ...] = ("capacity_rps", "capacity_goodput")
# How well a capacity search's levels pin its capacity down (orchestrator.trial.capacity_fit): the binding
# SLO margin's growth per unit of log rate at the crossing, its noise there (log units), and how many
# levels met the SLOs at a rate above a level that missed them.
CAPACITY_FIT_METRIC_NAMES: tuple[str, ...] = ("capacity_margin_slope", "capacity_margin_sd", "capacity_contradictions")
# The warm-up before the measured window (orchestrator.measure.warmup.WarmupOutcome): its seconds, its
# requests, and whether the engine became steady (1/0; null without a steady warm-up).
WARMUP_METRIC_NAMES: tuple[str, ...] = ("warmup_s_used", "warmup_requests_used", "warmup_converged")
# What people rank deployments by, from the row's own columns (orchestrator.hardware.pricing.unit_metrics):
# goodput and capacity per GPU, dollars per million output tokens.
UNIT_METRIC_NAMES: tuple[str, ...] = ("goodput_per_gpu", "capacity_rps_per_gpu", "cost_per_mtok")


# The reference-agreement probe (orchestrator.trial.probe): greedy outputs of a fixed prompt set against
# the study's baseline configuration; null where no probe ran or no baseline exists yet.
# Perplexity of held-out text (orchestrator.trial.probe_perplexity): its value, and the trial's minus the baseline's.
PERPLEXITY_METRIC_NAMES: tuple[str, ...] = ("heldout_perplexity", "perplexity_delta")
# The noise floor: the baseline's answers against its own second pass at another batch composition
# (copied into every row from the baseline's record; what a guardrail threshold must sit above).
FLOOR_METRIC_NAMES: tuple[str, ...] = ("floor_token_agreement", "floor_logprob_diff_mean", "floor_divergence_gap_max")
PROBE_METRIC_NAMES: tuple[str, ...] = (
    "token_agreement", "prefix_agreement", "logprob_diff_mean", "logprob_diff_p95", "first_divergence_mean",
    "divergence_gap_max") + PERPLEXITY_METRIC_NAMES + FLOOR_METRIC_NAMES + ("probe_s",)


# Multi-turn sessions (orchestrator.measure.session_metrics): null for workloads of single requests.
SESSION_METRIC_NAMES: tuple[str, ...] = (
    "sessions", "session_goodput", "session_slo_attainment", "turns_per_session_mean", "expected_prefix_hit_rate",
    "ttft_p50_ms_first_turn", "ttft_p99_ms_first_turn", "ttft_p50_ms_later_turns", "ttft_p99_ms_later_turns")


def known_metric_names() -> list[str]:
    """Every metric an objective or constraint may name."""
    return list(LOAD_METRIC_NAMES + TELEMETRY_METRIC_NAMES + ENGINE_METRIC_NAMES + CAPACITY_METRIC_NAMES
                + CAPACITY_FIT_METRIC_NAMES + PHASE_NAMES + START_PHASE_NAMES + ENGINE_WINDOW_METRIC_NAMES
                + WARMUP_METRIC_NAMES + UNIT_METRIC_NAMES + PROBE_METRIC_NAMES + SESSION_METRIC_NAMES)
