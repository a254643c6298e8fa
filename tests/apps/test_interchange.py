"""vllm bench serve result JSON: export a trial in its layout, import its files as external rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.apps.interchange import from_bench_result, records_from_bench, to_bench_result
from orchestrator.cli import main
from orchestrator.results import ResultsStore, load_requests, load_trials
from orchestrator.results.definition import write_study_definition
from orchestrator.results.schema import requests_to_table
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import sim_doc

DATA = Path(__file__).resolve().parents[1] / "data"
SAMPLE = DATA / "vllm_bench_rate64_S256.json"  # written by vllm bench serve 0.26 on an H200


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A completed virtual-sim trial written to a results dataset (with its study.json)."""
    out = tmp_path_factory.mktemp("res")
    study = parse_study(sim_doc(
        name="ix", workload={"arrival": {"kind": "gamma", "rate": 12, "burstiness": 0.5}, "num_requests": 80,
                             "input_len": {"kind": "uniform", "min": 100, "max": 900}, "output_len": 48},
        space={"max_num_seqs": [16, 64]}, constraints=["ttft_p99_ms <= 2000"], output=str(out)))
    o = run_trial(study, {"max_num_seqs": 16}, trial_id="t1", trial_number=0, ctx=TrialContext("r1"))
    ResultsStore(out, "ix").write_trial(o.row, requests_to_table(o.records, study="ix", run_id="r1", trial_id="t1"),
                                        param_types=study.space.column_types())
    write_study_definition(study)
    return study, out / "ix", o.row


def exported(stored):
    study, path, _ = stored
    trial = load_trials(path).iloc[0].to_dict()
    return to_bench_result(trial, load_requests(path, trial_ids=["t1"], include_warmup=True),
                           slo=study.request_slo())


def test_export_has_vllms_layout_and_the_trials_numbers(stored):
    _, _, row = stored
    bench = exported(stored)
    sample = json.loads(SAMPLE.read_text())
    assert set(sample) <= set(bench), set(sample) - set(bench)
    for key, ours in [("completed", "completed"), ("failed", "failed"), ("duration", "duration_s"),
                      ("request_throughput", "request_throughput"), ("output_throughput", "output_throughput"),
                      ("total_input_tokens", "total_input_tokens"), ("request_goodput", "goodput"),
                      ("mean_ttft_ms", "ttft_mean_ms"), ("median_ttft_ms", "ttft_p50_ms"),
                      ("p99_ttft_ms", "ttft_p99_ms"), ("p90_tpot_ms", "tpot_p90_ms"), ("mean_itl_ms", "itl_mean_ms"),
                      ("p99_e2el_ms", "e2el_p99_ms")]:
        assert bench[key] == pytest.approx(row[ours], rel=1e-5), key
    assert bench["request_rate"] == 12 and bench["burstiness"] == 0.5 and bench["num_prompts"] == 80
    assert len(bench["ttfts"]) == len(bench["itls"]) == len(bench["errors"]) == 80
    assert all(len(itl) == 47 for itl in bench["itls"]) and set(bench["errors"]) == {""}


def test_export_then_import_gives_the_same_metrics(stored):
    _, _, row = stored
    bench = exported(stored)
    raw = json.dumps(bench).encode()
    imported, records = from_bench_result(bench, raw=raw, source="x.json", study_name="ix", fingerprint="f",
                                          param_types={}, gpus=1)
    assert len(records) == 80
    for m in ("completed", "request_throughput", "output_throughput", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
              "itl_p99_ms", "e2el_mean_ms", "max_concurrency"):
        assert imported[m] == pytest.approx(row[m], rel=1e-4), m
    assert imported["engine"] == "external" and imported["sched_lag_p99_ms"] is None


def test_import_a_summary_only_file_maps_its_fields():
    data = json.loads(SAMPLE.read_text())
    row, records = from_bench_result(data, raw=SAMPLE.read_bytes(), source=SAMPLE.name, study_name="s",
                                     fingerprint="f", param_types={}, gpus=1, gpu="H200")
    assert records is None
    assert row["ttft_p99_ms"] == data["p99_ttft_ms"] and row["ttft_p50_ms"] == data["median_ttft_ms"]
    assert row["tpot_mean_ms"] == data["mean_tpot_ms"] and row["ttft_p90_ms"] is None  # not in the file
    assert row["output_throughput_per_gpu"] == data["output_throughput"]
    assert row["num_requests"] == data["completed"] + data["failed"] and row["requested_rate"] == 64
    assert row["started_at"].strftime("%Y%m%d-%H%M%S") == data["date"]


def test_import_bench_cli_adds_rows_to_a_study_dataset(stored, tmp_path, capsys):
    study, path, _ = stored
    data = json.loads(SAMPLE.read_text())
    data["max_num_seqs"] = "256"  # what `vllm bench serve --metadata max_num_seqs=256` writes
    mine = tmp_path / "bench.json"
    mine.write_text(json.dumps(data))
    detailed = tmp_path / "detailed.json"
    detailed.write_text(json.dumps(exported(stored)))
    bad = tmp_path / "bad.json"
    bad.write_text('{"completed": 1}')
    cmd = ["import-bench", str(mine), str(detailed), str(bad), "--into", str(path), "--gpus", "1"]
    assert main(cmd) == 1
    assert f"{bad}: not a vllm bench serve result" in capsys.readouterr().err
    assert main(cmd) == 1  # importing again replaces, never duplicates
    trials = load_trials(path)
    ext = trials[trials["engine"] == "external"]
    assert len(ext) == 2 and (ext["engine_mode"] == "vllm-bench-serve").all()
    one = ext[ext["extra_json"].str.contains("bench.json")].iloc[0]
    assert one["max_num_seqs"] == 256 and one["ttft_p99_ms"] == data["p99_ttft_ms"]
    assert bool(one["feasible"]) == (data["p99_ttft_ms"] <= 2000)  # the study's SLO applied
    requests = load_requests(path, trial_ids=list(ext["trial_id"]))
    assert len(requests) == 80  # only the detailed file had per-request lists


def test_export_bench_cli(stored, tmp_path, capsys):
    _, path, _ = stored
    out = tmp_path / "t1.json"
    assert main(["export-bench", str(path), "--trial", "t1", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["label"] == "orchestrator:ix/t1"
    assert main(["export-bench", str(path), "--trial", "nope"]) == 2
    assert "no trial 'nope'" in capsys.readouterr().err


def test_per_request_lists_must_agree():
    bench = {"start_times": [0.0, 1.0], "ttfts": [0.1], "itls": [[]], "input_lens": [1], "output_lens": [1],
             "errors": [""]}
    with pytest.raises(ValueError, match="different lengths"):
        records_from_bench(bench)

