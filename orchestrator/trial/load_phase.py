"""A trial's load phase: warm-up and one measured window, or a capacity search over load levels.

:func:`measure` runs the load through a caller's ``run_level(request set, monitor)`` (a
served endpoint's HTTP load generator, or the virtual-time simulator) and returns a
:class:`LoadPhase`: every request record, the engine's telemetry, and the capacity
search's levels. :func:`served_load` is ``run_level`` for a deployed endpoint, with the
engine's own histograms taken over each level's measured requests.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from orchestrator.failures import too_many_failures
from orchestrator.loadgen import Endpoint, run_load_sync
from orchestrator.measure import limits
from orchestrator.measure.blocks import block_requests_for
from orchestrator.measure.columns import SessionColumns
from orchestrator.measure.confidence import (BOOTSTRAP_SAMPLES, DEFAULT_CONFIDENCE, Interval, MetricDraws, metric_draws,
                                             metric_intervals)
from orchestrator.measure.harness import harness_verdict
from orchestrator.measure.measurement import LevelMeasurement
from orchestrator.measure.metrics import (ENGINE_WINDOW_METRIC_NAMES, LoadMetrics, in_window, measurement_window,
                                          summarise)
from orchestrator.measure.nvml import try_nvml
from orchestrator.measure.prometheus_text import fetch_metrics_text, parse_prometheus
from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.measure.saturation import SaturationDetector, detect_saturation, slo_backlog
from orchestrator.measure.session_metrics import session_columns, turn_table
from orchestrator.measure.telemetry import TelemetrySampler
from orchestrator.measure.warmup import WarmupOutcome
from orchestrator.trial.capacity import (LevelResult, RateGrid, draw_level, judge_level, level_workload,
                                         search_capacity)
from orchestrator.trial.capacity_fit import FAILED_MARGIN, SPEED, CapacityFit, LevelMargins, fit_capacity
from orchestrator.trial.plan import LoadPlan
from orchestrator.trial.result import CapacityOutcome

log = logging.getLogger(__name__)


def summarise_records(plan: LoadPlan, records: list[RequestRecord], requested_rate: Optional[float],
                      gpus: int = 1, window_scale: float = 1.0) -> LoadMetrics:
    wl = plan.workload
    return summarise(records, gpus=gpus, slo=plan.request_slo, requested_rate=requested_rate,
                     window=measurement_window(records, wl.warmup_s * window_scale, wl.cooldown_s * window_scale),
                     # With a concurrency cap the send lag includes the intended wait for a slot.
                     max_sched_lag_ms=None if wl.max_concurrency else wl.max_sched_lag_ms)


def record_intervals(plan: LoadPlan, records: list[RequestRecord], metrics, *, confidence: float, gpus: int = 1,
                     window_scale: float = 1.0, block_requests: Optional[int] = None) -> dict[str, Interval]:
    """Intervals (:mod:`orchestrator.measure.confidence`) of ``metrics`` over the requests
    :func:`summarise_records` measures (the same measurement window)."""
    wl = plan.workload
    measured = in_window(records, measurement_window(records, wl.warmup_s * window_scale, wl.cooldown_s * window_scale))
    return metric_intervals(measured, metrics, confidence=confidence, gpus=gpus, slo=plan.request_slo,
                            seed=plan.seed, window_noise=plan.window_noise, start_noise=plan.start_noise,
                            block_requests=block_requests)


def noise_seed(plan: LoadPlan, *key: int) -> int:
    """A seed of this trial's own (its window and start noise), never another trial's."""
    return int(np.random.SeedSequence([plan.noise_seed, 104729, *key]).generate_state(1)[0])


def start_shift(plan: LoadPlan, metrics) -> dict[str, np.ndarray]:
    """This trial's engine-start shift per metric, one per bootstrap draw (log units): the same for
    every level and every metric column of the trial, as one start moves them all."""
    rng = np.random.default_rng(noise_seed(plan, 0))
    return {m: rng.normal(0.0, plan.start_noise.sd_of(m), BOOTSTRAP_SAMPLES)
            for m in dict.fromkeys(metrics) if plan.start_noise.sd_of(m) > 0}


@dataclass
class LoadPhase:
    """What the load phase measured: every record (all levels), telemetry, and the capacity search."""

    records: list[RequestRecord]
    telemetry: dict
    requested_rate: Optional[float] = None
    capacity: Optional[Any] = None  # orchestrator.trial.capacity.CapacityResult
    warmup: Optional[WarmupOutcome] = None  # the (first level's) warm-up
    levels_base_rate: Optional[float] = None  # the workload's own rate, which levels scale from

    def level_rows(self) -> list[dict[str, Any]]:
        """Rows of the levels table: each level's client metrics, engine-side numbers and harness verdict."""
        if self.capacity is None:
            return []

        rows = []
        for lv in self.capacity.levels:
            row = {**lv.row(), **{k: lv.telemetry.get(k) for k in ENGINE_WINDOW_METRIC_NAMES}}
            rows.append({**row, **harness_verdict(row).columns()})
        return rows


