"""The ``external`` engine: an endpoint that already runs, an API key that is never recorded."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from orchestrator.results import ResultsStore
from orchestrator.results.definition import write_study_definition
from orchestrator.results.schema import requests_to_table
from orchestrator.study.spec import StudyFileError, parse_study
from orchestrator.trial.run import TrialContext
from support.fake_openai import API_KEY, fake, server  # noqa: F401 - the fake OpenAI server fixtures
from support.recorded_trial import run_trial
from support.studies import external_doc


def external_study(base_url: str, tmp_path, **engine):
    return parse_study(external_doc(
        base_url, engine=engine, workload={"timeout_s": 10},
        space={"max_num_seqs": 256},  # what the endpoint is known to run: recorded, not applied
        output=str(tmp_path / "out")))


def run(study):
    return run_trial(study, {"max_num_seqs": 256}, trial_id="t1", trial_number=0, ctx=TrialContext("r1"))


def test_measures_the_endpoint_and_never_records_the_key(fake, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("ENDPOINT_KEY", API_KEY)
    caplog.set_level(logging.DEBUG)
    study = external_study(fake.url(""), tmp_path, api_key_env="ENDPOINT_KEY")
    out = run(study)
    row = out.row
    assert row["status"] == "completed", row.get("failure_message")
    assert row["completed"] == 20 and row["engine"] == "external"
    assert json.loads(row["extra_json"])["engine_facts"]["served_models"] == ["fake"]
    stats = fake.stats()
    assert stats["auth"] and set(stats["auth"]) == {f"Bearer {API_KEY}"}  # sent with every request
    assert {b["model"] for b in stats["bodies"]} == {"fake"}  # the served model, from /v1/models

    store = ResultsStore(study.output, study.name)
    store.write_trial(row, requests_to_table(out.records, study="ext", run_id="r1", trial_id="t1"),
                      param_types=study.space.column_types())
    write_study_definition(study)
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert len(files) >= 3
    assert not [p for p in files if API_KEY.encode() in p.read_bytes()]
    assert b"ENDPOINT_KEY" in (tmp_path / "out" / "ext" / "study.json").read_bytes()  # the name only
    assert API_KEY not in json.dumps(row, default=str) and API_KEY not in caplog.text


def test_a_missing_key_variable_is_an_infeasible_trial(fake, tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    row = run(external_study(fake.url(""), tmp_path, api_key_env="NOT_SET_ANYWHERE")).row
    assert row["status"] == "infeasible" and row["failure_kind"] == "invalid_args"
    assert "NOT_SET_ANYWHERE" in row["failure_message"]


def test_an_unreachable_endpoint_fails_within_its_start_timeout(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the block ends
    row = run(external_study(f"http://127.0.0.1:{port}", tmp_path, start_timeout_s=1)).row
    assert row["status"] == "failed" and row["failure_kind"] == "start_timeout"
    assert "did not answer within 1 s" in row["failure_message"] and row["wall_time_s"] < 5


def test_a_model_the_endpoint_does_not_serve(fake, tmp_path):
    row = run(external_study(fake.url(""), tmp_path, model_name="llama-70b")).row
    assert row["status"] == "infeasible" and "does not serve 'llama-70b'; it serves: fake" in row["failure_message"]


@pytest.mark.parametrize("key, url, message", [
    ("base_url", "http://user:PLANTED-9f3@127.0.0.1:8000", "credentials do not belong in the URL"),
    ("base_url", "127.0.0.1:8000", "expected an http:// or https:// URL"),
    ("base_url", "http://127.0.0.1:8000/?api_key=PLANTED-9f3", "the query string carries a credential (api_key)"),
    ("base_url", "https://gw.example/v1?x=1&access_token=PLANTED-9f3", "a credential (access_token)"),
    ("metrics_url", "http://127.0.0.1:8000/metrics?sig=PLANTED-9f3", "a credential (sig)"),
    ("base_url", "https://gw.example/#access_token=PLANTED-9f3&token_type=bearer",
     "the fragment carries a credential (access_token)"),
])
def test_bad_urls_are_refused_when_the_study_loads_without_echoing_a_credential(tmp_path, key, url, message):
    engine = {"metrics_url": url} if key == "metrics_url" else {}
    with pytest.raises(StudyFileError) as e:
        external_study("http://127.0.0.1:8000" if engine else url, tmp_path, **engine)
    assert f"engine.{key}" in str(e.value) and message in str(e.value)
    assert "PLANTED" not in str(e.value)


def test_a_base_url_with_a_query_string_keeps_it_after_the_routes(fake, tmp_path):
    """The routes go into the URL's path, the query string stays last (an API-version parameter)."""
    row = run(external_study(fake.url("/trial-3") + "?api-version=2024-06", tmp_path)).row
    assert row["status"] == "completed", row.get("failure_message")
    queries = fake.stats()["queries"]
    assert len(queries) >= 21 and set(queries) == {"api-version=2024-06"}  # warm-up and measured requests


def test_capacity_search_against_an_endpoint(fake, tmp_path):
    doc = external_study(fake.url(""), tmp_path).model_dump(mode="json", exclude={"source_path"})
    doc["capacity"] = {"start_rate": 10, "max_rate": 40, "requests_per_level": 15}
    doc["constraints"] = ["ttft_p99_ms <= 1000"]
    out = run(parse_study(doc))
    assert [lv["rate"] for lv in out.levels] == [10, 20, 40]
    assert out.row["capacity_rps"] == 40 and all(lv["slo_met"] for lv in out.levels)
    assert json.loads(out.row["extra_json"])["capacity"]["stop_reason"] == "max_rate (40/s) met the SLOs"
