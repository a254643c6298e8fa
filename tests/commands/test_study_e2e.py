"""End to end on a real local Ray cluster: Tune + Optuna -> Serve apps -> HTTP load -> Parquet."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pandas as pd
import pytest

from orchestrator.results import load_requests, load_trials, pareto_front
from orchestrator.results.ties import front_with_ties
from orchestrator.study.load import load_study
from orchestrator.study.spec import parse_study

pytestmark = pytest.mark.slow

# The quickstart's budget in the CLI test: past the sampler's 5 random start-up trials
# (orchestrator.search.samplers.default_startup_trials), so TPE proposes at least one.
QUICKSTART_TRIALS = 6


def small_study(tmp_path, **overrides):
    doc = {
        "name": "e2e",
        "seed": 3,
        "engine": {"kind": "sim", "transport": "serve"},  # every request through Serve's HTTP proxy
        "model": {"name": "llama-3.1-8b"},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": 2},
        "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 12, "warmup_requests": 1,
                     "input_len": {"kind": "uniform", "min": 100, "max": 400}, "output_len": 12,
                     "timeout_s": 60},
        # 0.25 x 80 GB leaves ~3.5 GiB for KV: enough for 8k tokens, not for one 128k sequence.
        "space": {"max_num_seqs": [2, 64], "max_model_len": [8192, 131072], "gpu_memory_utilization": 0.25},
        "objectives": ["maximize output_throughput_per_gpu", "minimize ttft_p99_ms"],
        "constraints": ["ttft_p99_ms <= 5000"],
        # The engine's own start refusal through Serve is what is tested: no pre-flight.
        "search": {"sampler": "grid", "preflight": False},
        "budget": {"trials": 4, "max_concurrent_trials": 2},
        "output": str(tmp_path / "out"),
    }
    doc.update(overrides)
    return parse_study(doc)


def test_small_study_through_serve_http(tmp_path):
    import ray
    from ray import serve

    from orchestrator.search import run_study

    study = small_study(tmp_path)
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, namespace="orchestrator")
    try:
        run = run_study(study, quiet=True, serve_port=8123)
        leftover = [a for a in serve.status().applications if a.startswith("tune-")]
        assert leftover == [], f"Serve apps left behind: {leftover}"
        actors = [a for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(("gpu-ledger", "results-sink"))]
        assert actors == []
    finally:
        ray.shutdown()

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
        assert f":8123/tune-{row['trial_id']}" in extra["endpoint"]  # went through the Serve proxy
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


def test_quickstart_cli(tmp_path, repo):
    """The README's quickstart: a row per trial, all their requests, pandas one-liner, printed front.

    The study file as shipped, with the trial budget cut from 16 to QUICKSTART_TRIALS (``--trials``):
    5 random start-up trials, then TPE proposes (the sampler's model is used), in 3 rounds of 2
    concurrent trials instead of 8. Nothing asserted here depends on the budget's size."""
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", "search_spaces/quickstart.yaml",
                        "--output", str(out), "--port", "8124", "--trials", str(QUICKSTART_TRIALS)],
                       cwd=repo, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stdout
    # The study writes no Tune result files (its rows are the results) and Tune does not warn about them.
    assert "Failed to fetch metrics" not in r.stderr, r.stderr[-3000:]
    study = load_study(repo / "search_spaces/quickstart.yaml")

    # The README's one-liner, verbatim apart from the path.
    one_liner = f"import pandas as pd; print(len(pd.read_parquet('{out}/quickstart/trials')))"
    n = subprocess.run([sys.executable, "-c", one_liner], capture_output=True, text=True, check=True)
    assert int(n.stdout.strip()) >= QUICKSTART_TRIALS  # pre-flight refusals are rows beyond the budget

    trials = pd.read_parquet(out / "quickstart" / "trials")
    assert len(trials) >= QUICKSTART_TRIALS
    not_ok = trials[trials["status"] != "completed"]
    assert not_ok["failure_kind"].notna().all() and not_ok["failure_message"].str.len().gt(0).all()
    requests = pd.read_parquet(out / "quickstart" / "requests")
    completed = trials[trials["status"] == "completed"]
    expected = study.workload.num_requests + completed.set_index("trial_id")["warmup_requests_used"]
    assert requests.groupby("trial_id").size().reindex(expected.index).eq(expected).all()

    # The printed front: the point values' front, and the rows only the noise keeps off it, marked.
    front = pareto_front(load_trials(out / "quickstart"), study.objectives, study.constraints)
    printed = dict(re.findall(r"^(r\d{8}-\d{6}-[a-z]{4}-\d{4}) (.*)$", r.stdout, flags=re.M))
    within_noise = {t for t, line in printed.items() if "on the front only within the noise" in line}
    assert sorted(set(printed) - within_noise) == sorted(front["trial_id"]), r.stdout[-2000:]
    noisy = front_with_ties(load_trials(out / "quickstart"), study.objectives, study.constraints)
    assert within_noise == set(noisy.loc[~noisy["strict_front"], "trial_id"]), r.stdout[-2000:]
    assert len(front) >= 1
