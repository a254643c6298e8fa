"""The study file's ``search`` section: how the space is searched.

The sampler and its seed, points tried first (given, or warm-started from earlier
results) and staged search. Keys that must agree with the space and the budget are
checked by :func:`search_problems`, which the study runs once both are parsed.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, Optional

from pydantic import Field

from orchestrator.strict_model import StrictModel
from orchestrator.study.errors import Problem
from orchestrator.study.space import SearchSpace

MAX_GRID_POINTS = 100_000  # as budget.trials: a grid sampler lists (and checks off) every point


class SearchStage(StrictModel):
    """One step of a staged search: its parameters are searched while the others are held."""

    name: Optional[str] = Field(default=None, max_length=100)
    params: list[str] = Field(min_length=1, description="searched in this stage (each parameter in one stage)")
    trials: Optional[int] = Field(default=None, ge=1, le=100_000,
                                  description="trials of this stage; the last stage may leave it out (the rest)")


# Optuna's samplers seed NumPy's legacy generator, which takes 0 .. 2**32 - 1: a larger seed passed
# validate and ended ``run`` in a traceback ("Seed must be between 0 and 2**32 - 1").
MAX_SEED = 2**32 - 1


class SearchSettings(StrictModel):
    sampler: Literal["tpe", "nsga2", "gp", "random", "grid"] = "tpe"
    seed: Optional[int] = Field(default=None, ge=0, le=MAX_SEED, description="sampler seed; default: the study's seed")
    n_startup_trials: Optional[int] = Field(default=None, ge=0, description="random trials before the model kicks in")
    warm_start: list[str] = Field(default_factory=list, description="result datasets whose best points are tried first")
    initial_points: list[dict[str, Any]] = Field(
        default_factory=list, description="configurations tried first, in order (e.g. today's hand-tuned setting)")
    warm_start_trials: Optional[int] = Field(default=None, ge=0, le=100_000,
                                             description="most warm-start points tried; default: half the budget")
    stages: list[SearchStage] = Field(
        default_factory=list, description="staged search: parameter groups searched one after another")
    preflight: Optional[bool] = Field(
        default=None, description="skip configurations that cannot start (vLLM's memory accounting and argument "
                                  "refusals) before they take a trial; default: on for vllm and sim, false turns "
                                  "it off")
    fidelity: Literal["real", "sim"] = Field(
        default="real", description="sim: score the space with the simulator, measure only a shortlist for real "
                                    "(vllm and external engines; see docs/search.md)")
    fidelity_min_gain: float = Field(
        default=0.01, ge=0, le=1, description="fidelity sim: stop when another real trial is predicted to improve "
                                              "the best objective by less than this share")
    remeasure: Optional[int] = Field(
        default=None, ge=0, le=100_000,
        description="trials at the end of the budget that measure again the configurations tied with the "
                    "best within the noise (fresh arrivals and prompts), before a winner is named; "
                    "default: an eighth of the budget (0 below 8 trials)")
    fidelity_candidates: int = Field(
        default=2048, ge=1, le=100_000, description="fidelity sim: most configurations scored (the whole space "
                                                    "if it is smaller, else a seeded sample)")


def fidelity_problems(s: SearchSettings, engine_kind: str, cpu: bool = False) -> list[Problem]:
    """``search.fidelity: sim`` needs a real engine to confirm the simulator's shortlist, and a GPU
    the simulator models."""
    if s.fidelity != "sim":
        return []
    problems = []
    if engine_kind not in ("vllm", "external"):
        problems.append(Problem("search.fidelity", f"'sim' needs a real engine to confirm the simulator's picks; "
                                                   f"engine.kind is {engine_kind!r}, allowed: vllm, external",
                                s.fidelity, True))
    if cpu:
        problems.append(Problem("search.fidelity", "'sim' needs a GPU from the simulator's catalog (hardware.gpu); "
                                                   "the simulator does not model vLLM's CPU build", s.fidelity, True))
    if s.stages:
        problems.append(Problem("search.fidelity", "'sim' picks every trial itself: not with search.stages",
                                s.fidelity, True))
    return problems


def search_problems(s: SearchSettings, space: SearchSpace, budget_trials: int) -> list[Problem]:
    """``search`` keys that depend on the space and the budget (``budget.trials``)."""
    names = list(space.params)
    problems: list[Problem] = []
    for i, point in enumerate(s.initial_points):
        for name, value in point.items():
            spec = space.params.get(name)
            if spec is None:
                problems.append(Problem(f"search.initial_points.{i}.{name}",
                                        f"not a parameter of the space; parameters: {', '.join(names)}"))
            elif not spec.allows(value):
                problems.append(Problem(f"search.initial_points.{i}.{name}", f"not in the space: {spec.allowed()}",
                                        value, True))
    if s.sampler == "grid" and space.params and space.grid_bound() > MAX_GRID_POINTS:
        problems.append(Problem("search.sampler", f"'grid' lists every configuration: this space has "
                                f"{space.grid_bound():,}, more than {MAX_GRID_POINTS:,} (the most trials a budget "
                                "holds); use tpe, nsga2, gp or random, or a coarser space (log: true, a step, "
                                "fewer choices)", s.sampler, True))
    if not s.stages:
        return problems
    if s.sampler == "grid":
        problems.append(Problem("search.stages", "not with sampler 'grid' (it enumerates every combination); "
                                                 "allowed samplers: tpe, nsga2, gp, random", s.sampler, True))
    sampled = set(space.sampled_names())
    owner: dict[str, int] = {}
    for i, stage in enumerate(s.stages):
        for name in stage.params:
            if name not in space.params:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(Problem(f"search.stages.{i}.params", f"not a parameter of the space{hint}; "
                                        f"parameters: {', '.join(names)}", name, True))
            elif name not in sampled:
                problems.append(Problem(f"search.stages.{i}.params", "a fixed parameter has nothing to search; "
                                        f"searched parameters: {', '.join(sorted(sampled))}", name, True))
            elif name in owner:
                problems.append(Problem(f"search.stages.{i}.params", f"already in stage {owner[name]}; "
                                        "each parameter belongs to one stage", name, True))
            else:
                owner[name] = i
        if stage.trials is None and i < len(s.stages) - 1:
            problems.append(Problem(f"search.stages.{i}.trials", "required key is missing (only the last stage "
                                                                 "may leave it out: it gets the rest of the budget)"))
    missing = sorted(sampled - set(owner))
    if missing:
        problems.append(Problem("search.stages", "searched parameters in no stage: " + ", ".join(missing)
                                + " (each searched parameter belongs to exactly one stage)"))
    planned = sum(st.trials or 0 for st in s.stages)
    rest = budget_trials - planned
    if rest < 0 or (rest == 0 and s.stages[-1].trials is None):
        problems.append(Problem("search.stages", f"the stages need {planned} trials"
                                + (" and the last stage at least one more" if s.stages[-1].trials is None else "")
                                + f"; budget.trials is {budget_trials}"))
    return problems
