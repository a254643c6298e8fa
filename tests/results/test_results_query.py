"""load_trials / load_requests / best_under_slos."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pandas as pd
import pytest

from orchestrator.measure.records import RequestRecord
from orchestrator.results import ResultsStore, best_under_slos, load_requests, load_trials, requests_to_table
from orchestrator.study.spec import Constraint

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)


def row(study: str, i: int, *, run_id: str = "r1", days: float = 0, status: str = "completed", **kw) -> dict:
    out = dict(study=study, study_fingerprint="fp", run_id=run_id, trial_id=f"t{i}", trial_number=i,
               status=status, started_at=T0 + timedelta(days=days, minutes=i))
    out.update(kw)
    return out


def requests(study: str, trial_id: str, run_id: str = "r1", n: int = 4):
    recs = [RequestRecord(index=k, scheduled_s=k, sent_s=k, first_token_s=k + 0.1, end_s=k + 0.3,
                          token_times_s=[k + 0.1, k + 0.2, k + 0.3], warmup=k < 1) for k in range(n)]
    return requests_to_table(recs, study=study, run_id=run_id, trial_id=trial_id)


@pytest.fixture
def output(tmp_path):
    a = ResultsStore(tmp_path, "chat")
    pa_ = {"max_num_seqs": "int"}
    # written out of start order on purpose
    for i, days in [(2, 2), (0, 0), (1, 1), (3, 3)]:
        a.write_trial(row("chat", i, days=days, max_num_seqs=8 * (i + 1), output_throughput=10.0 * i,
                          status="failed" if i == 3 else "completed"),
                      requests("chat", f"t{i}"), param_types=pa_)
    a.write_trial(row("chat", 9, run_id="r2", days=3, max_num_seqs=64), None, param_types=pa_)
    b = ResultsStore(tmp_path, "rag")
    b.write_trial(row("rag", 0, kv_cache_dtype="fp8"), requests("rag", "t0"), param_types={"kv_cache_dtype": "string"})
    return tmp_path


def test_path_forms(output):
    both = load_trials(output)
    assert sorted(both["study"].unique()) == ["chat", "rag"]
    assert len(both) == 6
    # columns of both studies' parameters are there (null where not applicable)
    assert {"max_num_seqs", "kv_cache_dtype"} <= set(both.columns)
    assert len(load_trials(output, study="chat")) == 5
    assert len(load_trials(output / "chat")) == 5
    assert len(load_trials(output / "chat" / "trials")) == 5
    assert len(load_trials(str(output / "rag"))) == 1
    assert len(load_trials("file://" + str(output / "chat"))) == 5
    with pytest.raises(FileNotFoundError):
        load_trials(output / "missing")


def test_sorted_by_start_and_partitions_are_strings(output):
    df = load_trials(output, study="chat")
    assert list(df["trial_id"]) == ["t0", "t1", "t2", "t3", "t9"]
    assert df["started_at"].is_monotonic_increasing
    assert list(df["date"]) == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04", "2026-03-04"]
    assert isinstance(df["date"].dtype, pd.StringDtype) or df["date"].dtype == object
    assert not isinstance(df["run"].dtype, pd.CategoricalDtype)
    assert df["run"].tolist() == ["r1"] * 4 + ["r2"]
    assert df.index.tolist() == list(range(5))


@pytest.mark.parametrize("since", ["2026-03-02", date(2026, 3, 2), datetime(2026, 3, 2, 10, 1),
                                   datetime(2026, 3, 2, 10, 1, tzinfo=timezone.utc), "2026-03-02T11:01:00+01:00",
                                   pd.Timestamp("2026-03-02 10:00:30", tz="UTC")])
def test_since(output, since):
    df = load_trials(output, study="chat", since=since)
    assert list(df["trial_id"]) == ["t1", "t2", "t3", "t9"]


def test_since_within_a_day(output):
    assert list(load_trials(output, study="chat", since="2026-03-04T10:03:30Z")["trial_id"]) == ["t9"]


def test_status_and_run_filters(output):
    assert list(load_trials(output, study="chat", status="failed")["trial_id"]) == ["t3"]
    assert list(load_trials(output, study="chat", status=["failed", "completed"])["trial_id"]) == [
        "t0", "t1", "t2", "t3", "t9"]
    assert list(load_trials(output, study="chat", run="r2")["trial_id"]) == ["t9"]
    assert list(load_trials(output, run=["r1"], status="completed", since="2026-03-02")["trial_id"]) == ["t1", "t2"]
    assert load_trials(output, study="chat", status="pruned").empty


def test_empty_study_dir(tmp_path):
    (tmp_path / "s" / "trials").mkdir(parents=True)
    df = load_trials(tmp_path / "s")
    assert df.empty and "trial_id" in df.columns and "date" in df.columns


def test_load_requests(output):
    df = load_requests(output, study="chat")
    assert len(df) == 4 * 3 and not df["warmup"].any()
    assert len(load_requests(output, study="chat", include_warmup=True)) == 16
    sel = load_requests(output / "chat", trial_ids=["t1", "t2"])
    assert sorted(sel["trial_id"].unique()) == ["t1", "t2"]
    assert sel.groupby("trial_id")["request_index"].apply(list).tolist() == [[1, 2, 3], [1, 2, 3]]
    assert len(load_requests(output / "chat" / "trials", trial_ids=["t0"])) == 3  # sibling table
    assert len(load_requests(output)) == 15  # both studies
    assert load_requests(output, trial_ids=[]).empty
    assert set(df["date"]) <= {"2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"}


def test_best_under_slos():
    df = pd.DataFrame({
        "trial_id": ["a", "b", "c", "d", "e", "f"],
        "status": ["completed", "completed", "completed", "failed", "completed", "completed"],
        "output_throughput": [100.0, 300.0, 200.0, 900.0, None, 200.0],
        "ttft_p99_ms": [50.0, 500.0, 80.0, 10.0, 10.0, 90.0],
    })
    slo = [Constraint.model_validate("ttft_p99_ms <= 100")]
    best = best_under_slos(df, "output_throughput", "maximize", slo)
    assert list(best["trial_id"]) == ["c", "f", "a"]  # b breaks the SLO, d failed, e has no value; ties stable
    assert list(best_under_slos(df, "ttft_p99_ms", "minimize", ["output_throughput >= 150"])["trial_id"]) == [
        "c", "f", "b"]
    assert best_under_slos(df, "output_throughput", "maximize", ["ttft_p99_ms < 1"]).empty
    with pytest.raises(ValueError, match="direction"):
        best_under_slos(df, "output_throughput", "up", [])
