"""Proposing configurations and telling results: the one path between trials and Optuna.

:func:`propose` is the only proposal loop: Tune's searcher (:func:`searcher_class`), tests
and benchmarks all call it. What a run adds around the sampler (racing, staged search, the
pre-flight screen, the fidelity search, the grid's end) comes as a list of parts behind one
interface (:mod:`orchestrator.search.parts`): the loop and the searcher call each part's hooks in
turn and know none of them by name. Samplers propose a finished configuration again in small
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from orchestrator.failures import TrialStatus
from orchestrator.search import parts as search_parts
from orchestrator.search.fidelity.part import FidelityPart
from orchestrator.search.fidelity.search import FidelitySearch
from orchestrator.search.parts import Outcome, SearchPart
from orchestrator.search.stages import DUPLICATE_ATTR, StagedSearch

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


def propose(ostudy, ask: Callable[[], Optional[tuple[Any, dict]]], parts: Sequence[SearchPart] = (), *,
            pending: Sequence[Mapping[str, Any]] = (),
            discard: Callable[[Any], None] = lambda trial: None) -> Optional[tuple[Any, dict]]:
    """The next configuration to measure: ``(optuna trial, params)``, or None to ask again later.

    ``ask()`` asks the sampler once (``ostudy.ask()`` + the space's suggestions, or Tune's
    ``OptunaSearch.suggest``). Before each ask the search's ``parts`` queue what they want measured
    (:func:`orchestrator.search.parts.queue`; ``pending``: the parameters of trials in flight); a
    part that says wait, or stop, makes this None. A repeat of a finished trial is told that trial's
    result, handed to ``discard``, and proposed again. A proposal a part turns away (the pre-flight:
    it cannot start) has been told to the sampler and recorded by that part; every part observes
    it, it is discarded and the sampler asked again, so it takes no trial and no budget. After
    :data:`MODEL_REPROPOSALS` tries the proposals are random.
    """
    duplicates = screened = 0
    while True:
        if not search_parts.queue(parts, ostudy, pending):
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
        if screened < MAX_SCREENED and search_parts.turned_away(parts, trial, params):
            search_parts.observe(parts, params, Outcome(screened=True))
            discard(trial)
            screened += 1
            continue
        return trial, params


def _ask_optuna(ostudy, space) -> Callable[[], tuple[Any, dict]]:
    """Optuna's own ``ask`` and the space's suggestions (no Tune)."""

    def ask():
        trial = ostudy.ask()
        return trial, space.suggest(trial)

    return ask


def ask_fidelity(ostudy, space, fidelity: FidelitySearch):
    """:func:`propose` with the fidelity search as its one part and Optuna's own ``ask`` (no Tune):
    ``(trial, params)``, or None when the search stops."""
    return propose(ostudy, _ask_optuna(ostudy, space), [FidelityPart(fidelity)])


def ask_distinct(ostudy, space, staged: Optional[StagedSearch] = None):
    """:func:`propose` with Optuna's own ``ask`` (no Tune): ``(trial, params)`` or None."""
    return propose(ostudy, _ask_optuna(ostudy, space), [staged] if staged is not None else [])


# ------------------------------------------------------------------ Tune's searcher
def searcher_class():
    # deferred: optuna and ray.tune (~0.7 s) are slow to import; validate/show load this module
    from optuna.trial import TrialState
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    class ConstrainedOptunaSearch(OptunaSearch):
        """OptunaSearch whose proposals go through :func:`propose` and the search's parts
        (:mod:`orchestrator.search.parts`), and whose results through :func:`tell_report`; the Optuna
        trial number goes down to the trial (it names its rows)."""

        def __init__(self, *args, parts: Sequence[SearchPart] = (), **kwargs):
            super().__init__(*args, **kwargs)
            self._parts = tuple(parts)
            self._running: dict[str, dict] = {}  # Tune trial id -> its parameters, until its result

        def save(self, checkpoint_path: str) -> None:
            """Nothing: the Optuna journal is the search's memory, and Tune's own experiment restore is not
            used (search/resume.py). Tune's searcher pickled itself at every checkpoint instead: the
            study's trials each time, and Optuna's NSGA-II sampler, which holds a lock, ended every
            ``sampler: nsga2`` run in a traceback."""

        def suggest(self, trial_id: str):
            parts, ostudy = self._parts, self._ot_study
            if trial_id not in self._ot_trials and search_parts.finished(parts, ostudy) \
                    and not search_parts.last_call(parts, ostudy):
                return Searcher.FINISHED  # nothing new is left (the grid is done): end the run early
            got = self._propose(trial_id)
            if got is None and search_parts.stop_reason(parts) is not None and search_parts.last_call(parts, ostudy):
                got = self._propose(trial_id)
            if got is None:
                if search_parts.stop_reason(parts) is not None and not self._running:
                    return Searcher.FINISHED  # nothing left worth a real trial
                return None  # Tune asks again later
            trial, config = got
            self._running[trial_id] = dict(config)
            return {**config, TRIAL_NUMBER_KEY: trial.number, **search_parts.started(parts, trial, config)}

        def _propose(self, trial_id: str):

            def ask():
                config = OptunaSearch.suggest(self, trial_id)
                return None if config is None else (self._ot_trials[trial_id], config)

            return propose(self._ot_study, ask, self._parts, pending=list(self._running.values()),
                           discard=lambda trial: self._ot_trials.pop(trial_id, None))

        def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False):
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is None or trial_id in self._completed_trials:
                return
            self._completed_trials.add(trial_id)
            params = self._running.pop(trial_id, None)
            if error:
                # The trial's process was lost for good (its row says so): the configuration
                # is not to blame, so the sampler ignores it.
                tell(self._ot_study, ot_trial, state=TrialState.FAIL)
                return
            report = SamplerReport.from_tune(result)
            if report is None or report.write_error or ROW_KEY not in result:
                return  # no row: leave the trial RUNNING in the journal; the next start retries it
            tell_report(self._ot_study, ot_trial, report)
            if params is not None:
                outcome = Outcome(result, idle=not self._running, trial_id=trial_id)
                search_parts.observe(self._parts, params, outcome)

    return ConstrainedOptunaSearch
