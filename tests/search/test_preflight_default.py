"""The pre-flight is on by default, the simulator included: the budget buys engines that start.

Real studies through ``run_study`` (local Ray, Tune, Optuna, the virtual-time simulator), with
no ``search.preflight`` key. A 70B model on 4 x H100 starts at TP 4 only: its budget of 6 buys
6 started trials. Where the region that cannot start is a combination (a long context at a
small memory share), every proposal there is a ``pruned`` row that takes no Tune trial and no
budget. ``search.preflight: false`` still hands the decision to the engine's own start.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from support.studies import run_printed, tune_trials
from orchestrator.study.spec import parse_study

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("unit_ray")]
START_FAILURES = {"weights_oom", "no_kv_memory", "kv_cache_too_small", "invalid_args"}


def _run(study) -> tuple:
    return run_printed(study, serve_port=8132)


def test_70b_on_4_h100_buys_six_started_trials_with_a_budget_of_six(repo, tmp_path):
    doc = yaml.safe_load((repo / "search_spaces" / "llama-3.1-70b-h100x4.yaml").read_text())
    assert "preflight" not in doc.get("search", {})  # the default decides
    doc["output"] = str(tmp_path / "out")
    study = parse_study(doc, source_path=repo / "search_spaces" / "llama-3.1-70b-h100x4.yaml")
    rows, out = _run(study)
    started = rows[rows["status"] == "completed"]
    assert len(started) == 6 and (started["tensor_parallel_size"] == 4).all(), rows[["status", "failure_kind"]]
    assert not rows["failure_kind"].isin(START_FAILURES).any(), rows["failure_kind"].tolist()
    assert len(tune_trials(study)) == 6
    assert "never starts (taken out of the space before sampling): tensor_parallel_size=1 (weights_oom), " \
           "tensor_parallel_size=2 (no_kv_memory)" in out, out


def _region_study(study_doc, tmp_path, **search):
    doc = copy.deepcopy(study_doc)
    doc.update(name="region", seed=3)
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["workload"] = {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 12, "output_len": 8}
    # 131072 tokens of KV fit at 0.9 of an H100, not at 0.25: a combination, screened per proposal.
    doc["space"] = {"max_model_len": [4096, 131072], "max_num_seqs": [8, 16, 32, 64, 128, 256],
                    "gpu_memory_utilization": [0.25, 0.9]}
    doc["search"] = {"sampler": "random", **search}
    doc["budget"] = {"trials": 6, "max_concurrent_trials": 1}
    doc["output"] = str(tmp_path / "out")
    return parse_study(doc)


def test_a_pruned_point_takes_no_budget_by_default(study_doc, tmp_path):
    study = _region_study(study_doc, tmp_path)
    rows, _ = _run(study)
    pruned = rows[rows["status"] == "pruned"]
    assert (rows["status"] == "completed").sum() == 6, rows["status"].tolist()
    assert len(pruned) > 0 and (pruned["failure_kind"] == "preflight").all()
    assert pruned["failure_message"].str.startswith("[kv_cache_too_small]").all()
    assert ((pruned["max_model_len"] == 131072) & (pruned["gpu_memory_utilization"] == 0.25)).all()
    tuned = tune_trials(study)
    assert len(tuned) == 6
    assert not any(c["max_model_len"] == 131072 and c["gpu_memory_utilization"] == 0.25 for c in tuned)


def test_preflight_false_leaves_the_start_to_the_engine(study_doc, tmp_path):
    study = _region_study(study_doc, tmp_path, preflight=False)
    rows, _ = _run(study)
    assert len(rows) == 6 and not (rows["status"] == "pruned").any()
    refused = rows[rows["failure_kind"] == "kv_cache_too_small"]
    assert len(refused) > 0 and (refused["status"] == "infeasible").all(), rows["status"].tolist()
