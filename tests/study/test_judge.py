"""One judge: every reader of "does this trial meet its SLOs?" gives the same answer, limits included.

A real virtual-time trial is measured once; its TTFT p99 is then put on each side of, and
exactly at, a limit of every comparison. The row (``feasible``), what Optuna is told, the
Pareto front, ``recommend``, a capacity level's verdict and the progress line must agree
with :func:`orchestrator.measure.limits.met` on every case; at exactly the limit ``<=``/``>=`` are met
and ``<``/``>`` are not.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import sim_study
from orchestrator.apps.recommend import RecommendError, select_trial
from orchestrator.measure import limits
from orchestrator.measure.metrics import summarise
from orchestrator.measure.records import RequestRecord
from orchestrator.results.pareto import feasible_mask, pareto_front
from orchestrator.search.optuna_search import SamplerReport
from orchestrator.search.row import trial_row
from orchestrator.search.trial_plan import judge_result, run_trial
from orchestrator.search.tune import tune_result
from orchestrator.study import judge
from orchestrator.study.spec import parse_study
from orchestrator.trial.capacity import judge_level
from orchestrator.trial.run import TrialContext

OPS = ("<=", "<", ">=", ">")


def _study(base_doc, op: str, limit: float):
    return sim_study(base_doc, workload={"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 16,
                                         "output_len": 16},
                     objectives=["maximize output_throughput"], constraints=[f"ttft_p99_ms {op} {limit!r}"])


@pytest.fixture(scope="module")
def trial():
    from conftest import BASE_STUDY

    study = _study(BASE_STUDY, "<=", 1e9)
    result = run_trial(study, {"max_num_seqs": 16, "max_num_batched_tokens": 2048}, trial_id="r-0000",
                           trial_number=0, ctx=TrialContext("r"))
    assert result.completed and result.metrics is not None
    return BASE_STUDY, result


def _at(result, ttft: float):
    return dataclasses.replace(result, metrics=dataclasses.replace(result.metrics, ttft_p99_ms=ttft))


def _every_reader(base_doc, result, op: str, limit: float, value: float) -> dict[str, bool]:
    study = _study(base_doc, op, limit)
    r = _at(result, value)
    verdict = judge_result(study, r)
    row = trial_row(study, r, verdict)
    report = SamplerReport.of(verdict, row["status"])
    df = pd.DataFrame([row])
    try:
        recommended = select_trial(df, study)["trial_id"] == row["trial_id"]
    except RecommendError:
        recommended = False
    level = judge_level(r.metrics, study.constraints)
    return {
        "row": bool(row["feasible"]),
        "row violation": row["constraint_violation"] <= 0,
        "optuna": all(v <= 0 for v in report.constraints.values()),
        "front": bool(feasible_mask(df, study.constraints)[0]) and len(pareto_front(df, study.objectives,
                                                                                  study.constraints)) == 1,
        "recommend": bool(recommended),
        "capacity level": level.ok,
        "progress": bool(tune_result(study, row, verdict, report)["feasible"]),
    }


@pytest.mark.parametrize("op", OPS)
def test_exactly_at_the_limit(trial, op):
    base_doc, result = trial
    v = result.metrics.ttft_p99_ms
    answers = _every_reader(base_doc, result, op, v, v)
    expected = op in ("<=", ">=")
    assert answers == {k: expected for k in answers}, (op, answers)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(OPS), offset=st.sampled_from([-1.0, -1e-9, 0.0, 1e-9, 1.0]),
       scale=st.floats(0.5, 2.0))
def test_every_reader_agrees_with_the_judge(trial, op, offset, scale):
    base_doc, result = trial
    value = result.metrics.ttft_p99_ms * scale
    limit = value + offset * max(1.0, abs(value))
    answers = _every_reader(base_doc, result, op, limit, value)
    expected = limits.met(op, limit, value)
    assert answers == {k: expected for k in answers}, (op, limit, value, answers)


@pytest.mark.parametrize("value", [None, math.nan, math.inf])
def test_a_missing_or_non_finite_value_never_meets(value):
    for op in OPS:
        assert not limits.met(op, 100.0, value)
        assert limits.violation(op, 100.0, value) == 1.0


@pytest.mark.parametrize("op", ["<", "<="])
def test_requests_and_a_trial_exactly_at_a_limit_are_judged_alike_by_goodput_judge_and_front(study_doc, op):
    """``ttft_p99_ms < 125`` with every request at exactly 125 ms: the trial is infeasible, no request
    is good, and the front is empty; with ``<=`` all three say met."""
    study_doc["constraints"] = [f"ttft_p99_ms {op} 125"]
    study = parse_study(study_doc)
    # 0.125 s is exact in binary: every TTFT is exactly 125.0 ms
    records = [RequestRecord(index=i, scheduled_s=float(i), sent_s=float(i), first_token_s=i + 0.125,
                             end_s=i + 0.25, token_times_s=[i + 0.125, i + 0.25], completion_tokens=2)
               for i in range(8)]
    m = summarise(records, slo=study.request_slo())
    assert m.ttft_p99_ms == 125.0 and m.completed == 8
    met = op == "<="
    assert m.goodput == (pytest.approx(m.request_throughput) if met else 0.0)
    row = {**m.as_dict(), "status": "completed", "trial_id": "t-0000"}
    assert judge.judge(study, row, "completed").feasible is met
    assert len(pareto_front(pd.DataFrame([row]), study.objectives, study.constraints)) == int(met)
