"""Staged search (``search.stages``): which parameters the next trial holds, and at what.

Pure over Optuna's trial list (no Ray): :class:`StagedSearch` decides, :func:`enqueue_stage`
queues the decision for the next proposal. :class:`StagedSearch` is a part of the search
(:mod:`orchestrator.search.parts`): its :meth:`~StagedSearch.queue` is :func:`enqueue_stage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.search.feasibility import resolve_args
from orchestrator.search.parts import SearchPart
from orchestrator.search.warm_start import _DROP, snap_value

# A trial answered from an earlier one with the same parameters (not measured; see optuna_search).
DUPLICATE_ATTR = "duplicate_of"


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
    # deferred: optuna is slow to import; validate/show load this module
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


class StagedSearch(SearchPart):
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
        # deferred: optuna is slow to import; validate/show load this module
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

    def queue(self, ostudy, pending) -> bool:
        return enqueue_stage(ostudy, self)


def enqueue_stage(ostudy, staged: StagedSearch) -> bool:
    """Queue the next trial's held parameters; False if it must wait. A queued (warm start,
    retry) trial goes first as it is."""
    # deferred: optuna is slow to import; validate/show load this module
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
