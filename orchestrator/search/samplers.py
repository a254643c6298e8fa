"""The Optuna sampler a study file names (``search.sampler``), with defaults measured by
``benchmarks/search_efficiency.py`` (see docs/benchmarks.md)."""

from __future__ import annotations

import warnings
from typing import Optional


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
    # deferred: optuna is slow to import; validate/show load this module
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
            # deferred: grid_sampler imports optuna; validate/show load this module
            from orchestrator.search.grid_sampler import GridSampler

            return GridSampler(seed=seed)
    raise ValueError(f"unknown sampler {s.sampler!r}; allowed: tpe, nsga2, gp, random, grid")
