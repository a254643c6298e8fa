"""The Tune side of a study: the trainable every trial runs, the results writer, and Tune's hooks.

A trial actor executes the trial, asks the judge, writes its rows through the run's single
writer (:class:`ResultsSinkActor`) and reports a :class:`SamplerReport` to Tune, which
hands it to the searcher. A result that cannot be written stops the study
(:func:`write_failure_stopper`); a trial whose process is lost for good becomes an
``error`` row (:func:`lost_trial_recorder`). :func:`filter_tune_logs` keeps Tune's log to what
says something to a user.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from orchestrator.failures import TrialStatus, not_recorded, root_message, status_of, trial_lost
from orchestrator.results.levels import levels_to_table
from orchestrator.results.probe_store import ProbeStore
from orchestrator.results.schema import requests_to_table
from orchestrator.results.store import ResultsStore
from orchestrator.search.best_capacity import BEAT_KEY
from orchestrator.search.fidelity.scoring import study_metrics
from orchestrator.search.fidelity.search import (MEASURED_KEY, PREDICTED_KEY, PREDICTION_KEY, fidelity_metrics,
                                                  fit_levels, noise_columns)
from orchestrator.search.optuna_search import REPORT_KEY, ROW_KEY, TRIAL_NUMBER_KEY, SamplerReport
from orchestrator.search.racing import REMEASURE_KEY
from orchestrator.search.row import trial_row
from orchestrator.search.stop_signals import requested as stop_requested
from orchestrator.search.trial_plan import judge_result, run_trial
from orchestrator.study.judge import Judgement
from orchestrator.study.spec import Study
from orchestrator.trial.result import TrialResult
from orchestrator.trial.run import TrialContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasuredTrial:
    """A trial executed, judged and made into its row, not yet written."""

    result: TrialResult
    judgement: Judgement
    row: dict


def measure_trial(study: Study, params: Mapping[str, Any], *, trial_id: str, trial_number: int, ctx: TrialContext,
                  measurement: int = 0, prediction: Optional[Mapping[str, Any]] = None,
                  engine=None, beat_rate: Optional[float] = None) -> MeasuredTrial:
    """Execute, judge, build the row: every trial's steps before its row is written (the trial actor's
    :func:`tune_trainable`, and the tests that run a trial the way it does). ``prediction``: what
    ``search.fidelity: sim`` picked the configuration on, kept next to what was measured."""
    result = run_trial(study, dict(params), trial_id=trial_id, trial_number=trial_number, ctx=ctx,
                       engine=engine, measurement=measurement, beat_rate=beat_rate)
    judgement = judge_result(study, result)
    return MeasuredTrial(result, judgement, trial_row(study, result, judgement, prediction=dict(prediction or {})))


def tune_trainable(config: dict, *, study: Study, ctx: TrialContext) -> None:
    """Runs inside a Tune trial actor: execute, judge, write the rows, report to Tune/Optuna."""
    import ray
    from ray import tune

    number = int(config[TRIAL_NUMBER_KEY])
    params = {k: v for k, v in config.items() if k not in (TRIAL_NUMBER_KEY, PREDICTION_KEY, REMEASURE_KEY, BEAT_KEY)}
    trial_id = f"{ctx.run_id}-{number:04d}"
    trial = measure_trial(study, params, trial_id=trial_id, trial_number=number, ctx=ctx,
                          measurement=int(config.get(REMEASURE_KEY) or 0),
                          prediction=json.loads(config.get(PREDICTION_KEY) or "{}"), beat_rate=config.get(BEAT_KEY))
    result, judgement, row = trial.result, trial.judgement, trial.row
    report = SamplerReport.of(judgement, row["status"])
    if ctx.sink_name:
        try:
            sink = ray.get_actor(ctx.sink_name, namespace=ctx.namespace)
            table = requests_to_table(result.records, study=study.name, run_id=ctx.run_id, trial_id=trial_id)
            levels = None
            if result.levels:  # capacity search: one row per load level
                levels = levels_to_table(list(result.levels), study=study.name, run_id=ctx.run_id,
                                         trial_id=trial_id)
            ray.get(sink.write.remote(row, table, levels))
        except Exception as e:  # noqa: BLE001 - reported, and the driver stops the study
            report = dataclasses.replace(report, write_error=root_message(e))
    tune.report(tune_result(study, row, judgement, report, levels=result.levels))


def tune_result(study: Study, row: dict, judgement: Judgement, report: SamplerReport,
                levels: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """What a trial reports to Tune: the sampler's report, what the progress line shows, and
    (``search.fidelity: sim``) what the calibration is fitted to (``levels``, a capacity search's rows) and the
    prediction next to the measurement."""
    out: dict[str, Any] = {o.metric: v for o, v in zip(study.objectives, judgement.optuna_values())}
    for o in study.objectives:  # where each objective's true value lies (the progress line's ties)
        for end in ("low", "high"):
            if row.get(f"{o.metric}_{end}") is not None:
                out[f"{o.metric}_{end}"] = row[f"{o.metric}_{end}"]
    out[REPORT_KEY] = report.to_tune()
    out["status"], out["failure_kind"] = row["status"], row.get("failure_kind") or ""
    if report.write_error is None:
        out[ROW_KEY] = row["trial_id"]
    else:
        lost = not_recorded(report.write_error)
        out["status"], out["failure_kind"] = status_of(lost.kind).value, lost.kind.value
    out["feasible"] = judgement.feasible
    out["harness_bound"] = bool(row.get("harness_bound"))
    if row.get("draws_json"):  # racing compares the leaders by their paired draws
        out["draws_json"] = row["draws_json"]
    if study.search.fidelity == "sim":  # what the searcher fits the simulator's calibration to
        measured = {**{m: row.get(m) for m in fidelity_metrics(study) + noise_columns(study)}, "status": row["status"]}
        if study.capacity is not None:
            measured["levels"] = fit_levels(study, levels)
        out[MEASURED_KEY] = json.dumps(measured, default=str)
        # What the progress line sets against each other: the row's prediction columns and measurements.
        shown = [c for m in study_metrics(study)
                 for c in (m, f"predicted_{m}", f"predicted_{m}_low", f"predicted_{m}_high")]
        out[PREDICTED_KEY] = json.dumps({c: row.get(c) for c in shown}, default=str)
    return out


class ResultsSinkActor:
    """The single writer of a run's Parquet files, on the driver's node."""

    def __init__(self, output: str, study_name: str, param_types: dict[str, str], predicted: tuple[str, ...] = ()):

        self.store = ResultsStore(output, study_name)
        self.param_types = param_types
        self.output, self.study_name = output, study_name
        self.predicted = predicted  # metrics with prediction columns (search.fidelity sim)
        self.closed = False

    def keep_probe(self, probe_set: str, trial_id: str, record: dict, eligible: bool):
        """A trial's probe answers; the baseline's (see orchestrator.results.probe_store)."""

        return ProbeStore(self.output, self.study_name).keep(probe_set, trial_id, record, eligible)

    def probe_baseline(self, probe_set: str):
        """The baseline's probe record, or None while none is claimed."""
        return ProbeStore(self.output, self.study_name).baseline(probe_set)

    def close(self) -> None:
        """The run is stopping: rows are refused from now on (a trial whose engine a stop ended under it
        is not a failure of its configuration; it runs again when the run resumes)."""
        self.closed = True

    def write(self, row: dict, requests_table, levels_table=None) -> None:
        if self.closed:
            raise RuntimeError(f"the run is stopping: trial {row.get('trial_id')} is not recorded and runs again "
                               "when the run resumes")
        extra = {"levels": levels_table} if levels_table is not None else {}
        self.store.write_trial(row, requests_table, param_types=self.param_types, predicted=self.predicted, **extra)

    def write_predictions(self, run_id: str, table) -> None:
        self.store.write_predictions(run_id, table)


# ------------------------------------------------------------------ Tune hooks
def write_failure_stopper():
    from ray.tune import Stopper

    class WriteFailureStopper(Stopper):
        """Stops the whole run at the first result that could not be written (disk full):
        every later trial would be measured for nothing; and at a stop signal
        (:mod:`orchestrator.search.stop_signals`)."""

        def __init__(self):
            self.message: Optional[str] = None

        def __call__(self, trial_id: str, result: dict) -> bool:
            report = SamplerReport.from_tune(result)
            if report is not None and report.write_error and self.message is None:
                self.message = report.write_error
            return self.message is not None or stop_requested() is not None

        def stop_all(self) -> bool:  # also a stop signal's: every trial stops, and Tune's loop
            return self.message is not None or stop_requested() is not None

    return WriteFailureStopper()


def lost_trial_recorder(study: Study, run_id: str, sink_name: str, namespace: str):
    from ray.tune import Callback

    class LostTrialRecorder(Callback):
        """A trial whose process died for good (its node was lost, after ``budget.trial_retries``
        reruns) becomes an ``error`` row, so every trial of the run is classified."""

        def __init__(self):
            self.lost = 0

        def on_trial_error(self, iteration, trials, trial, **info):
            import ray

            config = dict(trial.config or {})
            if TRIAL_NUMBER_KEY not in config:
                return
            number = int(config.pop(TRIAL_NUMBER_KEY))
            config.pop(PREDICTION_KEY, None)
            config.pop(BEAT_KEY, None)
            now = datetime.now(timezone.utc)
            lost = TrialResult(run_id=run_id, trial_id=f"{run_id}-{number:04d}", trial_number=number, params=config,
                               args=None, started_at=now, finished_at=now, status=TrialStatus.ERROR,
                               failure=trial_lost(_error_text(trial)))
            row = trial_row(study, lost)
            self.lost += 1
            try:
                sink = ray.get_actor(sink_name, namespace=namespace)
                ray.get(sink.write.remote(row, None), timeout=60)
            except Exception as e:  # noqa: BLE001 - without a row it is retried on the next start
                log.warning("could not record lost trial %s: %s", row["trial_id"], e)

    return LostTrialRecorder()


def _error_text(trial) -> str:
    try:
        path = trial.error_file
        if path and os.path.isfile(path):
            lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
            return " | ".join(lines[-3:])
    except Exception:  # noqa: BLE001
        pass
    return "the trial's actor died"


class _OneLine(logging.Filter):
    """Tune's experiment-state writer logs a failed save with its traceback (a full disk); the
    study stops with its own message, so the log keeps the error's last line only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()} {record.exc_info[1]}".strip()
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


class _NoTuneResultFiles(logging.Filter):
    """Tune's result grid warns after ``fit`` that no trial has its ``result.json`` or
    ``progress.csv``: the study writes none (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS``) and reads
    its own rows instead, so the warning says nothing to a user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to fetch metrics for")


def filter_tune_logs() -> None:
    """Tune's log lines the study replaces with its own (each filter added once)."""
    for name, kind in (("ray.tune.execution.experiment_state", _OneLine),
                       ("ray.tune.analysis.experiment_analysis", _NoTuneResultFiles)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