def served_load(plan: LoadPlan, deployment, requests) -> LoadPhase:
    """The load phase against a deployed endpoint: the HTTP load generator, with the engine's
    histograms taken over each level's measured requests and its gauges sampled throughout."""

    ep = deployment.endpoint
    endpoint = Endpoint(base_url=ep.base_url, model=ep.model, api=plan.workload.api, api_key=ep.api_key)
    nvml = try_nvml(ep.gpu_indices) if ep.sample_nvml else None

    windows: list = []

    def run_level(rs, monitor, again: bool = False) -> LevelMeasurement:

        # The engine's histograms over this level's measured requests (all its windows).
        if not again or not windows:
            windows.append(sampler.window())
        window = windows[-1]
        warmup = WarmupOutcome()

        def measure_start(warm):
            if any(r.error_kind == RequestErrorKind.ABORTED for r in warm):
                _wait_idle(ep)  # a warm-up that did not converge was aborted: let the engine drop it
            window.begin(warm)

        wl = plan.workload
        records = run_load_sync(endpoint, rs, timeout_s=wl.timeout_s, max_concurrency=wl.max_concurrency,
                                ignore_eos=wl.ignore_eos, monitor=monitor,
                                check_interval_s=plan.capacity.saturation.check_interval_s
                                if plan.capacity else 0.5, on_measure_start=measure_start, warmup_report=warmup)
        if monitor is not None and monitor.saturated_at is not None:
            _wait_idle(ep)  # the next level must not inherit this one's queue
        return LevelMeasurement(records, engine=window.finish(records), warmup=warmup)

    with TelemetrySampler(ep.metrics_url, prefix=ep.metric_prefix, labels=ep.metric_labels, nvml=nvml) as sampler:
        phase = measure(plan, requests, run_level, served=True)
    # The window's (or the chosen level's) engine_* columns over the whole load's gauges.
    phase.telemetry = {**sampler.summary(), **phase.telemetry}
    return phase


