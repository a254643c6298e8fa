"""How configurations are proposed: the Optuna sampler, staged search, and Tune's searcher.

:func:`make_sampler` builds the sampler the study file names, with defaults tuned by
``benchmarks/search_efficiency.py`` (see docs/benchmarks.md). :class:`StagedSearch`
turns ``search.stages`` into the parameters to hold for the next trial, from the
trials so far (pure; no Ray). :func:`searcher_class` is Tune's ``OptunaSearch`` with
three additions: the Optuna trial number goes down to the trial (it names the
trial's rows), constraint values come back up before ``tell`` (so the sampler learns
where configurations cannot start or miss an SLO), and a trial whose row was not
written is not told at all (it stays RUNNING in the journal and the next start
retries it).
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional, Sequence

TRIAL_NUMBER_KEY = "__trial_number"
CONSTRAINT_PREFIX = "constraint__"
# In a reported result: the trial's row could not be written (the study stops).
WRITE_FAILED_KEY = "__write_failed"
ROW_KEY = "tid"  # present in every result whose row was written
# A proposal equal to a finished trial is answered from that trial and proposed again, this often;
# after MODEL_REPROPOSALS tries by the study's sampler the rest are random (a model that keeps
# proposing a known point is sure of it; the unseen points of a small space are few).
MAX_REPROPOSALS = 20
MODEL_REPROPOSALS = 3
DUPLICATE_ATTR = "duplicate_of"


# ------------------------------------------------------------------ samplers
def sampler_seed(study) -> int:
    return study.search.seed if study.search.seed is not None else study.seed


def default_startup_trials(study) -> int:
    """Random trials before a model-based sampler takes over.

    Measured (docs/benchmarks.md): about one random trial per searched parameter,
    at least 5, is enough for TPE's first split; more only delays the model.
    """
    n = len(study.space.sampled_names())
    return max(5, min(n + 3, max(5, study.budget.trials // 5)))


def make_sampler(study, *, concurrent: Optional[bool] = None):
    """The sampler ``search.sampler`` names, seeded by ``search.seed`` (else the study seed)."""
    import optuna

    s = study.search
    seed = sampler_seed(study)
    if concurrent is None:
        concurrent = study.budget.max_concurrent_trials > 1
    startup = s.n_startup_trials if s.n_startup_trials is not None else default_startup_trials(study)
    if s.sampler == "tpe":
        # multivariate + group: joint densities over parameters that appear together
        # (conditional parameters form their own groups); constant liar keeps parallel
        # workers from proposing the same point.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # group= is "experimental"
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True, group=True,
                                              constant_liar=concurrent)
    if s.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, study.budget.trials // 4)))
    if s.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.sampler == "grid":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            from orchestrator.grid_sampler import GridSampler

            return GridSampler(seed=seed)
    raise ValueError(f"unknown sampler {s.sampler!r}; allowed: tpe, nsga2, gp, random, grid")


# ------------------------------------------------------------------ staged search
@dataclass(frozen=True)
class Stage:
    name: str
    params: tuple[str, ...]
    trials: int




def plan_stages(study) -> list[Stage]:
    """``search.stages`` with every stage's trial count (the last one gets the rest of the budget)."""
    stages = study.search.stages
    planned = sum(st.trials or 0 for st in stages)
    out = []
    for i, st in enumerate(stages):
        trials = st.trials if st.trials is not None else study.budget.trials - planned
        out.append(Stage(st.name or f"stage {i + 1}", tuple(st.params), trials))
    return out


def baseline_values(study) -> dict[str, Any]:
    """What a parameter is held at before its stage: vLLM's own default, moved into the space.

    (A parameter left out of a ``vllm serve`` command gets that default, so "not searched
    yet" means "as vLLM would run it"; where the default is outside the space, its
    nearest value.)
    """
    from orchestrator.engine_args import EngineArgs
    from orchestrator.feasibility import resolve_args
    from orchestrator.warm_start import _DROP, snap_value

    defaults = resolve_args(study, EngineArgs())
    out = {}
    for name in study.space.sampled_names():
        spec = study.space.params[name]
        v = snap_value(spec, getattr(defaults, name, None))
        if v is _DROP:
            v = spec.values()[0]
        out[name] = v
    return out


