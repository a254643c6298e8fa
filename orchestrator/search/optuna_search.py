"""Proposing configurations and telling results: the one path between trials and Optuna.

:func:`propose` is the only proposal loop: Tune's searcher (:func:`searcher_class`), tests
and benchmarks all call it. Samplers propose a finished configuration again in small
discrete spaces (TPE especially); measuring it again would spend a trial on a known
answer (docs/benchmarks.md), so a repeat is answered from the earlier trial and a new
proposal asked for. :func:`tell_report` is the only way a measured trial reaches Optuna,
live or on resume: its :class:`SamplerReport` is made from the judge's verdict
(:func:`orchestrator.study.judge.judge`), constraint values first (so constrained samplers learn
where configurations cannot start or miss an SLO), then the values or a FAIL.

Tune carries a trial's report from the trial actor to the searcher as one JSON string
(:meth:`SamplerReport.to_tune`); Tune flattens nested results, so nothing else is encoded.
A trial whose row was not written is not told at all: it stays RUNNING in the journal and
the next start retries it.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from orchestrator.failures import TrialStatus
from orchestrator.search.fidelity.search import MEASURED_KEY, PICK_ATTR, PREDICTION_KEY, FidelitySearch
from orchestrator.search.racing import REMEASURE_ATTR, REMEASURE_KEY
from orchestrator.search.stages import DUPLICATE_ATTR, StagedSearch, enqueue_stage

log = logging.getLogger(__name__)

TRIAL_NUMBER_KEY = "__trial_number"  # in a trial's config: its Optuna trial number (names its rows)
REPORT_KEY = "sampler_report"  # in a Tune result: the SamplerReport, as JSON
ROW_KEY = "tid"  # in a Tune result: the trial id of the row written (Tune owns "trial_id")
# A proposal equal to a finished trial is answered from that trial and proposed again, this often;
# after MODEL_REPROPOSALS tries by the study's sampler the rest are random (a model that keeps
# proposing a known point is sure of it; the unseen points of a small space are few).
MAX_REPROPOSALS = 20
MODEL_REPROPOSALS = 3
# Proposals the pre-flight may turn away in a row before one goes to a trial anyway (where the
# trial's own pre-flight prunes it): a bound on the loop, not a budget.
MAX_SCREENED = 500


@dataclass(frozen=True)
class SamplerReport:
    """What Optuna is told about one trial."""

    values: tuple[float, ...]
    constraints: dict[str, float] = field(default_factory=dict)
    failed: bool = False  # the orchestrator failed, not the configuration: the sampler ignores it
    write_error: Optional[str] = None  # the row could not be written: not told, the study stops

    @classmethod
    def of(cls, judgement, status: str) -> "SamplerReport":
        return cls(tuple(judgement.optuna_values()), judgement.optuna_constraints(), failed=status == TrialStatus.ERROR)

    def to_tune(self) -> str:
        return json.dumps({"values": list(self.values), "constraints": self.constraints, "failed": self.failed,
                           "write_error": self.write_error})

    @classmethod
    def from_tune(cls, result: Optional[dict]) -> Optional["SamplerReport"]:
        if not result or not result.get(REPORT_KEY):
            return None
        d = json.loads(result[REPORT_KEY])
        return cls(tuple(d["values"]), d["constraints"], d["failed"], d.get("write_error"))


def tell_report(ostudy, trial, report: SamplerReport) -> None:
    """Tell Optuna a measured trial: constraints first (those not set yet), then values or FAIL."""
    # deferred: optuna is slow to import; validate/show load this module
    from optuna.trial import TrialState

    have = trial.storage.get_trial(trial._trial_id).constraints  # noqa: SLF001 - live trials hide them
    for k, v in report.constraints.items():
        if k not in have:
            trial.set_constraint(k, v)
    if report.failed:
        tell(ostudy, trial, state=TrialState.FAIL)
    else:
        tell(ostudy, trial, list(report.values))


def tell(ostudy, trial, values=None, state=None) -> None:
    """``ostudy.tell`` that survives the grid sampler's end: BruteForceSampler calls
    ``study.stop()`` after the last grid point, which raises outside ``optimize`` (the trial
    is stored before it does)."""
    try:
        ostudy.tell(trial, values, state=state)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise


def _waiting(ostudy) -> bool:
    """A trial is queued (a retry, an initial point, a racing trial): it goes first."""
    # deferred: optuna is slow to import; validate/show load this module
    from optuna.trial import TrialState

    return any(t.state == TrialState.WAITING for t in ostudy.get_trials(deepcopy=False))


def grid_exhausted(ostudy, space) -> bool:
    """Every grid point has been measured (grid sampler: nothing new left to propose)."""
    # deferred: optuna is slow to import; validate/show load this module
    from optuna.samplers import BruteForceSampler
    from optuna.trial import TrialState

    if not isinstance(ostudy.sampler, BruteForceSampler):
        return False
    seen = {tuple(sorted(t.params.items())) for t in ostudy.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))}
    return len(seen) >= space.grid_size()


def queued_on_purpose(trial) -> bool:
    """A trial popped from the queue as given (warm start, initial point, retry, nightly re-measure):
    run it even if it repeats a configuration."""
    attrs = trial.storage.get_trial_system_attrs(trial._trial_id)  # noqa: SLF001 - live trials hide them
    return "fixed_params" in attrs and "stage" not in trial.user_attrs


def find_duplicate(ostudy, trial) -> Optional[Any]:
    """A finished trial with exactly ``trial``'s parameters (its result is already known)."""
    # deferred: optuna is slow to import; validate/show load this module
    from optuna.trial import TrialState

    params = trial.params
    for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number != trial.number and t.params == params:
            return t
    return None