def measure(plan: LoadPlan, requests, run_level, *, served: bool) -> LoadPhase:
    """One load window, or a capacity search over levels (``run_level(request set, monitor, again)``
    returns a :class:`~orchestrator.measure.measurement.LevelMeasurement`; ``again``: the same level
    measured once more, its engine window continued; ``served``: a monitor may stop a level early)."""

    if plan.capacity is None:
        got = run_level(requests, None, False)
        return LoadPhase(got.records, dict(got.engine), requests.requested_rate, warmup=got.warmup)

    spec = plan.capacity
    slo = list(plan.capacity_slo)
    slo_metrics = [c.metric for c in slo]
    base_rate = requests.requested_rate
    grid = RateGrid.of(spec, spec.start_rate or base_rate or spec.min_rate)
    # One cut of the draw into blocks for every level (and every trial): the levels replay one draw, time
    # scaled, and a block of it weighs the same in a resample wherever it is measured (paired draws).
    block_requests = capacity_block_requests(plan, grid.start, base_rate)
    records: list[RequestRecord] = []
    spent = [0]  # windows measured so far (capacity.max_windows)
    # Each level is decided at a stricter confidence than the capacity's: the capacity's interval
    # rests on two decisions (a level met below it, one missed above), and either may be wrong.
    decide_at = level_confidence(spec.confidence)

    def measure_level(level: int, rate: float) -> LevelResult:
        # Prompts of the level's own: no level is answered from the prefix cache an earlier one filled;
        # the draw of its grid point, the same in every trial of the study (paired comparisons).
        k = grid.index(rate)
        workload = level_workload(plan.workload, rate, spec, base_rate)
        # A level replays the workload compressed (or stretched) in time unless its duration is
        # fixed: the warm-up and cool-down windows scale with it, excluding the same requests.
        scale = 1.0 if spec.level_duration_s or not base_rate else base_rate / rate
        mine: list[RequestRecord] = []
        telemetry: dict = {}
        warm: Optional[WarmupOutcome] = None
        planned = 0
        for window in range(spec.repeats + 1):
            # The level measured again is a fresh draw (arrivals, lengths, prompts): an undecided
            # verdict is decided by more of the workload, not by the same requests twice.
            rs = plan.requests(workload, level=draw_level(k), replicate=window)
            if level > 0 or window > 0:  # the engine is warm after the first level
                rs = dataclasses.replace(rs, warmup=(), warmup_stream=None)
            # Requests in flight, not sessions: a session workload's rate is sessions per second.
            floor = slo_backlog(slo, rate * rs.requests_per_arrival, [r.output_len for r in rs.measured])
            monitor = SaturationDetector(spec.saturation, floor) if served else None
            got = run_level(rs, monitor, window > 0)
            recs = got.records
            for r in recs:
                r.level, r.window = level, window
            mine.extend(recs)
            telemetry = dict(got.engine) if window == 0 else {
                **telemetry, **{k: v for k, v in got.engine.items() if v is not None}}
            if window == 0:
                warm, planned = got.warmup, len(rs.measured)
            saturated_at = monitor.saturated_at if monitor is not None else \
                detect_saturation(recs, spec.saturation, floor)
            m = summarise_records(plan, mine, rs.requested_rate, window_scale=scale)
            intervals = record_intervals(plan, mine, slo_metrics, confidence=decide_at, window_scale=scale,
                                         block_requests=block_requests)
            verdict = judge_level(m, slo, max_error_rate=spec.max_error_rate, saturated=saturated_at is not None,
                                  intervals=intervals, confidence=decide_at)
            log.info("level %d at %.3g req/s (window %d): %s", level, rate, window,
                     ("meets the SLOs" if verdict.ok else "; ".join(verdict.reasons))
                     + ("" if verdict.decided else f" (undecided at {decide_at:.1%})"))
            spent[0] += 1
            far = verdict.margin is not None and abs(verdict.margin) > NEAR_LIMIT
            if verdict.decided or far or saturated_at is not None or (spec.max_windows and spent[0] >= spec.max_windows):
                break
        records.extend(mine)
        return LevelResult(level, rate, planned, mine, m, verdict, saturated_at,
                           stopped_early=monitor is not None and monitor.saturated_at is not None,
                           telemetry=telemetry, warmup=warm, windows=window + 1, intervals=intervals,
                           confidence=decide_at, grid_index=k)

    shift = start_shift(plan, slo_metrics + [SPEED])
    margins_of: dict[tuple[int, int], LevelMargins] = {}

    def fit(levels: Sequence[LevelResult], with_start: bool) -> Optional[CapacityFit]:
        for lv in levels:
            if (lv.level, lv.windows) not in margins_of:
                margins_of[(lv.level, lv.windows)] = level_margins(plan, lv, base_rate, block_requests)
        return fit_capacity([margins_of[(lv.level, lv.windows)] for lv in levels], confidence=spec.confidence,
                            samples=BOOTSTRAP_SAMPLES, start_shift=shift if with_start else None,
                            resolution=spec.tolerance)

    result = search_capacity(measure_level, spec, grid.start, fit, beat=plan.beat_rate)
    chosen = result.best or min(result.levels, key=lambda lv: lv.rate)
    return LoadPhase(records, chosen.telemetry, chosen.metrics.requested_rate, result, warmup=result.levels[0].warmup,
                     levels_base_rate=base_rate)


def capacity_block_requests(plan: LoadPlan, start_rate: float, base_rate: Optional[float]) -> int:
    """Requests per bootstrap block of a capacity search: ``BLOCK_S`` seconds at its start rate (the
    same for every level and every trial of the study)."""
    n = len(plan.requests(level_workload(plan.workload, start_rate, plan.capacity, base_rate)).measured)
    return block_requests_for(start_rate, n)


