"""The simulator replayed on the recorded real datasets: its out-of-sample error.

Every completed real trial of a real-engine dataset under ``results/examples`` is predicted
by the virtual-time simulator with the trial's configuration and its study's workload,
exactly as the fidelity search scores a configuration (:func:`score_in_simulator`): a capacity
trial's capacity (the capacity search run in virtual time) and each load level that ran to
the end at its own rate; a fixed-rate trial's one window. Before predicting, the calibration
the fidelity search fits (:func:`~orchestrator.search.fidelity.model.fit_calibration` on the
load levels :func:`fit_levels` picks) is fitted on other datasets, by scheme:

* ``shipped``: none (the cost constants as shipped, which were fitted to H200 data:
  docs/simulator.md says which);
* ``leave-one-out``: fitted on every other dataset of the same GPU;
* ``other-gpu``: fitted on every dataset of the other GPU(s).

:func:`run_fold` returns one row per (trial, load level, metric): what ``benchmarks/sim_error.py``
stores in ``results/examples/sim-error`` and :mod:`.sim_error` summarises. A trial whose
configuration the simulator does not model (speculative decoding) is left out, and so is a
dataset it cannot replay (the simulator's own, CPUs, no study); :func:`recorded_trials` says why.
"""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from orchestrator.failures import TrialStatus
from orchestrator.hardware.gpus import GPUS, get_gpu
from orchestrator.models import modelgen
from orchestrator.numbers import finite_float
from orchestrator.results.definition import read_study_definition
from orchestrator.results.levels import is_set, level_mark, load_levels
from orchestrator.results.query import load_trials
from orchestrator.search.fidelity import model as fm
from orchestrator.search.fidelity.scoring import fidelity_metrics, fit_levels, score_in_simulator, study_metrics

SHIPPED, LEAVE_ONE_OUT, OTHER_GPU = "shipped", "leave-one-out", "other-gpu"
SCHEMES = (SHIPPED, LEAVE_ONE_OUT, OTHER_GPU)
# What the error table reports, in its order: capacity per trial, the rest per load level.
TABLE_METRICS = ("capacity_rps", "output_throughput", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "tpot_p50_ms")
WAIT_METRICS = ("ttft_p50_ms", "ttft_p99_ms")  # a queue's, on an overloaded or harness-bound level
# The catalog shape the trained models were made from (``make-model tiny-llama --recipe ...``): their
# datasets name the model by its path on the machine that ran them; model-training.json has the recipe.
TRAINED_SHAPE = "tiny-llama"
TRAINING_RECORD = "model-training.json"

# (study folder relative to the examples root, parameters as JSON, rate: None for the trial as its study runs it)
Task = tuple[str, str, Optional[float]]
# simulate(tasks, calibration): each task's status and metrics (a pool and a cache in the benchmark)
Simulate = Callable[[Sequence[Task], Mapping[str, float]], list[dict]]


@dataclass(frozen=True)
class RecordedTrial:
    """One completed real trial, with what its prediction is compared with."""

    dataset: str  # folder under the examples root
    study_dir: str  # its study's folder, relative to the examples root
    gpu: str  # catalog name
    trial_id: str
    config: str  # the searched parameters, short
    params: str  # every parameter, JSON with sorted keys
    row: dict  # the trial's measured metrics
    levels: tuple  # its load levels (rows of the levels table), in the order measured
    capacity: bool  # a capacity study's trial
    objective: str  # the study's first objective
    maximize: bool
    margin: float  # the study's equivalence margin


@dataclass(frozen=True)
class Fold:
    scheme: str
    gpu: str  # the GPU of the datasets predicted
    held_out: tuple[str, ...]  # datasets predicted
    trained_on: tuple[str, ...]  # datasets the calibration is fitted on (none: shipped)


# ---------------------------------------------------------------- the recorded datasets
def study_dirs(dataset: Path) -> list[Path]:
    """A dataset's study folders: itself, or its sub-folders that hold a study (repeated runs)."""
    if (dataset / "study.json").is_file():
        return [dataset]
    return sorted(p.parent for p in dataset.glob("*/study.json"))