def best_trial(study, trials: Sequence) -> Optional[Any]:
    """The best finished trial for holding parameters: meets every constraint and is best on
    the first objective; if none meets them, the one closest to meeting them."""
    from optuna.trial import TrialState

    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values]
    if not done:
        return None
    sign = -1.0 if study.objectives[0].resolved_direction == "maximize" else 1.0

    def violation(t) -> float:
        return sum(max(0.0, v) for v in t.constraints.values())

    feasible = [t for t in done if violation(t) <= 0]
    if feasible:
        return min(feasible, key=lambda t: (sign * t.values[0], t.number))
    return min(done, key=lambda t: (violation(t), sign * t.values[0], t.number))


class StagedSearch:
    """Which parameters the next trial holds, and at what (``search.stages``).

    Trials are assigned to stages in order of their number; FAIL and WAITING trials
    (interrupted and queued again) do not count. Stage k searches its parameters, holds
    those of earlier stages at the best trial so far and later ones at
    :func:`baseline_values`. The first trial of a stage waits until the earlier stages'
    trials have finished: their best must be known.
    """

    def __init__(self, study):
        self.study = study
        self.stages = plan_stages(study)
        self.baseline = baseline_values(study)

    def stage_of(self, ordinal: int) -> int:
        """Stage index of the ``ordinal``-th counted trial (0-based); past the plan: the last stage."""
        edge = 0
        for i, st in enumerate(self.stages):
            edge += st.trials
            if ordinal < edge:
                return i
        return len(self.stages) - 1

    def fixed_params(self, trials: Sequence) -> Optional[tuple[int, dict[str, Any]]]:
        """The next trial's stage and the parameters it holds; None: wait for running trials."""
        from optuna.trial import TrialState

        counted = sorted((t for t in trials if t.state in (TrialState.COMPLETE, TrialState.RUNNING,
                                                            TrialState.PRUNED)
                          and DUPLICATE_ATTR not in t.user_attrs), key=lambda t: t.number)
        k = self.stage_of(len(counted))
        running_earlier = any(t.state == TrialState.RUNNING and self.stage_of(i) < k
                              for i, t in enumerate(counted))
        if running_earlier:
            return None
        best = best_trial(self.study, counted)
        fixed: dict[str, Any] = {}
        for i, st in enumerate(self.stages):
            if i == k:
                continue
            for name in st.params:
                held = best.params.get(name) if (best is not None and i < k) else None
                fixed[name] = held if held is not None else self.baseline[name]
        return k, fixed


def enqueue_stage(ostudy, staged: StagedSearch) -> bool:
    """Queue the next trial's held parameters; False if it must wait. A queued (warm start,
    retry) trial goes first as it is."""
    from optuna.trial import TrialState

    trials = ostudy.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return True
    decision = staged.fixed_params(trials)
    if decision is None:
        return False
    k, fixed = decision
    ostudy.enqueue_trial(fixed, user_attrs={"stage": staged.stages[k].name}, skip_if_exists=False)
    return True


def tell(ostudy, trial, values=None, state=None) -> None:
    """``ostudy.tell`` that survives the grid sampler's end: BruteForceSampler calls
    ``study.stop()`` after the last grid point, which raises outside ``optimize`` (the trial
    is stored before it does)."""
    try:
        ostudy.tell(trial, values, state=state)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise


def grid_exhausted(ostudy, space) -> bool:
    """Every grid point has been measured (grid sampler: nothing new left to propose)."""
    from optuna.samplers import BruteForceSampler
    from optuna.trial import TrialState

    if not isinstance(ostudy.sampler, BruteForceSampler):
        return False
    seen = {tuple(sorted(t.params.items())) for t in ostudy.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))}
    return len(seen) >= space.grid_size()


