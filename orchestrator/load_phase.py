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
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

from orchestrator.capacity import (LevelResult, SaturationDetector, detect_saturation, judge_level, level_workload,
                                   search_capacity)
from orchestrator.harness import harness_verdict
from orchestrator.loadgen import Endpoint, run_load_sync
from orchestrator.metrics import (ENGINE_WINDOW_METRIC_NAMES, WARMUP_METRIC_NAMES, LoadMetrics, measurement_window,
                                  summarise)
from orchestrator.nvml import try_nvml
from orchestrator.prometheus_text import fetch_metrics_text, parse_prometheus
from orchestrator.records import RequestErrorKind, RequestRecord
from orchestrator.sim.models import ModelShape
from orchestrator.study import Study
from orchestrator.telemetry import TelemetrySampler
from orchestrator.trial_result import CapacityOutcome
from orchestrator.warmup import WarmupOutcome
from orchestrator.workload.generate import build_requests
from orchestrator.workload.spec import WorkloadSpec

log = logging.getLogger(__name__)


@lru_cache(maxsize=16)
def _requests_for(workload_json: str, seed: int, vocab_size: int, base_dir: Optional[str] = None, level: int = 0):

    return build_requests(WorkloadSpec.model_validate_json(workload_json), seed, vocab_size, base_dir, level)


def study_requests(study: Study, workload=None, level: int = 0):
    """The request set of the study's workload, or of ``workload`` (a capacity level's, with its
    ``level``: prompts of its own); cached per process: every trial replays the same requests."""

    vocab = ModelShape.load(study.model.name, study.base_dir).vocab_size
    base = str(study.base_dir) if study.base_dir is not None else None
    return _requests_for((workload or study.workload).model_dump_json(), study.seed, vocab, base, level)


def summarise_records(study: Study, records: list[RequestRecord], requested_rate: Optional[float],
               gpus: int = 1, window_scale: float = 1.0) -> LoadMetrics:
    wl = study.workload
    return summarise(records, gpus=gpus, slo=study.request_slo(), requested_rate=requested_rate,
                     window=measurement_window(records, wl.warmup_s * window_scale, wl.cooldown_s * window_scale),
                     # With a concurrency cap the send lag includes the intended wait for a slot.
                     max_sched_lag_ms=None if wl.max_concurrency else wl.max_sched_lag_ms)


@dataclass
class LoadPhase:
    """What the load phase measured: every record (all levels), telemetry, and the capacity search."""

    records: list[RequestRecord]
    telemetry: dict
    requested_rate: Optional[float] = None
    capacity: Optional[Any] = None  # orchestrator.capacity.CapacityResult
    warmup: dict = field(default_factory=dict)  # warmup_* columns of the (first level's) warm-up

    def level_rows(self) -> list[dict[str, Any]]:
        """Rows of the levels table: each level's client metrics, engine-side numbers and harness verdict."""
        if self.capacity is None:
            return []

        rows = []
        for lv in self.capacity.levels:
            row = {**lv.row(), **{k: lv.telemetry.get(k) for k in ENGINE_WINDOW_METRIC_NAMES}}
            rows.append({**row, **harness_verdict(row).columns()})
        return rows


def served_load(study: Study, deployment, requests) -> LoadPhase:

    ep = deployment.endpoint
    endpoint = Endpoint(base_url=ep.base_url, model=ep.model, api=study.workload.api, api_key=ep.api_key)
    nvml = try_nvml(ep.gpu_indices) if ep.sample_nvml else None

    def run_level(rs, monitor):

        window = sampler.window()  # the engine's histograms over this level's measured requests
        warmup = WarmupOutcome()

        def measure_start(warm):
            if any(r.error_kind == RequestErrorKind.ABORTED for r in warm):
                _wait_idle(ep)  # a warm-up that did not converge was aborted: let the engine drop it
            window.begin(warm)

        records = run_load_sync(endpoint, rs, timeout_s=study.workload.timeout_s,
                                max_concurrency=study.workload.max_concurrency,
                                ignore_eos=study.workload.ignore_eos, monitor=monitor,
                                check_interval_s=study.capacity.saturation.check_interval_s
                                if study.capacity else 0.5, on_measure_start=measure_start, warmup_report=warmup)
        if monitor is not None and monitor.saturated_at is not None:
            _wait_idle(ep)  # the next level must not inherit this one's queue
        return records, {**window.finish(records), **warmup.columns()}

    with TelemetrySampler(ep.metrics_url, prefix=ep.metric_prefix, labels=ep.metric_labels, nvml=nvml) as sampler:
        phase = measure(study, requests, run_level, served=True)
    # The window's (or the chosen level's) engine_* columns over the whole load's gauges.
    phase.telemetry = {**sampler.summary(), **phase.telemetry}
    return phase


