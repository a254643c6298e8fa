"""Progress lines: counts, best so far, ETA, and a heartbeat while long trials run."""

from __future__ import annotations

import io
import re

from orchestrator.search.progress import ProgressPrinter
from orchestrator.study.spec import parse_study


def _printer(study_doc, monkeypatch, interval="30"):
    monkeypatch.setenv("ORCHESTRATOR_PROGRESS_INTERVAL_S", interval)
    stream = io.StringIO()
    return ProgressPrinter(parse_study(study_doc), total=4, stream=stream), stream


def test_lines_count_trials_and_keep_the_best_feasible(study_doc, monkeypatch):
    p, out = _printer(study_doc, monkeypatch)
    p.trial_started()
    p.trial_started()
    p.trial_finished({"status": "completed", "tid": "r-0000", "feasible": True,
                      "output_throughput_per_gpu": 900.0, "ttft_p99_ms": 150.0}, {"max_num_seqs": 64})
    p.trial_finished({"status": "completed", "tid": "r-0001", "feasible": False,
                      "output_throughput_per_gpu": 2000.0, "ttft_p99_ms": 9000.0}, {"max_num_seqs": 256})
    p.trial_started()
    p.trial_finished({"status": "infeasible", "tid": "r-0002", "failure_kind": "kv_cache_too_small"},
                     {"max_num_seqs": 8})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[1/4] r-0000 completed") and "max_num_seqs=64" in lines[0]
    assert "SLO ok" in lines[1] and "done 1, running 1, not completed 0" in lines[1]
    assert "SLO missed" in lines[3]
    assert "kv_cache_too_small" in lines[5] and "done 3, running 0, not completed 1" in lines[5]
    # The infeasible 2000 tok/s trial is not "best": only trials meeting the SLOs are.
    assert all("best output_throughput_per_gpu 900" in line for line in lines[1::2])
    assert re.search(r"ETA \d+s", lines[5])


def test_heartbeat_only_after_a_quiet_interval(study_doc, monkeypatch):
    p, out = _printer(study_doc, monkeypatch, interval="30")
    p.trial_started()
    p.heartbeat(now=p.t0 + 10)
    assert out.getvalue() == ""
    p.heartbeat(now=p.t0 + 31)
    line = out.getvalue().strip()
    assert line.startswith("[0/4] done 0, running 1, not completed 0")
    assert "ETA -" in line and "elapsed 31s" in line  # no trial finished yet: no ETA to give
    p.heartbeat()  # just printed: quiet again
    assert out.getvalue().count("\n") == 1


def test_heartbeat_off(study_doc, monkeypatch):
    p, out = _printer(study_doc, monkeypatch, interval="0")
    p.heartbeat(now=p.t0 + 10_000)
    assert out.getvalue() == ""


def test_a_resumed_run_starts_from_its_recorded_best(study_doc, monkeypatch):
    """The first line after a resume shows the best recorded trial that meets the SLOs, not "-"."""
    import pandas as pd

    p, out = _printer(study_doc, monkeypatch)
    p.done = 3
    p.recorded(pd.DataFrame([
        {"status": "completed", "output_throughput_per_gpu": 900.0, "ttft_p99_ms": 150.0},
        {"status": "completed", "output_throughput_per_gpu": 2000.0, "ttft_p99_ms": 9000.0},  # misses the SLO
        {"status": "pruned", "output_throughput_per_gpu": None, "ttft_p99_ms": None},
    ]))
    p.trial_started()
    p.trial_finished({"status": "completed", "tid": "r-0003", "feasible": True,
                      "output_throughput_per_gpu": 500.0, "ttft_p99_ms": 100.0}, {"max_num_seqs": 64})
    line = out.getvalue().splitlines()[1]
    assert "best output_throughput_per_gpu 900" in line and "not completed 1" in line, line


def test_a_lost_or_unrecorded_trial_is_shown_with_the_classifiers_status_and_kind(study_doc, monkeypatch):
    """The progress line's status and kind for a trial whose actor died, and for a row that could not
    be written, come from orchestrator.failures: a status and a kind that exist."""
    import dataclasses
    from types import SimpleNamespace

    from orchestrator.failures import FailureKind, TrialStatus
    from orchestrator.search.optuna_search import SamplerReport
    from orchestrator.search.tune import tune_result
    from orchestrator.study import judge

    p, out = _printer(study_doc, monkeypatch)
    p.tune_callback().on_trial_error(0, [], SimpleNamespace(trial_id="r-0000", config={"max_num_seqs": 8}))
    assert "r-0000 error" in out.getvalue() and FailureKind.INTERNAL.value in out.getvalue()

    study = parse_study(study_doc)
    verdict = judge.judge(study, {"output_throughput_per_gpu": 900.0, "ttft_p99_ms": 150.0}, "completed")
    report = dataclasses.replace(SamplerReport.of(verdict, "completed"), write_error="No space left on device")
    shown = tune_result(study, {"trial_id": "r-0001", "status": "completed"}, verdict, report)
    assert TrialStatus(shown["status"]) is TrialStatus.ERROR
    assert FailureKind(shown["failure_kind"]) is FailureKind.INTERNAL
