"""A nightly run end to end: queue the previous night's front, run the study, compare, write the verdict.

The comparison itself is pure and lives in :mod:`orchestrator.apps.nightly`; this module is the
run around it (Optuna's queue, :func:`orchestrator.search.driver.run_study`, the results and the
summary file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import pandas as pd

from orchestrator.apps.nightly import (NightlyPolicy, NightlySummary, front_points, previous_run, summarise_night,
                                       write_summary)
from orchestrator.results.definition import write_study_definition
from orchestrator.results.query import load_trials
from orchestrator.results.store import ResultsStore
from orchestrator.search.driver import run_study
from orchestrator.search.state import local_state_dir, optuna_storage, optuna_study_name
from orchestrator.study.spec import Study

__all__ = ["NightlyRun", "queue_first", "run_nightly"]


def queue_first(study: Study, points: Sequence[Mapping[str, Any]]) -> int:
    """Queue ``points`` in the study's Optuna storage so the next run measures them before anything else.

    The run's searcher opens the same storage and study (``load_if_exists``) and asks
    for waiting trials first. Duplicates of earlier trials are kept on purpose:
    re-measuring them is the point.
    """
    if not points:
        return 0
    # deferred: optuna is slow to import; every CLI command loads this module (commands/nightly)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ostudy = optuna.create_study(storage=optuna_storage(local_state_dir(study)), study_name=optuna_study_name(study),
                                 directions=study.directions, load_if_exists=True)
    for p in points:
        ostudy.enqueue_trial(dict(p), skip_if_exists=False)
    return len(points)


@dataclass(frozen=True)
class NightlyRun:
    summary: NightlySummary
    summary_path: str
    study_dir: str


def run_nightly(study: Study, *, policy: NightlyPolicy = NightlyPolicy(), address: Optional[str] = None,
                serve_port: int = 8000, quiet: bool = False) -> NightlyRun:
    """Run tonight's search, compare it with the previous night, write the summary."""
    study_dir = ResultsStore(study.output, study.name).study_path
    write_study_definition(study)
    try:
        earlier = load_trials(study_dir)
    except FileNotFoundError:
        earlier = pd.DataFrame()
    prev_id = previous_run(earlier, study)
    prev_trials = earlier[earlier["run_id"] == prev_id] if prev_id is not None else None
    configs = front_points(prev_trials, study, policy.remeasure_limit(study.budget.trials)) \
        if prev_trials is not None else []
    queue_first(study, configs)
    run = run_study(study, address=address, serve_port=serve_port, resume=False, quiet=quiet)
    current = load_trials(study_dir, run=run.run_id)
    summary = summarise_night(study, run_id=run.run_id, current=current, previous=prev_trials,
                              previous_run_id=prev_id, configs=configs, policy=policy)
    return NightlyRun(summary, write_summary(study_dir, summary), study_dir)
