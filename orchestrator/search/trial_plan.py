"""From a study and a proposed configuration to a :class:`~orchestrator.trial.plan.TrialPlan`: the
one place below which nothing reads the study.

:func:`plan_trial` resolves the configuration's engine arguments once (the engine's
``resolve``: vLLM's device defaults through :meth:`Study.with_device_defaults`, the same
resolver the survey, screening and stages use), runs the pre-flight, and fixes the request
set's seed, the SLOs, the capacity search and the probe. :func:`run_trial` plans and executes
a trial; :func:`judge_result` asks the one judge what it is worth.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
import zlib
from typing import Any, Mapping, Optional

from orchestrator.engines import Engine, EngineContext, EngineTarget, create_engine
from orchestrator.failures import Failure, FailureKind
from orchestrator.measure.confidence import INTERVAL_METRICS
from orchestrator.measure.engine_noise import (CPU_START_NOISE, CPU_WINDOW_NOISE, GPU_START_NOISE, GPU_WINDOW_NOISE,
                                               NO_START_NOISE, NO_WINDOW_NOISE, WindowNoise)
from orchestrator.measure.metrics import LOAD_METRIC_NAMES
from orchestrator.results.paired import draw_metrics
from orchestrator.search import feasibility
from orchestrator.study.judge import Judgement, judge
from orchestrator.study.spec import Study
from orchestrator.study.state_dir import local_state_dir
from orchestrator.trial.plan import LoadPlan, ProbePlan, TrialPlan
from orchestrator.trial.result import TrialResult
from orchestrator.trial.run import TrialContext, execute_trial, failed_trial
from orchestrator.workload.synthesis import measurement_seed

log = logging.getLogger(__name__)

__all__ = ["engine_for", "engine_target", "judge_result", "load_plan", "plan_trial", "row_interval_metrics", "run_trial",
           "start_noise", "window_noise"]


def engine_target(study: Study) -> EngineTarget:
    """What the study asks of its engine (engines read this, never the study)."""
    return EngineTarget(engine=study.engine, model=study.model, hardware=study.hardware, model_shape=study.model_shape,
                        device_defaults=study.device_defaults, state_dir=local_state_dir(study),
                        base_dir=study.base_dir, seed=study.seed, request_timeout_s=study.workload.timeout_s)


def engine_for(study: Study, context: Optional[EngineContext] = None) -> Engine:
    """The study's engine, told where the run's Serve and ledger are (``context``)."""
    return create_engine(engine_target(study), context)


def row_interval_metrics(study: Study) -> tuple[str, ...]:
    """The load metrics a trials row gets an interval of: every one :mod:`orchestrator.measure.confidence`
    covers, the token gaps (ITL) only where the study ranks or judges by one (they cost the most)."""
    named = {o.metric for o in study.objectives} | {c.metric for c in study.constraints}
    return tuple(m for m in INTERVAL_METRICS if m in LOAD_METRIC_NAMES and (not m.startswith("itl_") or m in named))


def paired_metrics(study: Study) -> tuple[str, ...]:
    """The load metrics a row keeps bootstrap draws of, for paired comparisons: the objectives' and the
    constraints' (a per-GPU or per-dollar metric through its base), where an interval exists."""
    named = draw_metrics([o.metric for o in study.objectives] + [c.metric for c in study.constraints])
    return tuple(m for m in named if m in INTERVAL_METRICS and m in LOAD_METRIC_NAMES)


def load_plan(study: Study, measurement: int = 0) -> LoadPlan:
    """The study's load phase, drawn with the measurement's seed (k > 0: measured again, other requests)."""
    return LoadPlan(
        workload=study.workload,
        seed=study.seed if measurement == 0 else measurement_seed(study.seed, measurement),
        vocab_size=study.model_shape.vocab_size,
        request_slo=study.request_slo(),
        base_dir=str(study.base_dir) if study.base_dir is not None else None,
        capacity=study.capacity,
        capacity_slo=tuple(study.capacity_slo()) if study.capacity is not None else (),
        interval_metrics=row_interval_metrics(study),
        paired_metrics=paired_metrics(study),
        max_error_rate=study.max_error_rate,
        window_noise=window_noise(study),
        start_noise=start_noise(study)[0],
        start_noise_source=start_noise(study)[1])