def measure(study: Study, requests, run_level, *, served: bool) -> LoadPhase:
    """One load window, or a capacity search over levels (``run_level(request set, monitor)``
    returns ``(records, telemetry)``; ``served``: a monitor may stop a level early)."""

    def warmup_of(telemetry: dict) -> dict:  # the warm-up's columns, out of the telemetry
        return {k: telemetry.pop(k, None) for k in WARMUP_METRIC_NAMES}

    if study.capacity is None:
        records, telemetry = run_level(requests, None)
        return LoadPhase(records, telemetry, requests.requested_rate, warmup=warmup_of(telemetry))

    spec = study.capacity
    slo = study.capacity_slo()
    base_rate = requests.requested_rate
    records: list[RequestRecord] = []

    def measure_level(level: int, rate: float) -> LevelResult:
        # Prompts of the level's own: no level is answered from the prefix cache an earlier one filled.
        rs = study_requests(study, level_workload(study.workload, rate, spec, base_rate), level=level)
        if level > 0:  # the engine is warm after the first level
            rs = dataclasses.replace(rs, warmup=(), warmup_stream=None)
        monitor = SaturationDetector(spec.saturation) if served else None
        recs, telemetry = run_level(rs, monitor)
        for r in recs:
            r.level = level
        records.extend(recs)
        saturated_at = monitor.saturated_at if monitor is not None else detect_saturation(recs, spec.saturation)
        # A level replays the workload compressed (or stretched) in time unless its duration is
        # fixed: the warm-up and cool-down windows scale with it, excluding the same requests.
        scale = 1.0 if spec.level_duration_s or not base_rate else base_rate / rate
        m = summarise_records(study, recs, rs.requested_rate, window_scale=scale)
        verdict = judge_level(m, slo, max_error_rate=spec.max_error_rate, saturated=saturated_at is not None)
        log.info("level %d at %.3g req/s: %s", level, rate, "meets the SLOs" if verdict.ok
                 else "; ".join(verdict.reasons))
        return LevelResult(level, rate, len(rs.measured), recs, m, verdict, saturated_at,
                           stopped_early=monitor is not None and monitor.saturated_at is not None,
                           telemetry=telemetry, warmup=warmup_of(telemetry))

    result = search_capacity(measure_level, spec, spec.start_rate or base_rate or spec.min_rate)
    chosen = result.best or min(result.levels, key=lambda lv: lv.rate)
    return LoadPhase(records, chosen.telemetry, chosen.metrics.requested_rate, result, warmup=result.levels[0].warmup)


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




def phase_metrics(study: Study, phase: LoadPhase, gpus: int):
    """The trial's load metrics (the load window's, or the capacity level's) and the capacity
    search's answer: ``(LoadMetrics, CapacityOutcome or None)``."""

    cap = phase.capacity
    if cap is None:
        return summarise_records(study, phase.records, phase.requested_rate, gpus), None
    chosen = cap.best or min(cap.levels, key=lambda lv: lv.rate)
    m = dataclasses.replace(chosen.metrics, output_throughput_per_gpu=chosen.metrics.output_throughput / max(gpus, 1))
    outcome = CapacityOutcome(
        capacity_rps=cap.capacity_rps, capacity_goodput=cap.capacity_goodput, levels=len(cap.levels),
        stop_reason=cap.stop_reason, level_of_row=chosen.level,
        curve=tuple((lv.rate, lv.metrics.request_throughput, lv.verdict.ok) for lv in cap.levels))
    return m, outcome
