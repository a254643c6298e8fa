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

from conftest import sim_study
from orchestrator.apps.recommend import RecommendError, select_trial
from orchestrator.results.pareto import pareto_front
from orchestrator.search.optuna_search import SamplerReport
from orchestrator.search.trial_plan import judge_result
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial


def _study(study_doc, **top):
    sections = {"workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 40,
                             "input_len": {"kind": "uniform", "min": 100, "max": 3000}, "output_len": 1500},
                "space": {"max_num_seqs": 16, "max_model_len": 4096},
                "objectives": ["maximize output_throughput"], "constraints": [], **top}
    return sim_study(study_doc, **sections)


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

    from orchestrator.study.load import load_study

    recorded = json.loads((repo / "results/examples/llama3-8b-h200/study.json").read_text())
    assert recorded["fingerprint"] == "41424c4ac475bc33"  # as its run state said when it ran
    assert load_study(repo / "search_spaces/llama3-8b-h200.yaml").fingerprint() == recorded["fingerprint"]


def _virtual(study_doc, **workload):
    doc = copy.deepcopy(study_doc)
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["workload"] = {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 20, "output_len": 32, **workload}
    return parse_study(doc)


def test_a_measured_window_without_a_request_fails_the_trial(study_doc):
    """``warmup_s`` and ``cooldown_s`` that leave no request (20 requests over 4.75 s, 3 s cut at each
    end; ``validate`` refuses such a file): failed, ``empty_window``, never completed with NaN
    latencies and no throughput."""
    study = _virtual(study_doc, warmup_s=3, cooldown_s=3)
    row = run_trial(study, {"max_num_seqs": 16}, trial_id="r-0000", trial_number=0, ctx=TrialContext("r")).row
    assert row["num_requests"] == 0
    assert row["status"] == "failed" and row["failure_kind"] == "empty_window", row.get("failure_message")
    assert "warmup_s (3 s) and cooldown_s (3 s)" in row["failure_message"] and row["feasible"] is False
    with pytest.raises(RecommendError):
        select_trial(pd.DataFrame([row]), study)


@pytest.mark.parametrize("timeout_s", [1e-9, 0.05])
def test_the_virtual_simulator_keeps_the_request_timeout(study_doc, timeout_s):
    """A request not ended ``timeout_s`` after it was sent fails as ``timeout``, as the HTTP load
    generator records it (tokens that came in time kept, the engine told to drop it)."""
    from orchestrator.measure.records import RequestErrorKind

    out = run_trial(_virtual(study_doc, timeout_s=timeout_s), {"max_num_seqs": 16}, trial_id="r-0000",
                    trial_number=0, ctx=TrialContext("r"))
    measured = [r for r in out.records if not r.warmup]
    timed_out = [r for r in measured if r.error_kind == RequestErrorKind.TIMEOUT]
    assert len(timed_out) == len(measured) == 20 and out.row["failed_timeout"] == 20
    for r in timed_out:
        assert r.finished_s == pytest.approx(r.sent_s + timeout_s)
        assert all(t <= r.finished_s for t in r.token_times_s) and not r.success
        assert r.error.startswith(f"no end of stream within {timeout_s:g} s")
    assert out.row["status"] == "degraded" and "20 timeout" in out.row["failure_message"]
    within = run_trial(_virtual(study_doc, timeout_s=60), {"max_num_seqs": 16}, trial_id="r-0001",
                       trial_number=1, ctx=TrialContext("r")).row
    assert within["failed"] == 0 and within["status"] == "completed"