def tell_duplicate(ostudy, trial, original) -> None:
    """Answer a repeated proposal with the earlier result: the sampler sees it, nothing is measured."""
    for k, v in original.constraints.items():
        trial.set_constraint(k, v)
    trial.set_user_attr(DUPLICATE_ATTR, original.number)
    tell(ostudy, trial, original.values)


@contextmanager
def proposing_with(ostudy, attempt: int):
    """The study's own sampler for the first proposals of a trial, then a random one."""
    if attempt < MODEL_REPROPOSALS:
        yield
        return
    # deferred: optuna is slow to import; validate/show load this module
    import optuna

    own = ostudy.sampler
    ostudy.sampler = optuna.samplers.RandomSampler(seed=len(ostudy.get_trials(deepcopy=False)) * 7919 + attempt)
    try:
        yield
    finally:
        ostudy.sampler = own


def propose(ostudy, ask: Callable[[], Optional[tuple[Any, dict]]], *, staged: Optional[StagedSearch] = None,
            discard: Callable[[Any], None] = lambda trial: None,
            screen: Optional[Callable[[Any, dict], bool]] = None) -> Optional[tuple[Any, dict]]:
    """The next configuration to measure: ``(optuna trial, params)``, or None to ask again later.

    ``ask()`` asks the sampler once (``ostudy.ask()`` + the space's suggestions, or Tune's
    ``OptunaSearch.suggest``). A repeat of a finished trial is told that trial's result, handed
    to ``discard``, and proposed again. ``screen(trial, params)`` returns True for a proposal
    that cannot start (the pre-flight): it has told the sampler and recorded the row itself;
    the proposal is discarded and the sampler asked again, so it takes no trial and no budget.
    After :data:`MODEL_REPROPOSALS` tries the proposals are random. A staged search queues the
    held parameters first and returns None while it must wait for running trials.
    """
    duplicates = screened = 0
    while True:
        if staged is not None and not enqueue_stage(ostudy, staged):
            return None
        with proposing_with(ostudy, duplicates + screened):
            got = ask()
        if got is None:
            return None
        trial, params = got
        original = None if queued_on_purpose(trial) else find_duplicate(ostudy, trial)
        if original is not None and duplicates < MAX_REPROPOSALS:
            tell_duplicate(ostudy, trial, original)
            discard(trial)
            duplicates += 1
            continue
        if screen is not None and screened < MAX_SCREENED and screen(trial, params):
            discard(trial)
            screened += 1
            continue
        return trial, params


def fidelity_ask(ostudy, fidelity: FidelitySearch, ask: Callable[[], Any],
                 pending: Callable[[], Sequence[Mapping[str, Any]]] = lambda: ()) -> Callable[[], Any]:
    """An ``ask`` for :func:`propose` that queues the fidelity search's next pick first
    (``search.fidelity: sim``; a trial queued already, a retry or an initial point, goes first).
    None when that search stops (:attr:`FidelitySearch.stop_reason`)."""

    def ask_pick():
        # deferred: optuna is slow to import; validate/show load this module
        from optuna.trial import TrialState

        if not any(t.state == TrialState.WAITING for t in ostudy.get_trials(deepcopy=False)):
            pick = fidelity.next_pick(pending())
            if pick is None:
                return None
            ostudy.enqueue_trial(pick.params, user_attrs={PICK_ATTR: pick.reason})
        return ask()

    return ask_pick


def ask_fidelity(ostudy, space, fidelity: FidelitySearch):
    """:func:`fidelity_ask` through :func:`propose` with Optuna's own ``ask`` (no Tune):
    ``(trial, params)``, or None when the search stops."""

    def ask():
        trial = ostudy.ask()
        return trial, space.suggest(trial)

    return propose(ostudy, fidelity_ask(ostudy, fidelity, ask))


def ask_distinct(ostudy, space, staged: Optional[StagedSearch] = None):
    """:func:`propose` with Optuna's own ``ask`` (no Tune): ``(trial, params)`` or None."""

    def ask():
        trial = ostudy.ask()
        return trial, space.suggest(trial)

    return propose(ostudy, ask, staged=staged)


