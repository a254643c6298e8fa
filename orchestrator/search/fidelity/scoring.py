"""The simulator's side of ``search.fidelity: sim``: what it scores and what real trials are compared on.

:func:`score_in_simulator` runs configurations through the trial path in virtual time
(``engine.mode: virtual``) under a calibration, at the study's own load or, for a capacity
study's levels, at given rates; :class:`SimScorer` spreads a long list over the Ray
cluster's free CPUs. :func:`fidelity_metrics` names what a real trial reports for the
calibration fit, and :func:`fit_levels` which of a capacity trial's load levels it is fitted to.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional, Sequence

from orchestrator.numbers import finite_float
from orchestrator.results.levels import is_set, level_mark
from orchestrator.search.fidelity import model as fm
from orchestrator.search.trial_plan import load_plan, run_trial
from orchestrator.study.engine import SimCalibration, SimEngineSpec
from orchestrator.trial.capacity import level_workload
from orchestrator.trial.run import TrialContext

# A capacity trial's load levels the calibration is fitted to: those nearest its capacity (the knee
# of its curve says most about the step costs; each level is one simulation per evaluation of the fit).
FIT_LEVELS = 3
# Metrics a queue or the client dominates on an overloaded or harness-bound level: not the engine's.
WAIT_METRICS = ("ttft", "e2el")

# scorer(points, calibration[, rates]): each point's status and metrics; with ``rates``, point i
# served at rates[i] requests per second as one load window (a capacity study's level).
Scorer = Callable[..., list[tuple[str, dict]]]


def study_metrics(study) -> list[str]:
    """The metrics predicted next to each measurement: objectives, then SLO metrics."""
    out: list[str] = []
    for m in [o.metric for o in study.objectives] + [c.metric for c in study.constraints]:
        if m not in out:
            out.append(m)
    return out


def fidelity_metrics(study) -> list[str]:
    """What a real trial reports for the calibration fit: the fit metrics and the study's own."""
    return list(dict.fromkeys(list(fm.FIT_METRICS) + study_metrics(study)))


def noise_columns(study) -> list[str]:
    """The intervals of the study's own metrics a real trial reports beside them: how sure each
    measurement is (the residual model's noise, the stop rule's threshold)."""
    return [f"{m}_{end}" for m in study_metrics(study) for end in ("low", "high")]


def fit_levels(study, level_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A capacity trial's load levels as the calibration fit compares them with the simulator.

    A trial's own metrics are measured at its capacity and a prediction's at the predicted
    capacity: two load levels. Each level is instead compared with the simulator at the
    level's own rate. At most :data:`FIT_LEVELS`, nearest the capacity. A level stopped early
    is left out (its requests in flight were aborted); so are the TTFT and E2E of an
    overloaded or harness-bound level (a queue or the client, not the engine:
    :func:`orchestrator.results.levels.level_mark`). Each: ``rate`` and the metrics scored."""
    rows = [dict(r) for r in level_rows if finite_float(r.get("rate"))]
    ran = [r for r in rows if not is_set(r.get("stopped_early"))]
    ttfts = [v for r in ran if (v := finite_float(r.get("ttft_p50_ms")))]
    if not ran or not ttfts:
        return []
    passed = [r["rate"] for r in ran if is_set(r.get("slo_met"))]
    knee = max(passed) if passed else min(r["rate"] for r in ran)
    out = []
    for r in sorted(ran, key=lambda r: (abs(math.log(r["rate"] / knee)), r["rate"]))[:FIT_LEVELS]:
        mark, _ = level_mark({**r, "ttft_p50_ms": finite_float(r.get("ttft_p50_ms")) or math.inf}, min(ttfts))
        level = {"rate": float(r["rate"])}
        for m in fidelity_metrics(study):
            v = finite_float(r.get(m))
            if v is not None and not (mark is not None and m.startswith(WAIT_METRICS)):
                level[m] = v
        out.append(level)
    return sorted(out, key=lambda lv: lv["rate"])


def score_in_simulator(study, points: Sequence[Mapping[str, Any]], calibration: Mapping[str, float],
                       rates: Optional[Sequence[Optional[float]]] = None) -> list[tuple[str, dict]]:
    """Each configuration's status and metrics from the virtual-time simulator under ``calibration``;
    with ``rates``, point i as one load window at ``rates[i]`` (a capacity study's level there)."""
    engine = SimEngineSpec(kind="sim", mode="virtual", calibration=SimCalibration(**calibration))
    sim = study.model_copy(update={"engine": engine})
    ctx = TrialContext(run_id="fidelity")
    base_rate = None
    if rates is not None and sim.capacity is not None and sim.workload.trace is not None:
        base_rate = load_plan(sim).requests().requested_rate  # a trace's own rate, as a level rescales it
    out = []
    for i, p in enumerate(points):
        at = sim
        rate = rates[i] if rates is not None else None
        if rate is not None and sim.capacity is not None:
            at = sim.model_copy(update={"capacity": None,
                                        "workload": level_workload(sim.workload, rate, sim.capacity, base_rate)})
        r = run_trial(at, dict(p), trial_id="fidelity", trial_number=0, ctx=ctx)
        out.append((r.status.value, r.measured()))
    return out


class SimScorer:
    """Scores configurations with the virtual-time simulator under a calibration.

    :meth:`over_cluster` splits a long list over the Ray cluster's free CPUs, one task per
    chunk: the whole space before the first real trial, and a refit's shortlist when no trial
    is running. A call scores in this process, on one core: while trials measure on this
    node, the scoring must not take the CPUs their engines and load generators use."""

    PARALLEL_MIN = 16  # points below which the tasks' start-up costs more than it saves (a capacity trial: ~1 s)
    CHUNK = 16

    def __init__(self, study):
        self.study = study

    def __call__(self, points: Sequence[Mapping[str, Any]], calibration: Mapping[str, float],
                 rates: Optional[Sequence[Optional[float]]] = None) -> list[tuple[str, dict]]:
        return score_in_simulator(self.study, points, calibration, rates)

    def over_cluster(self, points: Sequence[Mapping[str, Any]], calibration: Mapping[str, float],
                     rates: Optional[Sequence[Optional[float]]] = None) -> list[tuple[str, dict]]:
        cpus = _free_ray_cpus() if len(points) >= self.PARALLEL_MIN else 0
        if cpus < 2:
            return score_in_simulator(self.study, points, calibration, rates)
        # deferred: ray takes ~0.3 s to import; validate/show load this module
        import ray

        size = max(self.CHUNK // 4, min(self.CHUNK, -(-len(points) // cpus)))
        task = ray.remote(num_cpus=1)(score_in_simulator)
        study = ray.put(self.study)
        refs = [task.remote(study, list(points[i:i + size]), dict(calibration),
                            None if rates is None else list(rates[i:i + size]))
                for i in range(0, len(points), size)]
        return [r for chunk in ray.get(refs) for r in chunk]


def _free_ray_cpus() -> int:
    try:
        # deferred: ray takes ~0.3 s to import; validate/show load this module
        import ray

        return int(ray.available_resources().get("CPU", 0)) if ray.is_initialized() else 0
    except Exception:  # noqa: BLE001 - no cluster to ask: score here
        return 0
