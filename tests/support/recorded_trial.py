"""A trial run the way a study's trial actor runs it: through ``measure_trial``, the steps
``orchestrator.search.tune.tune_trainable`` takes before it writes the row (execute, judge, the
row, the fidelity search's prediction columns)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.search.tune import measure_trial
from orchestrator.trial.result import TrialResult


@dataclass(frozen=True)
class RecordedTrial:
    result: TrialResult
    row: dict

    @property
    def records(self) -> list:
        return list(self.result.records)

    @property
    def levels(self) -> list:
        return list(self.result.levels)


def run_trial(study, params, *, trial_id, trial_number, ctx, engine=None, measurement=0,
              prediction=None) -> RecordedTrial:
    """One trial as the trial actor measures it (``prediction``: what ``search.fidelity: sim`` picked it on)."""
    trial = measure_trial(study, params, trial_id=trial_id, trial_number=trial_number, ctx=ctx, engine=engine,
                          measurement=measurement, prediction=prediction)
    return RecordedTrial(trial.result, trial.row)
