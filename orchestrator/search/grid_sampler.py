"""The ``grid`` sampler: Optuna's BruteForceSampler, blind to trials a stopped driver left behind.

A driver stopped between ``ask`` and its last ``suggest`` (killed, or its disk full in the
middle of the journal) leaves a trial with none or only some of its parameters; resume
marks it failed (``INTERRUPTED_ATTR``) and queues its parameters again. BruteForceSampler
would take such a trial for a leaf of its grid tree, at the root or above a parameter the
trial never got, and fail every later proposal there ("param_name mismatch"). The trial
never ran, and its retry covers its grid point, so it is left out of the tree. A module of
its own, at top level, because Tune pickles the searcher and its sampler.
"""

from __future__ import annotations

import optuna

from orchestrator.search.resume import INTERRUPTED_ATTR


def _walked(trial) -> bool:
    """Whether a trial belongs in the grid tree: running, or finished after it got its parameters."""
    if not trial.state.is_finished():
        return True
    return bool(trial.params) and INTERRUPTED_ATTR not in trial.system_attrs


class GridSampler(optuna.samplers.BruteForceSampler):
    @staticmethod
    def _populate_tree(tree, trials, params) -> None:
        optuna.samplers.BruteForceSampler._populate_tree(tree, [t for t in trials if _walked(t)], params)  # noqa: SLF001