# ------------------------------------------------------------------ Tune's searcher
def searcher_class():
    # deferred: optuna and ray.tune (~0.7 s) are slow to import; validate/show load this module
    from optuna.trial import TrialState
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    class ConstrainedOptunaSearch(OptunaSearch):
        """OptunaSearch whose proposals go through :func:`propose` and whose results through
        :func:`tell_report`; the Optuna trial number goes down to the trial (it names its rows)."""

        def __init__(self, *args, staged: Optional[StagedSearch] = None,
                     screen: Optional[Callable[[Any, dict], bool]] = None, fidelity=None, racer=None, **kwargs):
            super().__init__(*args, **kwargs)
            self._staged = staged
            self._screen = screen
            self._fidelity = fidelity  # search.fidelity sim: a FidelitySearch picks every trial
            self._racer = racer  # search.remeasure: the last trials measure the leading contenders again
            self._picked: dict[str, dict] = {}  # Tune trial id -> parameters, until its result
            self._started: dict[str, dict] = {}  # Tune trial id -> parameters (racing), until its result
            self._study_space = getattr(kwargs["space"], "__self__", None)  # the SearchSpace of space.suggest

        def save(self, checkpoint_path: str) -> None:
            """Nothing: the Optuna journal is the search's memory, and Tune's own experiment restore is not
            used (search/resume.py). Tune's searcher pickled itself at every checkpoint instead: the
            study's trials each time, and Optuna's NSGA-II sampler, which holds a lock, ended every
            ``sampler: nsga2`` run in a traceback."""

        def _race(self, stopping: bool = False) -> bool:
            """Queue the next racing trial, if it is racing's turn (or the search is ``stopping``)."""
            if self._racer is None:
                return False
            if _waiting(self._ot_study):
                return True  # queued already: it goes first
            race = self._racer.next_remeasure(stopping)
            if race is None:
                return False
            params, k = race
            self._ot_study.enqueue_trial(params, user_attrs={REMEASURE_ATTR: k}, skip_if_exists=False)
            return True

        def suggest(self, trial_id: str):
            if trial_id not in self._ot_trials and grid_exhausted(self._ot_study, self._study_space) \
                    and not self._race(stopping=True):
                return Searcher.FINISHED  # the grid is done: end the run early
            if trial_id not in self._ot_trials and not _waiting(self._ot_study):
                self._race()
            got = self._propose(trial_id)
            if got is None and self._fidelity is not None and self._fidelity.stop_reason is not None \
                    and self._race(stopping=True):
                got = self._propose(trial_id)
            if got is None:
                if self._fidelity is not None and self._fidelity.stop_reason is not None and not self._picked:
                    return Searcher.FINISHED  # nothing left worth a real trial
                return None  # Tune asks again later
            trial, config = got
            extra = {TRIAL_NUMBER_KEY: trial.number}
            measurement = trial.user_attrs.get(REMEASURE_ATTR)
            if measurement:
                extra[REMEASURE_KEY] = int(measurement)
            if self._racer is not None:
                self._racer.trial_started(config)
                self._started[trial_id] = dict(config)
            if self._fidelity is None:
                return {**config, **extra}
            self._picked[trial_id] = dict(config)
            predicted = json.dumps(self._fidelity.prediction_for(config), default=str)
            return {**config, **extra, PREDICTION_KEY: predicted}

        def _propose(self, trial_id: str):

            def ask():
                config = OptunaSearch.suggest(self, trial_id)
                return None if config is None else (self._ot_trials[trial_id], config)

            fidelity = self._fidelity
            if fidelity is not None:
                ask = fidelity_ask(self._ot_study, fidelity, ask, pending=lambda: list(self._picked.values()))
            screen = self._screen
            if fidelity is not None and screen is not None:
                def screen(trial, params, _screen=self._screen):  # a pick that cannot start is not picked again
                    turned_away = _screen(trial, params)
                    if turned_away:
                        fidelity.observe(params, TrialStatus.PRUNED.value, {}, refit=False)
                    return turned_away
            return propose(self._ot_study, ask, staged=self._staged, screen=screen,
                           discard=lambda trial: self._ot_trials.pop(trial_id, None))

        def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False):
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is None or trial_id in self._completed_trials:
                return
            self._completed_trials.add(trial_id)
            params = self._picked.pop(trial_id, None)
            started = self._started.pop(trial_id, None)
            if error:
                # The trial's process was lost for good (its row says so): the configuration
                # is not to blame, so the sampler ignores it.
                tell(self._ot_study, ot_trial, state=TrialState.FAIL)
                return
            report = SamplerReport.from_tune(result)
            if report is None or report.write_error or ROW_KEY not in result:
                return  # no row: leave the trial RUNNING in the journal; the next start retries it
            tell_report(self._ot_study, ot_trial, report)
            if self._racer is not None and started is not None:
                metric = self._racer.metric
                self._racer.observe(started, bool(result.get("feasible")), result.get(metric),
                                    result.get(f"{metric}_low"), result.get(f"{metric}_high"),
                                    result.get("draws_json"))
            if self._fidelity is not None and params is not None:
                measured = json.loads(result.get(MEASURED_KEY) or "{}")
                try:
                    self._fidelity.observe(params, measured.pop("status", TrialStatus.ERROR.value), measured,
                                           cluster_idle=not self._picked)  # no other trial in flight
                except Exception as e:  # noqa: BLE001 - raised here, Tune leaves the trial half-stopped
                    log.warning("fidelity sim: trial %s not taken into the calibration: %s", trial_id, e)

    return ConstrainedOptunaSearch
