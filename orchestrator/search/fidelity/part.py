"""``search.fidelity: sim`` as a part of the search (:mod:`orchestrator.search.parts`).

Before each ask of the sampler the fidelity search's next pick goes on Optuna's queue (a trial
queued already, a retry or an initial point, goes first); when it has no pick its
:attr:`~orchestrator.search.fidelity.search.FidelitySearch.stop_reason` stops the search. Every
trial carries the prediction it was picked on, and every real result fits the calibration again.
:class:`PredictionWriter` writes the simulator's scores through the run's writer.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from orchestrator.failures import TrialStatus
from orchestrator.search.fidelity.search import MEASURED_KEY, PICK_ATTR, PREDICTION_KEY, FidelitySearch
from orchestrator.search.parts import Outcome, SearchPart, waiting

log = logging.getLogger(__name__)


class FidelityPart(SearchPart):
    """The fidelity search picks every real trial (see the module's text)."""

    def __init__(self, search: FidelitySearch):
        self.search = search

    @property
    def stop_reason(self):  # type: ignore[override] - the search's own, set by its last pick
        return self.search.stop_reason

    def queue(self, ostudy, pending) -> bool:
        if waiting(ostudy):
            return True
        pick = self.search.next_pick(pending)
        if pick is None:
            return False
        ostudy.enqueue_trial(pick.params, user_attrs={PICK_ATTR: pick.reason})
        return True

    def started(self, trial, params) -> dict[str, Any]:
        return {PREDICTION_KEY: json.dumps(self.search.prediction_for(params), default=str)}

    def observe(self, params, outcome: Outcome) -> None:
        if outcome.screened:  # a pick that cannot start is not picked again
            self.search.observe(params, TrialStatus.PRUNED.value, {}, refit=False)
            return
        measured = json.loads(outcome.result.get(MEASURED_KEY) or "{}")
        try:
            self.search.observe(params, measured.pop("status", TrialStatus.ERROR.value), measured,
                                cluster_idle=outcome.idle)
        except Exception as e:  # noqa: BLE001 - raised here, Tune leaves the trial half-stopped
            log.warning("fidelity sim: trial %s not taken into the calibration: %s", outcome.trial_id, e)

    def observe_rows(self, trials, levels) -> None:
        self.search.observe_rows(trials, levels)


class PredictionWriter:
    """Writes the simulator's scores through the run's writer (picklable, as Tune's searcher must be)."""

    def __init__(self, sink, run_id: str):
        self.sink, self.run_id = sink, run_id

    def __call__(self, table) -> None:
        # deferred: ray takes ~0.3 s to import; the proposal loop's tests load this module without it
        import ray

        ray.get(self.sink.write_predictions.remote(self.run_id, table))
