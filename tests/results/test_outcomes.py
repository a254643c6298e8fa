"""How trials ended is rendered once (orchestrator.results.outcomes): the progress line's last
word, pareto's empty front and the report's table say the same counts and examples."""

from __future__ import annotations

import pandas as pd

from orchestrator.commands.common import explain_empty_front
from orchestrator.results.outcomes import failure_breakdown, failure_lines, outcome_summary
from orchestrator.study.spec import parse_study

TRIALS = pd.DataFrame([
    {"status": "infeasible", "failure_kind": "kv_cache_too_small", "failure_message": "max seq len 4096\nmore"},
    {"status": "infeasible", "failure_kind": "kv_cache_too_small", "failure_message": None},
    {"status": "failed", "failure_kind": "engine_died", "failure_message": "EngineDeadError"},
    {"status": "completed", "failure_kind": "teardown_leak", "failure_message": "1 GiB still held"},
    {"status": "completed", "failure_kind": None, "failure_message": None},
    {"status": None, "failure_kind": None, "failure_message": None},  # a damaged row
])


def test_failures_by_status_and_kind_most_first_with_an_example():
    table = failure_breakdown(TRIALS)
    assert table.to_dict("records") == [
        {"status": "infeasible", "failure_kind": "kv_cache_too_small", "trials": 2, "example": "max seq len 4096"},
        {"status": "completed", "failure_kind": "teardown_leak", "trials": 1, "example": "1 GiB still held"},
        {"status": "failed", "failure_kind": "engine_died", "trials": 1, "example": "EngineDeadError"},
        {"status": "no status", "failure_kind": "-", "trials": 1, "example": ""},
    ]
    assert failure_lines(TRIALS)[0] == "2 infeasible, kv_cache_too_small: e.g. max seq len 4096"
    assert failure_breakdown(TRIALS[TRIALS["failure_kind"].isna() & TRIALS["status"].notna()]).empty


def test_every_reader_renders_the_same_lines(study_doc):
    lines = failure_lines(TRIALS)
    summary = outcome_summary(TRIALS).splitlines()
    assert summary[0] == "trials: 2 completed, 1 failed, 2 infeasible, 1 no status"
    assert summary[1:] == ["  " + line for line in lines]
    unmeasured = TRIALS[TRIALS["status"] != "completed"]
    assert outcome_summary(unmeasured).splitlines()[1:] == (
        ["  no configuration completed:"] + ["  " + line for line in failure_lines(unmeasured)])
    assert explain_empty_front(parse_study(study_doc), unmeasured).splitlines()[1:] == (
        ["  " + line for line in failure_lines(unmeasured)])