def _not_modelled(params: Mapping[str, Any]) -> Optional[str]:
    if (params.get("num_speculative_tokens") or 0) > 0 or params.get("speculative_model"):
        return "speculative decoding (not modelled)"
    return None


def _label(study, params: Mapping[str, Any]) -> str:
    """The searched parameters, short (a path by its last part: where the study ran is no part of it)."""
    shown = {k: params.get(k) for k in study.space.sampled_names()} or params
    return " ".join(f"{k}={Path(v).name if isinstance(v, str) and '/' in v else v}" for k, v in sorted(shown.items()))


def recorded_trials(root: Path) -> tuple[list[RecordedTrial], dict[str, str]]:
    """Every completed real trial the simulator can replay, and the studies' results left out (name -> why)."""
    trials, skipped = [], {}
    for dataset in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        dirs = study_dirs(dataset)
        if not dirs:
            continue  # not a study's results (benchmark files, this replay's own output): nothing to replay
        first = read_study_definition(str(dirs[0]))
        if first.engine.kind == "sim":
            skipped[dataset.name] = "the simulator's own measurements"
            continue
        if first.hardware.gpu.upper() not in {g.upper() for g in GPUS}:
            skipped[dataset.name] = f"hardware.gpu {first.hardware.gpu}: the simulator models GPUs"
            continue
        for d in dirs:
            trials += _study_trials(root, dataset.name, d, skipped)
    return trials, skipped


def _study_trials(root: Path, dataset: str, path: Path, skipped: dict[str, str]) -> list[RecordedTrial]:
    study = read_study_definition(str(path))
    rows = load_trials(str(path), status=TrialStatus.COMPLETED.value)
    if "fidelity" in rows.columns:
        rows = rows[rows["fidelity"].fillna("real") == "real"]
    levels = load_levels(str(path)) if study.capacity is not None else None
    out = []
    for _, t in rows.sort_values("trial_number").iterrows():
        params = json.loads(t["params_json"])
        if (why := _not_modelled(params)) is not None:
            skipped[f"{dataset}: {_label(study, params)}"] = why
            continue
        mine = [] if levels is None else levels[levels["trial_id"] == t["trial_id"]].sort_values("level")
        obj = study.objectives[0]
        out.append(RecordedTrial(
            dataset=dataset, study_dir=str(path.relative_to(root)), gpu=get_gpu(study.hardware.gpu).name,
            trial_id=str(t["trial_id"]), config=_label(study, params), params=json.dumps(params, sort_keys=True),
            row={k: v for k, v in t.items() if finite_float(v) is not None and not isinstance(v, bool)},
            levels=tuple(dict(r) for r in (mine.to_dict("records") if len(mine) else [])),
            capacity=study.capacity is not None, objective=obj.metric,
            maximize=obj.resolved_direction == "maximize", margin=float(study.analysis.equivalence_margin)))
    return out


# ---------------------------------------------------------------- the simulator on a recorded study
_MODEL_DIRS: list = []  # temporary folders of trained models' configs, kept while the process runs


@functools.lru_cache(maxsize=None)
def sim_study(root: str, study_dir: str):
    """The recorded study as the simulator reads it. A model trained here is named by its path on the
    machine that ran the study; its shape is the catalog's :data:`TRAINED_SHAPE` with the
    architecture of the recipe recorded beside the dataset (``model-training.json``)."""
    path = Path(root) / study_dir
    study = read_study_definition(str(path))
    try:
        study.model_shape
        return study
    except FileNotFoundError:
        record = next((p / TRAINING_RECORD for p in (path, path.parent) if (p / TRAINING_RECORD).is_file()), None)
        if record is None:
            raise
    training = json.loads(record.read_text())
    config = {**modelgen.model_config(TRAINED_SHAPE), **training["recipe"]["arch"]}
    if config["vocab_size"] != training["grammar"]["vocab_size"]:
        raise ValueError(f"{record}: vocabulary {training['grammar']['vocab_size']}, {TRAINED_SHAPE} has "
                         f"{config['vocab_size']}")
    folder = tempfile.TemporaryDirectory(prefix="trained-shape-")
    _MODEL_DIRS.append(folder)
    (Path(folder.name) / "config.json").write_text(json.dumps(config))
    return study.model_copy(update={"model": study.model.model_copy(update={"name": folder.name})})