def level_margins(plan: LoadPlan, lv: LevelResult, base_rate: Optional[float],
                  block_requests: Optional[int] = None) -> LevelMargins:
    """A measured level as the capacity fit reads it: each SLO's log margin (> 0: missed) by the level's
    values, and by each bootstrap draw of them (the level's requests resampled as every trial resamples
    that grid point's, widened, moved by this trial's window noise)."""
    spec = plan.capacity
    scale = 1.0 if spec.level_duration_s or not base_rate else base_rate / lv.rate
    wl = plan.workload
    measured = in_window(lv.records, measurement_window(lv.records, wl.warmup_s * scale, wl.cooldown_s * scale))
    slo = list(plan.capacity_slo)
    draws = metric_draws(measured, [c.metric for c in slo], slo=plan.request_slo,
                         seed=plan.seed, block_requests=block_requests, window_noise=plan.window_noise,
                         noise_seed=noise_seed(plan, 1, lv.level), start_shift={})
    values = lv.metrics.as_dict()
    margins: dict[str, float] = {}
    margin_draws: dict[str, np.ndarray] = {}
    raw_draws: dict[str, np.ndarray] = {}
    for c in slo:
        upper = limits.upper(c.op)
        point = limits.log_margin(c.op, c.value, values.get(c.metric))
        point = FAILED_MARGIN if point is None else point
        if c.metric in margins and margins[c.metric] >= point:  # the same metric limited twice: the binding one
            continue
        margins[c.metric] = point
        d: Optional[MetricDraws] = draws.get(c.metric)
        if d is not None and c.value > 0:
            for sample, into in ((d.draws, margin_draws), (d.raw, raw_draws)):
                with np.errstate(divide="ignore", invalid="ignore"):
                    x = np.log(np.where(sample > 0, sample, np.nan) / c.value)
                x = x if upper else -x
                into[c.metric] = np.where(np.isfinite(x), x, FAILED_MARGIN if not upper else -FAILED_MARGIN)
    failed = lv.saturated_at_s is not None or too_many_failures(lv.metrics, plan.max_error_rate) \
        or lv.metrics.num_requests == 0
    return LevelMargins(lv.rate, margins, margin_draws, failed, lv.windows, met=lv.verdict.ok, raw_draws=raw_draws)


# An undecided level is measured again only when its binding SLO metric lies within this many log units of
# its limit (0.78x .. 1.28x): a level far from the limit tells the fit little more the second time, and a
# window spent there is one the levels around the crossing do not get (on an H100 the search once spent
# three of its eight windows again on levels at a third and a half of the TTFT limit, and stopped with the
# capacity bracketed between levels 25% apart).
NEAR_LIMIT = 0.25


def level_confidence(confidence: float) -> float:
    """The confidence a capacity search decides each level at, for a capacity interval at
    ``confidence``: each of the two decisions bounding it may be wrong (1 - confidence) / 2 of the
    time (0.90 -> 0.95)."""
    return 1.0 - (1.0 - confidence) / 2.0


def _wait_idle(ep, timeout_s: float = 30.0) -> None:
    """Wait until the engine reports no running or waiting request (best effort: 1 s without metrics)."""

    if not ep.metrics_url:
        time.sleep(1.0)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            m = parse_prometheus(fetch_metrics_text(ep.metrics_url), ep.metric_labels or None)
        except Exception:  # noqa: BLE001 - metrics are optional
            time.sleep(1.0)
            return
        busy = sum(v for k, v in m.items() if k.startswith(ep.metric_prefix)
                   and k.endswith(("num_requests_running", "num_requests_waiting")))
        if busy == 0:
            return
        time.sleep(0.2)




