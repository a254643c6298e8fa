"""The search's optional parts behind one interface, in the manner of Optuna's ``BaseSampler``.

The sampler proposes configurations; around it a run has parts, each optional, each a
:class:`SearchPart`, in one list the driver builds (``_search_parts`` in
:mod:`orchestrator.search.driver`):

* :class:`FinishedGrid`: the grid sampler's end (every point measured);
* :class:`~orchestrator.search.racing.RacingPart`: the last trials measure the tied leaders again;
* :class:`~orchestrator.search.stages.StagedSearch`: ``search.stages``, the parameters a trial holds;
* :class:`~orchestrator.search.screening.PreflightScreen`: a proposal that cannot start takes no trial;
* :class:`~orchestrator.search.fidelity.part.FidelityPart`: ``search.fidelity: sim`` picks every trial.
* :class:`~orchestrator.search.best_capacity.BestCapacity`: the best capacity so far, below which a
  trial's capacity search stops (``capacity.stop_below_best``).

The proposal loop (:func:`orchestrator.search.optuna_search.propose`) and Tune's searcher call the
same hooks of every part, in the list's order; each hook does nothing unless a part overrides it:

1. a new trial is asked for: :meth:`~SearchPart.finished` (nothing new is left; the run ends unless a
   part queues a last trial);
2. before each ask of the sampler: :meth:`~SearchPart.queue` (put what the part wants measured next on
   Optuna's queue; a trial queued already goes first, so the first part to queue wins; False:
   propose nothing now);
3. each proposal: :meth:`~SearchPart.turned_away` (it cannot start: the part told and recorded it,
   and the sampler is asked again);
4. a trial starts: :meth:`~SearchPart.started` (the keys it adds to the trial's config);
5. a result arrives, or a proposal was turned away: :meth:`~SearchPart.observe`; on resume, the rows
   recorded before: :meth:`~SearchPart.observe_rows`;
6. proposing came back empty: :attr:`~SearchPart.stop_reason` (a part stopped the search, rather
   than asking it to wait) and :meth:`~SearchPart.last_call` (the search stops: queue a last trial).

Parts are plain objects: Tune pickles its searcher with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

Params = Mapping[str, Any]


@dataclass(frozen=True)
class Outcome:
    """What the parts are told of a proposal once its fate is known."""

    result: Mapping[str, Any] = field(default_factory=dict)  # the trial's Tune result (its row's numbers)
    screened: bool = False  # turned away before it ran (the pre-flight): nothing was measured
    idle: bool = False  # no other trial is in flight: the cluster is free
    trial_id: str = ""  # Tune's id of the trial, for messages


class SearchPart:
    """One optional part of the search. Every hook has a default that does nothing: a part
    overrides those it needs (see the module's text for when each is called)."""

    stop_reason: Optional[str] = None  # why this part stopped the search; None: it did not

    def finished(self, ostudy) -> bool:
        """Before a new trial: nothing new is left to propose (final, unlike :attr:`stop_reason`)."""
        return False

    def queue(self, ostudy, pending: Sequence[Params]) -> bool:
        """Before each ask: queue on ``ostudy`` what this part wants measured next (``pending``: the
        parameters of trials in flight). False: propose nothing now."""
        return True

    def turned_away(self, trial, params: Params) -> bool:
        """True when the proposal must not run; the part has told the sampler and recorded it."""
        return False

    def started(self, trial, params: Params) -> dict[str, Any]:
        """A trial starts on ``params``: the keys this part adds to its config."""
        return {}

    def observe(self, params: Params, outcome: Outcome) -> None:
        """A trial's result, or a proposal turned away."""

    def observe_rows(self, trials, levels) -> None:
        """A resumed run: the trials (and capacity levels, when read) recorded before it."""

    def last_call(self, ostudy) -> bool:
        """The search stops: queue a last trial on ``ostudy``; True if one is queued."""
        return False


def waiting(ostudy) -> bool:
    """A trial is queued (a retry, an initial point, a part's): it goes first."""
    # deferred: optuna is slow to import; validate/show load this module
    from optuna.trial import TrialState

    return any(t.state == TrialState.WAITING for t in ostudy.get_trials(deepcopy=False))


class FinishedGrid(SearchPart):
    """The grid sampler's end: every point of the space measured (or running), nothing new to propose."""

    def __init__(self, space):
        self.space = space

    def finished(self, ostudy) -> bool:
        # deferred: optuna is slow to import; validate/show load this module
        from optuna.samplers import BruteForceSampler
        from optuna.trial import TrialState

        if not isinstance(ostudy.sampler, BruteForceSampler):
            return False
        seen = {tuple(sorted(t.params.items())) for t in ostudy.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))}
        return len(seen) >= self.space.grid_size()


# ------------------------------------------------------------------ the hooks over a list of parts
def finished(parts: Sequence[SearchPart], ostudy) -> bool:
    return any(p.finished(ostudy) for p in parts)


def queue(parts: Sequence[SearchPart], ostudy, pending: Sequence[Params] = ()) -> bool:
    """Every part queues in turn; the first that says wait (or stop) ends the round."""
    return all(p.queue(ostudy, pending) for p in parts)


def turned_away(parts: Sequence[SearchPart], trial, params: Params) -> bool:
    return any(p.turned_away(trial, params) for p in parts)


def started(parts: Sequence[SearchPart], trial, params: Params) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in parts:
        out.update(p.started(trial, params))
    return out


def observe(parts: Sequence[SearchPart], params: Params, outcome: Outcome) -> None:
    for p in parts:
        p.observe(params, outcome)


def stop_reason(parts: Sequence[SearchPart]) -> Optional[str]:
    return next((p.stop_reason for p in parts if p.stop_reason is not None), None)


def last_call(parts: Sequence[SearchPart], ostudy) -> bool:
    return any(p.last_call(ostudy) for p in parts)