def simulate_task(root: str, task: Task, calibration: Mapping[str, float]) -> dict:
    """One task's status and finite metrics under ``calibration`` (an error is a status, not a raise)."""
    study_dir, params, rate = task
    try:
        study = sim_study(root, study_dir)
        status, metrics = score_in_simulator(study, [json.loads(params)], dict(calibration),
                                             None if rate is None else [rate])[0]
    except Exception as e:  # noqa: BLE001 - one configuration the simulator cannot run is one row that says so
        return {"status": f"error: {type(e).__name__}: {e}"}
    keep = set(TABLE_METRICS) | set(fidelity_metrics(study))
    return {"status": status, **{m: v for m in keep if (v := finite_float(metrics.get(m))) is not None}}


def sequential(root: str) -> Simulate:
    """:data:`Simulate` in this process, one task after another."""
    return lambda tasks, calibration: [simulate_task(root, t, calibration) for t in tasks]


# ---------------------------------------------------------------- fit and predict
def fit_units(root: str, trials: Sequence[RecordedTrial]) -> tuple[list[Task], list[dict]]:
    """What the calibration is fitted to, as the fidelity search fits it: a capacity trial's levels
    nearest its capacity (:func:`fit_levels`) at their rates, a fixed-rate trial's own metrics."""
    tasks, measured = [], []
    for t in trials:
        study = sim_study(root, t.study_dir)
        if t.capacity:
            for lv in fit_levels(study, t.levels):
                tasks.append((t.study_dir, t.params, lv["rate"]))
                measured.append(lv)
        else:
            tasks.append((t.study_dir, t.params, None))
            measured.append({m: t.row.get(m) for m in fidelity_metrics(study)})
    return tasks, measured


def fit(root: str, trials: Sequence[RecordedTrial], simulate: Simulate,
        iterations: int = fm.FIT_ITERATIONS) -> tuple[dict[str, float], Optional[float], int]:
    """The calibration fitted to ``trials`` (from none), the fit's RMS log error and how many points it had."""
    if not trials:
        return fm.calibration(np.zeros(len(fm.CAL_FIELDS))), None, 0
    tasks, measured = fit_units(root, trials)
    metrics = sorted({m for lv in measured for m in lv if m != "rate"})
    theta, rms = fm.fit_calibration(lambda th: simulate(tasks, fm.calibration(th)), measured, metrics,
                                    np.zeros(len(fm.CAL_FIELDS)), iterations)
    return fm.calibration(theta), rms, len(tasks)


def _ran(trial: RecordedTrial) -> list[tuple[dict, Optional[str], str]]:
    """The trial's load levels that ran to the end, each with its mark (overloaded, harness-bound)."""
    ran = [lv for lv in trial.levels if not is_set(lv.get("stopped_early")) and finite_float(lv.get("rate"))]
    ttfts = [v for lv in ran if (v := finite_float(lv.get("ttft_p50_ms")))]
    if not ttfts:
        return []
    return [(lv, *level_mark({**lv, "ttft_p50_ms": finite_float(lv.get("ttft_p50_ms")) or np.inf}, min(ttfts)))
            for lv in ran]