def phase_metrics(plan: LoadPlan, phase: LoadPhase, gpus: int):
    """The trial's load metrics (the load window's, or the capacity level's), the capacity
    search's answer, the metrics' intervals and the paired draws of the metrics comparisons read
    (:mod:`orchestrator.results.paired`): ``(LoadMetrics, CapacityOutcome or None, {metric: Interval},
    confidence, {metric: draws})``."""

    cap = phase.capacity
    wanted = list(plan.interval_metrics)
    if cap is None:
        intervals = record_intervals(plan, phase.records, wanted, confidence=DEFAULT_CONFIDENCE, gpus=gpus)
        draws = row_draws(plan, phase.records, gpus=gpus)
        return summarise_records(plan, phase.records, phase.requested_rate, gpus), None, intervals, \
            DEFAULT_CONFIDENCE, draws
    chosen = cap.best or min(cap.levels, key=lambda lv: lv.rate)
    m = dataclasses.replace(chosen.metrics, output_throughput_per_gpu=chosen.metrics.output_throughput / max(gpus, 1))
    spec = plan.capacity
    base_rate = phase.levels_base_rate
    scale = 1.0 if spec.level_duration_s or not base_rate else base_rate / chosen.rate
    blocks = capacity_block_requests(plan, RateGrid.of(spec, spec.start_rate or base_rate or spec.min_rate).start,
                                     base_rate)
    intervals = record_intervals(plan, chosen.records, wanted, confidence=spec.confidence, gpus=gpus,
                                 window_scale=scale, block_requests=blocks)
    draws = row_draws(plan, chosen.records, gpus=gpus, window_scale=scale, block_requests=blocks)
    fit = cap.fit
    if fit is not None:  # no level met: the capacity lies below the lowest, its interval [0, high]
        intervals["capacity_rps"] = Interval(fit.low if cap.best is not None else 0.0, fit.high)
        draws["capacity_rps"] = np.asarray(fit.paired_draws if fit.paired_draws is not None else fit.draws,
                                           dtype=float)
    outcome = CapacityOutcome(
        capacity_rps=cap.capacity_rps, capacity_goodput=cap.capacity_goodput, levels=len(cap.levels),
        stop_reason=cap.stop_reason, level_of_row=chosen.level,
        curve=tuple((lv.rate, lv.metrics.request_throughput, lv.verdict.ok) for lv in cap.levels),
        low=fit.low if fit is not None else None, high=fit.high if fit is not None else None,
        confidence=spec.confidence,
        conditioned=fit.conditioned if fit is not None else None,
        binding=fit.binding if fit is not None else None,
        margin_slope=fit.slope if fit is not None else None,
        margin_sd=fit.margin_sd if fit is not None else None,
        contradictions=fit.contradictions if fit is not None else 0,
        windows=sum(lv.windows for lv in cap.levels))
    return m, outcome, intervals, spec.confidence, draws


def row_draws(plan: LoadPlan, records: list[RequestRecord], *, gpus: int = 1, window_scale: float = 1.0,
              block_requests: Optional[int] = None) -> dict[str, np.ndarray]:
    """The paired draws of the metrics the study compares trials by (``LoadPlan.paired_metrics``), over
    the requests the row's metrics measure: the same resamples in every trial that replayed them."""
    if not plan.paired_metrics:
        return {}
    wl = plan.workload
    measured = in_window(records, measurement_window(records, wl.warmup_s * window_scale, wl.cooldown_s * window_scale))
    got = metric_draws(measured, plan.paired_metrics, gpus=gpus, slo=plan.request_slo,
                       seed=plan.seed, block_requests=block_requests, window_noise=plan.window_noise,
                       noise_seed=noise_seed(plan, 2), start_shift=start_shift(plan, plan.paired_metrics))
    return {m: d.raw for m, d in got.items()}


def session_results(plan: LoadPlan, phase: LoadPhase, metrics) -> tuple[SessionColumns, list[dict[str, Any]]]:
    """A session workload's columns (:mod:`orchestrator.measure.session_metrics`) and per-turn table, over
    the requests the row's metrics measure (the load window's, or the capacity level's); empty for
    workloads of single requests."""
    if plan.workload.sessions is None:
        return SessionColumns(), []
    records, scale = phase.records, 1.0
    cap = phase.capacity
    if cap is not None:
        chosen = cap.best or min(cap.levels, key=lambda lv: lv.rate)
        records = chosen.records
        base_rate = phase.levels_base_rate
        scale = 1.0 if plan.capacity.level_duration_s or not base_rate else base_rate / chosen.rate
    wl, slo = plan.workload, plan.request_slo
    window = measurement_window(records, wl.warmup_s * scale, wl.cooldown_s * scale)
    return (SessionColumns(session_columns(records, slo=slo, duration_s=metrics.duration_s, window=window)),
            turn_table(records, slo=slo, window=window))
