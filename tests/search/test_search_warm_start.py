"""Warm start: an earlier study's Pareto points, mapped into a new space, enqueued first, no repeats."""

from __future__ import annotations

import json

import optuna
import pytest

from orchestrator.results import ResultsStore, load_trials
from orchestrator.search.optuna_search import ask_distinct
from orchestrator.search.samplers import make_sampler
from orchestrator.search.warm_start import front_params, map_point, warm_start_points
from orchestrator.study.space import SearchSpace
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import merged

optuna.logging.set_verbosity(optuna.logging.WARNING)

NEW_SPACE = {
    "max_num_seqs": {"type": "int", "low": 16, "high": 128, "step": 16},
    "max_num_batched_tokens": [2048, 8192],
    "gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 0.85, "step": 0.05},
    "kv_cache_dtype": ["auto"],
    "long_prefill_token_threshold": {"type": "int", "low": 0, "high": 512, "when": {"max_num_batched_tokens": 8192}},
}


def test_map_point_drops_clamps_snaps_and_respects_conditions():
    space = SearchSpace.model_validate(NEW_SPACE)
    old = {"max_num_seqs": 300, "max_num_batched_tokens": 3000, "gpu_memory_utilization": 0.93,
           "kv_cache_dtype": "fp8", "tensor_parallel_size": 2, "long_prefill_token_threshold": 64}
    assert map_point(space, old) == {
        "max_num_seqs": 128,  # clamped to the range
        "max_num_batched_tokens": 2048,  # the nearest choice (log scale)
        "gpu_memory_utilization": 0.85,  # clamped, on the step grid
        # kv_cache_dtype fp8 is not a choice: left to the sampler; tensor_parallel_size: not in this space;
        # long_prefill_token_threshold: off, its condition (8192 tokens) does not hold
    }
    assert map_point(space, {"max_num_seqs": 41, "max_num_batched_tokens": 8192,
                             "long_prefill_token_threshold": 64, "gpu_memory_utilization": 0.61}) == \
        {"max_num_seqs": 48, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.6,
         "long_prefill_token_threshold": 64}
    assert map_point(space, {"max_num_seqs": "many", "max_num_batched_tokens": True}) == {}


@pytest.fixture
def earlier_results(tmp_path, study_doc):
    """A similar earlier study (TP in its space, another range) measured with the virtual simulator."""
    old = parse_study(merged(
        study_doc, name="earlier", output=str(tmp_path / "results"), engine={"mode": "virtual"},
        workload={"arrival": {"kind": "poisson", "rate": 30}, "num_requests": 60,
                  "input_len": {"kind": "uniform", "min": 200, "max": 1500}},
        space={"max_num_seqs": [4, 32, 300], "max_num_batched_tokens": [1024, 8192], "tensor_parallel_size": [1, 2]}))
    store = ResultsStore(old.output, old.name)
    for i, params in enumerate(old.space.grid()):
        row = run_trial(old, params, trial_id=f"r-{i:04d}", trial_number=i, ctx=TrialContext(run_id="r")).row
        store.write_trial(row, None, param_types=old.space.column_types())
    return old, store.study_path


def test_warm_start_enqueues_the_earlier_front_without_repeats(study_doc, earlier_results):
    old, path = earlier_results
    frame = load_trials(path)
    new = parse_study(merged(study_doc, engine={"mode": "virtual"}, space=NEW_SPACE,
                             objectives=["maximize output_throughput_per_gpu", "minimize ttft_p99_ms"],
                             search={"warm_start": [path]}))

    front = front_params(new, frame)
    assert front and all(set(p) == {"max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"} for p in front)
    points = warm_start_points(new, [frame, frame])  # the same dataset twice: its points once
    assert points == list({json.dumps(p, sort_keys=True): p for p in map(lambda p: map_point(new.space, p), front)
                           if p}.values())
    assert all(map_point(new.space, p) == p for p in points)  # all inside the new space

    # Points the new study has already measured are not queued again.
    assert warm_start_points(new, [frame], existing=points[:1]) == points[1:]
    assert warm_start_points(new, [frame], limit=1) == points[:1]

    # Enqueued, they are what the sampler proposes first; the missing parameters are sampled.
    ostudy = optuna.create_study(directions=new.directions, sampler=make_sampler(new))
    for p in points:
        ostudy.enqueue_trial(p, user_attrs={"warm_start": True})
    for p in points:
        trial, params = ask_distinct(ostudy, new.space)
        assert {k: params[k] for k in p} == p and "gpu_memory_utilization" in params
        ostudy.tell(trial, [1.0, 1.0])