def prediction_rows(root: str, trial: RecordedTrial, fold: Fold, calibration: Mapping[str, float],
                    simulate: Simulate) -> list[dict]:
    """One row per compared number of ``trial`` under ``calibration``: the trial's capacity, or a
    fixed-rate trial's metrics (level -1), and each level's metrics at the level's rate."""
    levels = _ran(trial) if trial.capacity else []
    tasks = [(trial.study_dir, trial.params, None)] + [(trial.study_dir, trial.params, float(lv["rate"]))
                                                       for lv, _, _ in levels]
    sims = simulate(tasks, calibration)
    base = {"scheme": fold.scheme, "trained_on": ", ".join(fold.trained_on), "gpu": trial.gpu,
            "dataset": trial.dataset, "study": trial.study_dir, "trial_id": trial.trial_id, "config": trial.config,
            "params_json": trial.params, "objective": trial.objective, "maximize": trial.maximize,
            "margin": trial.margin, "calibration_json": json.dumps(dict(calibration), sort_keys=True)}
    at_trial = ["capacity_rps"] if trial.capacity else [m for m in TABLE_METRICS if m != "capacity_rps"]
    at_trial += [m for m in study_metrics(sim_study(root, trial.study_dir))[:1] if m not in at_trial]
    censored = None
    if trial.capacity and levels and all(is_set(lv.get("slo_met")) for lv, _, _ in levels):
        censored = "every level measured met the SLOs: the capacity is a lower bound"
    rows = [_row(base, -1, None, m, trial.row, sims[0], censored if m == "capacity_rps" else None)
            for m in at_trial]
    for (lv, mark, why), sim in zip(levels, sims[1:]):
        for m in TABLE_METRICS[1:]:
            waits = mark is not None and m in WAIT_METRICS
            rows.append(_row(base, int(lv["level"]), float(lv["rate"]), m, lv, sim, f"{mark}: {why}" if waits else None))
    return rows


def _row(base: dict, level: int, rate: Optional[float], metric: str, source: Mapping[str, Any], sim: dict,
         not_scored: Optional[str]) -> dict:
    """``metric`` measured (in ``source``, a trial's row or a level's, with its interval where it has one)
    against the simulation ``sim``."""
    y, p = finite_float(source.get(metric)), finite_float(sim.get(metric))
    why = not_scored
    if why is None and y is None:
        why = "not measured"
    elif why is None and y <= 0:
        why = f"measured {y:g}: below every level measured"
    elif why is None and p is None:
        why = f"the simulator: {sim.get('status')}"
    return {**base, "level": level, "rate": rate, "metric": metric, "measured": y,
            "measured_low": finite_float(source.get(f"{metric}_low")),
            "measured_high": finite_float(source.get(f"{metric}_high")), "predicted": p,
            "scored": why is None, "not_scored": why or "", "sim_status": str(sim.get("status"))}


# ---------------------------------------------------------------- folds
def folds(trials: Sequence[RecordedTrial]) -> list[Fold]:
    """Every fold of every scheme: shipped and other-gpu per GPU, leave-one-out per dataset."""
    by_gpu: dict[str, list[str]] = {}
    for t in trials:
        by_gpu.setdefault(t.gpu, [])
        if t.dataset not in by_gpu[t.gpu]:
            by_gpu[t.gpu].append(t.dataset)
    out = []
    for gpu, datasets in sorted(by_gpu.items()):
        others = tuple(d for g, ds in sorted(by_gpu.items()) if g != gpu for d in ds)
        out.append(Fold(SHIPPED, gpu, tuple(datasets), ()))
        out += [Fold(LEAVE_ONE_OUT, gpu, (d,), tuple(x for x in datasets if x != d)) for d in datasets]
        if others:
            out.append(Fold(OTHER_GPU, gpu, tuple(datasets), others))
    return out


def run_fold(root: str, fold: Fold, trials: Sequence[RecordedTrial], simulate: Simulate,
             iterations: int = fm.FIT_ITERATIONS) -> tuple[list[dict], dict]:
    """The fold's calibration (fitted on its training datasets) and its held-out trials' rows."""
    train = [t for t in trials if t.dataset in fold.trained_on]
    calibration, rms, points = fit(root, train, simulate, iterations)
    rows = [r for t in trials if t.dataset in fold.held_out
            for r in prediction_rows(root, t, fold, calibration, simulate)]
    record = {"scheme": fold.scheme, "gpu": fold.gpu, "held_out": ", ".join(fold.held_out),
              "trained_on": ", ".join(fold.trained_on), "fit_points": points, "fit_rms_log_error": rms,
              "iterations": iterations if train else 0, **calibration}
    return rows, record
