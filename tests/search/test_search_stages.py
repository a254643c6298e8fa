"""Staged search: parameter groups searched one after another, validated in the study file."""

from __future__ import annotations

import optuna
import pytest

from orchestrator.search.optuna_search import ask_distinct, tell
from orchestrator.search.samplers import make_sampler
from orchestrator.search.stages import StagedSearch, baseline_values, plan_stages
from orchestrator.study.spec import StudyFileError, parse_study
from support.studies import merged

optuna.logging.set_verbosity(optuna.logging.WARNING)


def staged_doc(study_doc, stages, trials=12):
    return merged(study_doc, space={"tensor_parallel_size": [1, 2], "max_num_seqs": [16, 64, 256],
                                    "max_num_batched_tokens": [2048, 8192],
                                    "gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 0.9, "step": 0.1},
                                    "enforce_eager": False},
                  objectives=["maximize goodput"], search={"stages": stages}, budget={"trials": trials})


THREE = [{"name": "parallelism", "params": ["tensor_parallel_size"], "trials": 2},
         {"name": "batching", "params": ["max_num_seqs", "max_num_batched_tokens"], "trials": 6},
         {"name": "memory", "params": ["gpu_memory_utilization"]}]


def problems(doc) -> list[str]:
    with pytest.raises(StudyFileError) as info:
        parse_study(doc, "s.yaml")
    return [str(p) for p in info.value.problems]


def test_stage_plan_and_baseline(study_doc):
    study = parse_study(staged_doc(study_doc, THREE))
    assert [(s.name, s.trials) for s in plan_stages(study)] == [("parallelism", 2), ("batching", 6), ("memory", 4)]
    base = baseline_values(study)
    # vLLM's own defaults on an 80 GB GPU (1 GPU, 1024 seqs, 8192 tokens, 0.92), moved into the space.
    assert base == {"tensor_parallel_size": 1, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                    "gpu_memory_utilization": 0.9}


def test_stage_validation_one_line_per_problem(study_doc):
    bad = [{"params": ["tensor_parallel_size", "max_num_seq"]},
           {"params": ["tensor_parallel_size", "enforce_eager"], "trials": 20}]
    lines = problems(staged_doc(study_doc, bad))
    assert lines == [
        "search.stages.0.params: not a parameter of the space (did you mean 'max_num_seqs'?); parameters: "
        "tensor_parallel_size, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, enforce_eager "
        "(got 'max_num_seq')",
        "search.stages.0.trials: required key is missing (only the last stage may leave it out: it gets the rest "
        "of the budget)",
        "search.stages.1.params: already in stage 0; each parameter belongs to one stage (got 'tensor_parallel_size')",
        "search.stages.1.params: a fixed parameter has nothing to search; searched parameters: "
        "gpu_memory_utilization, max_num_batched_tokens, max_num_seqs, tensor_parallel_size (got 'enforce_eager')",
        "search.stages: searched parameters in no stage: gpu_memory_utilization, max_num_batched_tokens, "
        "max_num_seqs (each searched parameter belongs to exactly one stage)",
        "search.stages: the stages need 20 trials; budget.trials is 12",
    ]
    doc = staged_doc(study_doc, THREE)
    doc["search"]["sampler"] = "grid"
    assert problems(doc) == ["search.stages: not with sampler 'grid' (it enumerates every combination); "
                             "allowed samplers: tpe, nsga2, gp, random (got 'grid')"]


def test_each_stage_searches_its_parameters_and_holds_the_rest(study_doc):
    study = parse_study(staged_doc(study_doc, THREE))
    staged = StagedSearch(study)
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study))
    seen = []
    for _ in range(study.budget.trials):
        trial, params = ask_distinct(ostudy, study.space, staged)
        # Best at TP 2, 64 seqs, 8192 tokens, 0.8: a bowl the stages should walk into.
        value = 10 * (params["tensor_parallel_size"] == 2) - abs(params["max_num_seqs"] - 64) / 16 \
            + (params["max_num_batched_tokens"] == 8192) - 10 * abs(params["gpu_memory_utilization"] - 0.8)
        trial.set_constraint("slo0", -1.0)
        tell(ostudy, trial, [value])
        seen.append((trial.user_attrs["stage"], params))
    base = staged.baseline
    by_stage = {}
    for stage, params in seen:
        by_stage.setdefault(stage, []).append(params)
    assert [len(v) for v in by_stage.values()] == [2, 6, 4]
    for p in by_stage["parallelism"]:  # later stages at vLLM's defaults
        assert {k: p[k] for k in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")} == \
            {k: base[k] for k in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")}
    assert {p["tensor_parallel_size"] for p in by_stage["parallelism"]} == {1, 2}
    for p in by_stage["batching"]:  # TP held at stage 1's best, memory still at the default
        assert p["tensor_parallel_size"] == 2 and p["gpu_memory_utilization"] == base["gpu_memory_utilization"]
    assert len({(p["max_num_seqs"], p["max_num_batched_tokens"]) for p in by_stage["batching"]}) == 6
    for p in by_stage["memory"]:  # both earlier stages held at their best
        assert (p["tensor_parallel_size"], p["max_num_seqs"], p["max_num_batched_tokens"]) == (2, 64, 8192)


def test_next_stage_waits_for_the_running_trials_of_the_last(study_doc):
    study = parse_study(staged_doc(study_doc, THREE))
    staged = StagedSearch(study)
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study))
    first, _ = ask_distinct(ostudy, study.space, staged)
    second, _ = ask_distinct(ostudy, study.space, staged)  # stage 1 has two trials: both may run at once
    tell(ostudy, first, [1.0])
    assert ask_distinct(ostudy, study.space, staged) is None  # stage 2 needs stage 1's best
    tell(ostudy, second, [2.0])
    third, params = ask_distinct(ostudy, study.space, staged)
    assert third.user_attrs["stage"] == "batching"
    assert params["tensor_parallel_size"] == ostudy.trials[second.number].params["tensor_parallel_size"]
