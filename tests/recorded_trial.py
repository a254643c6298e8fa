"""A trial run the way a study's trial actor runs it: execute, judge, build the row."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.results.rows import trial_row
from orchestrator.trial import execute_trial, judge_result
from orchestrator.trial_result import TrialResult


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


def run_trial(study, params, *, trial_id, trial_number, ctx, engine=None, measurement=0) -> RecordedTrial:
    """``execute_trial`` + the judge + the row, as ``orchestrator.search.tune.tune_trainable`` does."""
    result = execute_trial(study, params, trial_id=trial_id, trial_number=trial_number, ctx=ctx, engine=engine,
                           measurement=measurement)
    return RecordedTrial(result, trial_row(study, result, judge_result(study, result)))