# ------------------------------------------------------------------ duplicates
def queued_on_purpose(trial) -> bool:
    """A trial popped from the queue as given (warm start, initial point, retry, nightly re-measure):
    run it even if it repeats a configuration."""
    attrs = trial.storage.get_trial_system_attrs(trial._trial_id)  # noqa: SLF001 - live trials hide them
    return "fixed_params" in attrs and "stage" not in trial.user_attrs


def find_duplicate(ostudy, trial) -> Optional[Any]:
    """A finished trial with exactly ``trial``'s parameters (its result is already known)."""
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
    import optuna

    own = ostudy.sampler
    ostudy.sampler = optuna.samplers.RandomSampler(seed=len(ostudy.get_trials(deepcopy=False)) * 7919 + attempt)
    try:
        yield
    finally:
        ostudy.sampler = own


def ask_distinct(ostudy, space, staged: Optional["StagedSearch"] = None):
    """``ostudy.ask()`` + the space's suggestions, re-proposing repeats of finished trials.

    Returns ``(trial, params)`` or None when a staged search must wait. Samplers propose
    a finished configuration again in small discrete spaces (TPE especially); measuring
    it again would spend a trial on a known answer (docs/benchmarks.md).
    """
    trial = None
    for attempt in range(MAX_REPROPOSALS + 1):
        if staged is not None and not enqueue_stage(ostudy, staged):
            return None
        with proposing_with(ostudy, attempt):
            trial = ostudy.ask()
            params = space.suggest(trial)
        original = None if queued_on_purpose(trial) else find_duplicate(ostudy, trial)
        if original is None or attempt == MAX_REPROPOSALS:
            return trial, params
        tell_duplicate(ostudy, trial, original)
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ Tune's searcher
def searcher_class():
    from optuna.trial import TrialState
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    class ConstrainedOptunaSearch(OptunaSearch):
        """OptunaSearch + trial numbers down, constraint values up, staged search, no tell without a row."""

        def __init__(self, *args, staged: Optional[StagedSearch] = None, **kwargs):
            super().__init__(*args, **kwargs)
            self._staged = staged
            self._study_space = getattr(kwargs["space"], "__self__", None)  # the SearchSpace of space.suggest

        def suggest(self, trial_id: str):
            if trial_id not in self._ot_trials and grid_exhausted(self._ot_study, self._study_space):
                return Searcher.FINISHED  # the grid is done: end the run early
            for attempt in range(MAX_REPROPOSALS + 1):
                if self._staged is not None and trial_id not in self._ot_trials:
                    if not enqueue_stage(self._ot_study, self._staged):
                        return None  # Tune asks again later
                with proposing_with(self._ot_study, attempt):
                    config = super().suggest(trial_id)
                if config is None:
                    return None
                ot_trial = self._ot_trials[trial_id]
                original = None if queued_on_purpose(ot_trial) else find_duplicate(self._ot_study, ot_trial)
                if original is None or attempt == MAX_REPROPOSALS:
                    return {**config, TRIAL_NUMBER_KEY: ot_trial.number}
                tell_duplicate(self._ot_study, ot_trial, original)  # see ask_distinct
                del self._ot_trials[trial_id]
            return None

        def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False):
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is None or trial_id in self._completed_trials:
                return
            if error:
                # The trial's process was lost for good (its row says so): the configuration
                # is not to blame, so the sampler ignores it.
                tell(self._ot_study, ot_trial, state=TrialState.FAIL)
                self._completed_trials.add(trial_id)
                return
            if not result or ROW_KEY not in result or result.get(WRITE_FAILED_KEY):
                # No row: leave the trial RUNNING in the journal; the next start retries it.
                self._completed_trials.add(trial_id)
                return
            for key, value in result.items():
                if key.startswith(CONSTRAINT_PREFIX) and not math.isnan(float(value)):
                    ot_trial.set_constraint(key[len(CONSTRAINT_PREFIX):], float(value))
            if result.get("status") == "error":  # the orchestrator failed, not the configuration
                tell(self._ot_study, ot_trial, state=TrialState.FAIL)
            else:
                tell(self._ot_study, ot_trial, [float(result[m]) for m in self._metric])
            self._completed_trials.add(trial_id)

    return ConstrainedOptunaSearch
