"""How trials ended is rendered once (orchestrator.results.outcomes): the progress line's last
word, pareto's empty front and the report's table say the same counts and examples; pareto's
empty front and recommend say why no trial qualifies in the same words."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from conftest import REPO
from orchestrator.cli import main
from orchestrator.results import load_trials
from orchestrator.results.outcomes import failure_breakdown, failure_lines, outcome_summary, why_no_trial_qualifies
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
    assert why_no_trial_qualifies(unmeasured, parse_study(study_doc).constraints).splitlines()[1:] == (
        ["  " + line for line in failure_lines(unmeasured)])


def test_pareto_and_recommend_say_why_no_trial_meets_the_slos_in_the_same_words(tmp_path, capsys):
    """The interactive H200 study with SLOs no trial met: both commands name each SLO and the best
    value the completed trials reached (the same minimum pandas finds), or that it was never measured."""
    example = REPO / "results" / "examples" / "llama3-8b-h200-interactive"
    study_dir = tmp_path / example.name
    shutil.copytree(example / "trials", study_dir / "trials")
    stored = json.loads((example / "study.json").read_text())
    stored["study"]["constraints"] = [{"metric": "ttft_p99_ms", "op": "<=", "value": 1.0},
                                      {"metric": "output_throughput", "op": ">=", "value": 1e9}]
    (study_dir / "study.json").write_text(json.dumps(stored))
    completed = load_trials(study_dir).query("status == 'completed'")
    assert len(completed) >= 2
    expected = ["no completed trial meets ttft_p99_ms <= 1, output_throughput >= 1e+09:",
                f"  ttft_p99_ms <= 1: best seen {completed['ttft_p99_ms'].min():,.4g}",
                f"  output_throughput >= 1e+09: best seen {completed['output_throughput'].max():,.4g}"]

    assert main(["pareto", str(study_dir)]) == 0
    pareto = capsys.readouterr().out.splitlines()
    assert pareto[-3:] == expected, pareto
    assert main(["recommend", str(study_dir)]) == 1
    recommend = capsys.readouterr().err.splitlines()
    assert recommend == ["recommend: " + expected[0]] + expected[1:], recommend
