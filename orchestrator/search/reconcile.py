"""A resumed run's journal brought in line with its rows (the rows are the record).

A trial RUNNING in the Optuna journal whose row exists (the driver died between writing
the row and telling Optuna) is told from its row, through the one judge and
:func:`~orchestrator.search.optuna_search.tell_report`; one without a row (it was running
when the driver died) is marked FAIL and its parameters queued again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.search.optuna_search import SamplerReport, tell_report
from orchestrator.search.resume import INTERRUPTED_ATTR
from orchestrator.study.judge import judge_row


@dataclass(frozen=True)
class Reconciled:
    """What the journal/row check did at start-up."""

    told_from_rows: list[int] = field(default_factory=list)  # trial numbers
    retried: list[int] = field(default_factory=list)
    orphan_request_files: int = 0


def reconcile(study, storage, ostudy_name: str, rows) -> Reconciled:
    """Bring the journal in line with the rows (see the module doc); ``rows``: the study's trials frame."""
    # deferred: optuna is slow to import; validate/show load this module
    import optuna
    from optuna.trial import TrialState

    try:
        ostudy = optuna.load_study(study_name=ostudy_name, storage=storage)
    except KeyError:
        return Reconciled()
    by_number: dict[int, dict[str, Any]] = {}
    if len(rows) and "trial_number" in rows.columns:
        mine = rows[rows["study_fingerprint"] == study.fingerprint()] if "study_fingerprint" in rows else rows
        for rec in mine.to_dict("records"):
            clean = {k: (None if isinstance(v, float) and v != v else v) for k, v in rec.items()}  # NaN -> None
            by_number[int(rec["trial_number"])] = clean
    told, retried = [], []
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        row = by_number.get(t.number)
        if row is not None:
            trial = optuna.trial.Trial(ostudy, t._trial_id)  # noqa: SLF001 - tell needs the live trial
            tell_report(ostudy, trial, SamplerReport.of(judge_row(study, row), row.get("status")))
            told.append(t.number)
            continue
        storage.set_trial_system_attr(t._trial_id, INTERRUPTED_ATTR, time.time())  # noqa: SLF001
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # noqa: SLF001 - no public API
        if t.params:
            ostudy.enqueue_trial(t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False)
        retried.append(t.number)
    return Reconciled(told, retried)