def window_noise(study: Study) -> WindowNoise:
    """The between-window noise of the study's engine: the study's own (``capacity.window_noise``),
    else the one measured for its kind (docs/benchmarks.md, "Window noise"): none for the simulator,
    whose windows differ only by the workload; vLLM's on CPU or on a GPU otherwise."""
    if study.capacity is not None and study.capacity.window_noise is not None:
        return WindowNoise.of(study.capacity.window_noise)
    if study.engine.kind == "sim":
        return NO_WINDOW_NOISE
    return CPU_WINDOW_NOISE if study.on_cpu else GPU_WINDOW_NOISE


def start_noise(study: Study) -> tuple[WindowNoise, str]:
    """The start-to-start noise of the study's engine and where it comes from: the study's own
    (``capacity.start_noise``), else the prior measured for its kind (docs/benchmarks.md, "Engine starts
    as replicates"): none for the simulator, vLLM's on CPU or on a GPU otherwise; an external endpoint
    is not started by the study, and gets the GPU's prior (it is what one start cannot see)."""
    if study.capacity is not None and study.capacity.start_noise is not None:
        return WindowNoise.of(study.capacity.start_noise), "study (capacity.start_noise)"
    if study.engine.kind == "sim":
        return NO_START_NOISE, "none (simulator)"
    if study.on_cpu:
        return CPU_START_NOISE, "prior: vLLM on CPU"
    return GPU_START_NOISE, "prior: vLLM on GPU"


def _probe_plan(study: Study) -> Optional[ProbePlan]:
    if study.probe is None:
        return None
    engine = study.engine
    if engine.kind == "external":
        reference = "endpoint"  # weights the study does not know
    else:
        reference = "dummy" if getattr(engine, "load_format", None) == "dummy" else "weights"
    return ProbePlan(spec=study.probe, vocab_size=study.model_shape.vocab_size, seed=study.seed,
                     reference=reference, results_dir=study.output, study_name=study.name)


def plan_trial(study: Study, params: Mapping[str, Any], engine: Engine, *, trial_id: str, trial_number: int,
               measurement: int = 0, cluster_units: Optional[int] = None,
               units_per_node: Optional[int] = None, beat_rate: Optional[float] = None) -> TrialPlan:
    """Decide one trial: its arguments resolved by ``engine``, the pre-flight's verdict, how it is measured
    (``beat_rate``: the capacity its search stops below, :mod:`orchestrator.search.best_capacity`)."""
    args = engine.resolve(study.engine_args(params))
    refusal = None
    if feasibility.preflight_on(study):
        verdict = feasibility.check(study, args, cluster_units=cluster_units, units_per_node=units_per_node)
        if not verdict.ok:
            refusal = f"[{verdict.kind.value}] {verdict.reason}"
    return TrialPlan(
        trial_id=trial_id, trial_number=trial_number, params=dict(params), args=args, model=study.model_shape,
        device=study.device_defaults, measurement=measurement, refusal=refusal,
        load=dataclasses.replace(load_plan(study, measurement), noise_seed=zlib.crc32(trial_id.encode()),
                                 beat_rate=beat_rate if measurement == 0 else None),
        probe=_probe_plan(study), price_per_gpu_hour=study.price.value)


def run_trial(study: Study, params: Mapping[str, Any], *, trial_id: str, trial_number: int, ctx: TrialContext,
              engine: Optional[Engine] = None, measurement: int = 0, beat_rate: Optional[float] = None) -> TrialResult:
    """Plan and execute one configuration; never raises for configuration or engine problems."""
    try:
        engine = engine or engine_for(study, ctx.engine_context())
        plan = plan_trial(study, params, engine, trial_id=trial_id, trial_number=trial_number,
                          measurement=measurement, cluster_units=ctx.cluster_units,
                          units_per_node=ctx.units_per_node, beat_rate=beat_rate)
    except Exception as e:  # noqa: BLE001 - an orchestrator bug must still leave a row
        log.exception("trial %s: internal error while planning it", trial_id)
        failure = Failure(FailureKind.INTERNAL, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}")
        return failed_trial(ctx, dict(params), failure, trial_id=trial_id, trial_number=trial_number,
                            measurement=measurement)
    return execute_trial(plan, engine, ctx)


def judge_result(study: Study, result: TrialResult) -> Judgement:
    """The one judge, applied to a trial's record."""
    return judge(study, result.measured(), result.status)
