"""The ``grid`` sampler: Optuna's BruteForceSampler, blind to finished trials without parameters.

A driver killed between ``ask`` and the first ``suggest`` leaves a trial with no
parameters, which resume marks failed. BruteForceSampler would take it as a leaf at the
root of its grid tree and fail every later proposal ("param_name mismatch"). A module of
its own, at top level, because Tune pickles the searcher and its sampler.
"""

from __future__ import annotations

import optuna


class GridSampler(optuna.samplers.BruteForceSampler):
    @staticmethod
    def _populate_tree(tree, trials, params) -> None:
        kept = [t for t in trials if t.params or not t.state.is_finished()]
        optuna.samplers.BruteForceSampler._populate_tree(tree, kept, params)  # noqa: SLF001
