"""One trial: pre-flight -> deploy -> warm up -> load + telemetry -> tear down -> a TrialResult.

A trial runs a :class:`~orchestrator.trial.plan.TrialPlan` (what the search decided: the
resolved arguments, the request set, the SLOs) and never reads the study. Every outcome is a
:class:`~orchestrator.trial.result.TrialResult`. A configuration that
cannot start is ``infeasible`` with the engine's own message; an engine that dies under
load is ``failed`` (:mod:`orchestrator.failures` decides which); neither raises, because a
trial that raises teaches the sampler nothing. What the result is worth is the judge's
(:mod:`orchestrator.study.judge`); its row is :func:`orchestrator.search.row.trial_row`.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from orchestrator.engines import Engine, EngineContext
from orchestrator.failures import (EngineStartError, Failure, FailureKind, TrialStatus, classify_load, empty_window,
                                   request_failures, start_failure, status_of, teardown_warning)
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.pricing import UnitMetrics, unit_metric_intervals, unit_metrics
from orchestrator.measure.columns import EngineColumns, ProbeColumns, SessionColumns
from orchestrator.measure.harness import HarnessVerdict, harness_verdict
from orchestrator.measure.warmup import WarmupOutcome
from orchestrator.results.probe_store import ProbeStore
from orchestrator.trial.load_phase import LoadPhase, measure, phase_metrics, served_load, session_results
from orchestrator.trial.plan import ProbePlan, TrialPlan
from orchestrator.trial.probe import probe_trial
from orchestrator.trial.result import PhaseTimings, TrialResult

log = logging.getLogger(__name__)

__all__ = ["TrialContext", "execute_trial", "failed_trial"]


@dataclass(frozen=True)
class TrialContext:
    """Study-run facts every trial needs (picklable; sent to trial actors): what the engines
    and the lease use, instead of environment variables or imports of the driver."""

    run_id: str
    namespace: str = "orchestrator"
    ledger_name: Optional[str] = None
    sink_name: Optional[str] = None
    cluster_units: Optional[int] = None
    units_per_node: Optional[int] = None
    serve_port: int = 8000

    def engine_context(self) -> EngineContext:
        return EngineContext(serve_port=self.serve_port, ledger_name=self.ledger_name, namespace=self.namespace)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class _Builder:
    """The fields of a TrialResult while its trial runs (the result itself is frozen)."""

    run_id: str
    trial_id: str
    trial_number: int
    params: dict[str, Any]
    started_at: datetime
    t0: float
    measurement: int = 0
    args: Optional[EngineArgs] = None
    status: TrialStatus = TrialStatus.ERROR
    failure: Optional[Failure] = None
    phase: Optional[LoadPhase] = None
    engine_facts: Optional[dict] = None
    probe: Optional[ProbeColumns] = None
    queue_s: Optional[float] = None
    startup_s: Optional[float] = None
    load_window_s: Optional[float] = None
    teardown_s: Optional[float] = None

    def fail(self, failure: Failure) -> "_Builder":
        self.status, self.failure = status_of(failure.kind), failure
        return self

    def build(self, plan: Optional[TrialPlan]) -> TrialResult:
        timings = PhaseTimings(queue_s=self.queue_s, startup_s=self.startup_s, load_window_s=self.load_window_s,
                               teardown_s=self.teardown_s, wall_time_s=time.monotonic() - self.t0)
        metrics = capacity = None
        telemetry = EngineColumns()
        warmup: Optional[WarmupOutcome] = None
        harness: Optional[HarnessVerdict] = None
        records: tuple = ()
        levels: tuple = ()
        unit: Optional[UnitMetrics] = None
        sessions = SessionColumns()
        turns: list = []
        intervals: dict = {}
        draws: dict = {}
        confidence = None
        phase = self.phase
        if phase is not None and plan is not None:
            load = plan.load
            metrics, capacity, intervals, confidence, draws = phase_metrics(load, phase,
                                                                            self.args.gpus if self.args else 1)
            sessions, turns = session_results(load, phase, metrics)
            if self.status is TrialStatus.COMPLETED:
                first = next((r.error for r in phase.records if r.error and not r.warmup), None)
                wl = load.workload
                failure = empty_window(metrics, wl.warmup_s, wl.cooldown_s) \
                    or request_failures(metrics, load.max_error_rate, first)
                if failure is not None:
                    self.fail(failure)
            telemetry, warmup = EngineColumns(phase.telemetry), phase.warmup
            records, levels = tuple(phase.records), tuple(phase.level_rows())
            harness = harness_verdict({**metrics.as_dict(), **telemetry})
            gpus, price = self.args.gpus if self.args else None, plan.price_per_gpu_hour
            unit = UnitMetrics(**unit_metrics({**metrics.as_dict(),
                                               "capacity_rps": capacity.capacity_rps if capacity else None},
                                              gpus, price))
            intervals = {**intervals, **unit_metric_intervals(intervals, gpus, price)}
            if metrics.loadgen_overloaded:
                log.warning("trial %s: the load generator lagged (p99 send lag %.1f ms > %.1f ms): latencies "
                            "include client delay", self.trial_id, metrics.sched_lag_p99_ms,
                            load.workload.max_sched_lag_ms)
        return TrialResult(
            run_id=self.run_id, trial_id=self.trial_id, trial_number=self.trial_number, params=dict(self.params),
            args=self.args, started_at=self.started_at, finished_at=_utc_now(), status=self.status,
            failure=self.failure, metrics=metrics, telemetry=telemetry, warmup=warmup, harness=harness,
            engine_facts=dict(self.engine_facts or {}), timings=timings, capacity=capacity, records=records,
            levels=levels, unit_metrics=unit, probe=self.probe or ProbeColumns(), intervals=intervals,
            confidence=confidence, measurement=self.measurement, sessions=sessions, turns=tuple(turns),
            draws=draws, draws_seed=plan.load.seed if plan is not None else None,
            start_noise=plan.load.start_noise_source if plan is not None else None)


def execute_trial(plan: TrialPlan, engine: Engine, ctx: TrialContext) -> TrialResult:
    """Run one planned configuration end to end; never raises for configuration or engine problems.

    ``plan.measurement`` k > 0: the configuration measured again (racing); its plan's workload seed
    is its own (:func:`orchestrator.workload.synthesis.measurement_seed`): other arrivals and prompts."""
    b = _Builder(ctx.run_id, plan.trial_id, plan.trial_number, dict(plan.params), _utc_now(),
                 time.monotonic(), measurement=plan.measurement, args=plan.args)
    try:
        _run(plan, engine, b, ctx)
    except Exception as e:  # noqa: BLE001 - an orchestrator bug must still leave a row
        log.exception("trial %s: internal error", plan.trial_id)
        b.phase = None
        b.fail(Failure(FailureKind.INTERNAL, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"))
    return b.build(plan)


def failed_trial(ctx: TrialContext, params: dict[str, Any], failure: Failure, *, trial_id: str, trial_number: int,
                 measurement: int = 0) -> TrialResult:
    """The result of a trial that could not even be planned (an orchestrator bug: still a row)."""
    b = _Builder(ctx.run_id, trial_id, trial_number, dict(params), _utc_now(), time.monotonic(),
                 measurement=measurement)
    return b.fail(failure).build(None)


def _run(plan: TrialPlan, engine: Engine, b: _Builder, ctx: TrialContext) -> None:
    args = plan.args
    if plan.refusal is not None:
        b.fail(Failure(FailureKind.PREFLIGHT, plan.refusal))
        return

    requests = plan.load.requests()
    if not engine.serves_http:
        t_load = time.monotonic()
        try:
            b.phase = measure(plan.load, requests, lambda rs, monitor, again: engine.measure(args, rs), served=False)
        except EngineStartError as e:
            b.fail(start_failure(e))
            return
        b.load_window_s = time.monotonic() - t_load
        b.status = TrialStatus.COMPLETED
        return

    lease = _Lease(ctx, trial_id=b.trial_id, request=engine.resources(args))
    t_queue = time.monotonic()
    with lease:
        b.queue_s = time.monotonic() - t_queue
        if lease.error:
            b.fail(Failure(FailureKind.PREFLIGHT, lease.error))
            return
        try:
            deployment = engine.deploy(b.trial_id, args)
        except EngineStartError as e:
            b.fail(start_failure(e))
            return
        with deployment:
            ep = deployment.endpoint
            b.startup_s = ep.startup_s
            b.engine_facts = {"endpoint": ep.base_url, **ep.facts}
            if plan.probe is not None:  # before the warm-up: outside the measured window
                b.probe, note = probe_trial(plan.probe, base_url=ep.base_url, model=ep.model, api_key=ep.api_key,
                                            trial_id=b.trial_id, params=b.params, args=args,
                                            store=_probe_store(plan.probe, ctx))
                if note:
                    b.engine_facts["probe_errors"] = note
            t_load = time.monotonic()
            b.phase = served_load(plan.load, deployment, requests)
            b.load_window_s = time.monotonic() - t_load
            health = deployment.health()
            t_down = time.monotonic()
        b.teardown_s = time.monotonic() - t_down
        problems = deployment.teardown_problems()

    measured = [r for r in b.phase.records if not r.warmup]
    # Every request's error, the warm-up's included: an engine that died while it warmed up (a fault
    # at the third request) told only those requests why, and Serve may have stopped it since.
    failure = classify_load(health=health, errors=(r.error for r in b.phase.records),
                            succeeded=sum(r.success for r in measured), measured=len(measured))
    if failure is not None:
        b.fail(failure)
    else:
        b.status, b.failure = TrialStatus.COMPLETED, teardown_warning(problems)


class _SinkProbeStore:
    """The run's results writer as the probe's store (one writer claims the baseline)."""

    def __init__(self, sink):
        self.sink = sink

    def baseline(self, probe_set: str):
        import ray

        return ray.get(self.sink.probe_baseline.remote(probe_set))

    def keep(self, *args):
        import ray

        return ray.get(self.sink.keep_probe.remote(*args))


def _probe_store(plan: ProbePlan, ctx: TrialContext):
    """Where the probe's answers go: the run's results writer, or, with no run around this trial,
    the study's results directory directly."""
    if ctx.sink_name is None:
        return ProbeStore(plan.results_dir, plan.study_name)
    import ray

    return _SinkProbeStore(ray.get_actor(ctx.sink_name, namespace=ctx.namespace))


class _Lease:
    """Holds the trial's GPUs in the run's ledger (if any) from deploy to teardown."""

    def __init__(self, ctx: TrialContext, *, trial_id: str, request):
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
