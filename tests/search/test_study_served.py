"""A study end to end through Serve's HTTP proxy, on the served unit's Ray (conftest's ``shared_serve``):
Tune + Optuna -> a Serve application per trial -> HTTP load -> Parquet, two trials at a time on two
logical GPUs, an engine that refuses to start recorded as a classified row."""

from __future__ import annotations

import json

import pytest

from conftest import shared_serve
from orchestrator.results import load_requests, load_trials
from orchestrator.study.spec import parse_study
from support.studies import sim_doc

pytestmark = pytest.mark.slow


def small_study(tmp_path):
    return parse_study(sim_doc(
        name="e2e", seed=3,
        engine={"mode": "served", "transport": "serve"},  # every request through Serve's HTTP proxy
        hardware={"gpus_per_node": 2},
        workload={"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 12, "warmup_requests": 1,
                  "input_len": {"kind": "uniform", "min": 100, "max": 400}, "output_len": 12, "timeout_s": 60},
        # 0.25 x 80 GB leaves ~3.5 GiB for KV: enough for 8k tokens, not for one 128k sequence.
        space={"max_num_seqs": [2, 64], "max_model_len": [8192, 131072], "gpu_memory_utilization": 0.25},
        objectives=["maximize output_throughput_per_gpu", "minimize ttft_p99_ms"],
        constraints=["ttft_p99_ms <= 5000"],
        # The engine's own start refusal through Serve is what is tested: no pre-flight.
        search={"sampler": "grid", "preflight": False},
        budget={"trials": 4, "max_concurrent_trials": 2},
        output=str(tmp_path / "out")))


def test_small_study_through_serve_http(tmp_path):
    import ray
    from ray import serve

    from orchestrator.search.driver import run_study

    study = small_study(tmp_path)
    port = shared_serve()  # the served unit's Ray: 2 logical GPUs, Serve's proxy on this port
    run = run_study(study, quiet=True, serve_port=port)
    leftover = [a for a in serve.status().applications if a.startswith("tune-")]
    assert leftover == [], f"Serve apps left behind: {leftover}"
    # This run's writer and ledger (named by its study and run: the unit's Ray may hold other tests' runs).
    suffix = f"-{study.name}-{run.run_id.replace('-', '')[-10:]}"
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True)
              if a["name"].startswith(("gpu-ledger", "results-sink")) and a["name"].endswith(suffix)]
    assert actors == []

    trials = load_trials(run.study_dir)
    assert len(trials) == 4 and trials["trial_id"].is_unique
    by_status = trials["status"].value_counts().to_dict()
    assert by_status == {"completed": 2, "infeasible": 2}, by_status

    bad = trials[trials["status"] == "infeasible"]
    assert (bad["max_model_len"] == 131072).all()
    assert (bad["failure_kind"] == "kv_cache_too_small").all()
    assert bad["failure_message"].str.contains("max seq len").all()

    ok = trials[trials["status"] == "completed"]
    assert (ok["max_model_len"] == 8192).all()
    assert (ok["completed"] == 12).all() and (ok["failed"] == 0).all()
    for _, row in ok.iterrows():
        extra = json.loads(row["extra_json"])
        assert f":{port}/tune-{row['trial_id']}" in extra["endpoint"]  # went through the Serve proxy
        assert row["num_requests_running_peak"] <= row["max_num_seqs"]
        assert row["output_throughput_per_gpu"] > 0 and row["ttft_p99_ms"] > 0

    requests = load_requests(run.study_dir, include_warmup=True)
    assert set(requests["trial_id"]) == set(ok["trial_id"])
    per_trial = requests.groupby("trial_id").size()
    # 12 measured + the warm-up (the burst of 1, then until steady), nothing dropped.
    warm = ok.set_index("trial_id")["warmup_requests_used"]
    assert (requests[~requests["warmup"]].groupby("trial_id").size() == 12).all()
    assert per_trial.reindex(warm.index).eq(12 + warm).all() and (warm > 1).all()
    assert (ok["warmup_s_used"] >= 2.0).all() and ok["warmup_converged"].notna().all()

    # Two GPUs, two concurrent trials: some trials overlapped in time.
    spans = sorted(zip(trials["started_at"], trials["finished_at"]))
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
