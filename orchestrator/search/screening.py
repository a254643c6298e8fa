"""Proposals screened by the pre-flight before they take a trial.

A configuration the pre-flight model says cannot start (weights that do not fit, a KV
cache below one sequence, arguments vLLM refuses) costs nothing to know about: it is told
to the sampler as infeasible, with its constraint values, recorded as a ``pruned`` row
with the reason, shown in the progress, and the sampler is asked again. It takes no Tune
trial, no GPU and no budget. :class:`PreflightScreen` is this screen as a part of the search
(:mod:`orchestrator.search.parts`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

from orchestrator.failures import Failure, FailureKind, TrialStatus
from orchestrator.search import feasibility
from orchestrator.search.optuna_search import SamplerReport, tell_report
from orchestrator.search.parts import SearchPart
from orchestrator.search.row import trial_row
from orchestrator.search.trial_plan import judge_result
from orchestrator.study.spec import Study
from orchestrator.trial.result import TrialResult


class PreflightScreen(SearchPart):
    """The pre-flight as a part of the search: :meth:`turned_away` is True when the configuration
    cannot start (told, recorded and shown here). A class: Tune pickles its searcher."""

    def __init__(self, study: Study, engine, run_id: str, sink, printer, *, cluster_units: Optional[int] = None,
                 units_per_node: Optional[int] = None):
        self.study, self.engine, self.run_id, self.sink, self.printer = study, engine, run_id, sink, printer
        self.cluster_units, self.units_per_node = cluster_units, units_per_node

    def turned_away(self, trial, params) -> bool:
        # deferred: ray takes ~0.3 s to import; validate/show load this module
        import ray

        study = self.study
        try:
            args = self.engine.resolve(self.study.engine_args(params))
        except (ValueError, TypeError):
            return False  # the trial reports arguments that cannot even be built, with its own message
        verdict = feasibility.check(study, args, cluster_units=self.cluster_units, units_per_node=self.units_per_node)
        if verdict.ok:
            return False
        now = datetime.now(timezone.utc)
        result = TrialResult(run_id=self.run_id, trial_id=f"{self.run_id}-{trial.number:04d}",
                             trial_number=trial.number, params=dict(params), args=args, started_at=now,
                             finished_at=now, status=TrialStatus.PRUNED,
                             failure=Failure(FailureKind.PREFLIGHT, f"[{verdict.kind.value}] {verdict.reason}"))
        judgement = judge_result(study, result)
        row = trial_row(study, result, judgement)
        ray.get(self.sink.write.remote(row, None))  # recorded before the sampler is told: the rows are the record
        tell_report(trial.study, trial, SamplerReport.of(judgement, row["status"]))
        self.printer.screened(row, params)
        return True


def trimmed_space(study: Study, drop: dict, storage, ostudy_name: str):
    """The space the sampler searches: the study's, without values the pre-flight proved never start.

    A parameter is only trimmed where the Optuna study has no trial with its full choices
    (an earlier run that did not trim): Optuna refuses a categorical's choices changing
    within one study.
    """
    # deferred: optuna is slow to import; validate/show load this module
    import optuna

    if not drop:
        return study.space
    try:
        trials = optuna.load_study(study_name=ostudy_name, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # no study yet
        trials = []
    trimmed = study.space.without(drop)
    keep = {}
    for name, values in drop.items():
        choices = getattr(trimmed.params.get(name), "choices", None)
        seen = {tuple(t.distributions[name].choices) for t in trials if name in t.distributions}
        if choices is not None and seen <= {tuple(choices)}:
            keep[name] = values
    return study.space.without(keep)
