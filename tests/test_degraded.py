"""A trial whose requests failed beyond the study's ``max_error_rate`` is ``degraded``, not a result.

Real path: a virtual-time simulator trial whose longest prompts plus ``output_len`` pass
``max_model_len``, so the engine refuses some requests as vLLM does (HTTP 400 with the
context-length message). The row, the front, ``recommend`` and the sampler must all treat
it as not measured-good; within the limit the same trial completes.
"""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from orchestrator.recommend import RecommendError, select_trial
from orchestrator.results.pareto import pareto_front
from orchestrator.search.optuna_search import SamplerReport
from orchestrator.study import parse_study
from orchestrator.trial import TrialContext, judge_result
from recorded_trial import run_trial


def _study(study_doc, **top):
    doc = copy.deepcopy(study_doc)
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["workload"] = {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 40,
                       "input_len": {"kind": "uniform", "min": 100, "max": 3000}, "output_len": 1500}
    doc["space"] = {"max_num_seqs": 16, "max_model_len": 4096}
    doc["objectives"] = ["maximize output_throughput"]
    doc["constraints"] = []
    doc.update(top)
    return parse_study(doc)


def test_too_many_failed_requests_degrade_the_trial(study_doc):
    study = _study(study_doc)
    out = run_trial(study, {"max_num_seqs": 16, "max_model_len": 4096}, trial_id="r-0000", trial_number=0,
                    ctx=TrialContext("r"))
    row = out.row
    assert 0 < row["failed"] < row["num_requests"], row["failed"]
    assert row["status"] == "degraded" and row["failure_kind"] == "request_failures"
    assert f"{row['failed']} of {row['num_requests']} requests failed" in row["failure_message"]
    assert f"{row['failed_http']} http" in row["failure_message"] and "maximum context length" in row["failure_message"]
    assert row["output_throughput"] > 0 and row["feasible"] is False  # measured, but not a result
    df = pd.DataFrame([row])
    assert pareto_front(df, study.objectives, study.constraints).empty
    with pytest.raises(RecommendError):
        select_trial(df, study)
    report = SamplerReport.of(judge_result(study, out.result), row["status"])
    assert report.constraints["engine_started"] > 0 and not report.failed


def test_within_the_limit_the_same_trial_completes(study_doc):
    study = _study(study_doc, max_error_rate=0.5)
    out = run_trial(study, {"max_num_seqs": 16, "max_model_len": 4096}, trial_id="r-0000", trial_number=0,
                    ctx=TrialContext("r"))
    assert out.row["failed"] > 0 and out.row["status"] == "completed" and out.row["feasible"] is True


def test_the_default_limit_leaves_old_fingerprints_alone(study_doc):
    assert _study(study_doc).fingerprint() != _study(study_doc, max_error_rate=0.02).fingerprint()
    doc = copy.deepcopy(study_doc)
    assert parse_study(doc).fingerprint() == parse_study({**doc, "max_error_rate": 0.01}).fingerprint()


def test_a_run_recorded_before_the_limit_existed_still_resumes(repo):
    """The H200 study's run was recorded before ``max_error_rate``: its fingerprint must not move."""
    import json

    from orchestrator.study import load_study

    recorded = json.loads(next((repo / "results/examples/llama3-8b-h200/_runs").glob("*.json")).read_text())
    assert load_study(repo / "search_spaces/llama3-8b-h200.yaml").fingerprint() == recorded["fingerprint"]
