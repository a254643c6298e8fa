"""Faults, packing and a lost node on a multi-node local Ray cluster with fake GPUs (2 nodes x 4).

One ``ray.cluster_utils.Cluster`` for the module (a head without GPUs and two worker
nodes of 4 logical GPUs each), three studies of the served simulator on it, in order:

1. fault injection (``engine.faults`` with ``when``): a crash while starting, an out-of-memory
   under load, a process crash under load and a healthy control, each a classified row (an
   engine that never becomes ready: test_engine_conformance, within a short start timeout);
2. TP 2 and 4 trials (12 GPUs' worth, all at once, on 8) packed onto the nodes: from the rows'
   own timestamps and the node each replica really ran on, no node ever holds more than its 4 GPUs;
3. a worker node removed while trials run on it: the study still finishes, every trial
   is a classified row.

After each: no Serve application, replica, ledger or sink left alive; every Parquet file
reads back whole.
"""

from __future__ import annotations

import json
import threading
import time

import pandas as pd
import pytest

from orchestrator.results import load_requests, load_trials
from orchestrator.study.spec import parse_study
from support.studies import merged, sim_doc

pytestmark = pytest.mark.slow

SERVE_PORT = 8302
GPUS_PER_NODE = 4

BASE = sim_doc(
    seed=1, engine={"mode": "served"}, hardware={"gpus_per_node": GPUS_PER_NODE, "nodes": 2},
    workload={"arrival": {"kind": "poisson", "rate": 6}, "num_requests": 18, "warmup_requests": 0,
              "input_len": {"kind": "uniform", "min": 100, "max": 300}, "output_len": 48, "timeout_s": 30},
    objectives=["maximize output_throughput_per_gpu"], search={"sampler": "grid"})


def study_of(tmp_path, name: str, **parts):
    """:data:`BASE` with ``parts`` merged in, section by section."""
    return parse_study(merged(BASE, name=name, output=str(tmp_path / "out"), **parts))


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 0, "include_dashboard": False})
    workers = [c.add_node(num_cpus=4, num_gpus=GPUS_PER_NODE) for _ in range(2)]
    ray.init(address=c.address, namespace="orchestrator", logging_level="ERROR")
    try:
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()


def assert_nothing_left() -> None:
    from ray import serve
    from ray._private.state import actors  # the GCS's actor table (the state API needs a dashboard)

    assert [a for a in serve.status().applications if a.startswith("tune-")] == []
    alive = [a["ActorClassName"] for a in actors().values() if a["State"] == "ALIVE"]
    assert not [a for a in alive if "SimLLMServer" in a or a in ("GpuLedgerActor", "ResultsSinkActor",
                                                                 "ImplicitFunc")], alive


# ------------------------------------------------------------------ 1. faults
EXPECTED = {  # max_num_seqs -> (status, failure kind, words of the message)
    8: ("failed", "start_crash", "Engine core initialization failed"),
    32: ("failed", "runtime_oom", "CUDA out of memory"),
    64: ("failed", "engine_died", "/health failed"),
    128: ("completed", None, None),
}


def test_each_fault_is_classified_and_cleaned_up(cluster, tmp_path):
    from orchestrator.search.driver import run_study

    study = study_of(
        tmp_path, "faults", space={"max_num_seqs": sorted(EXPECTED)},
        # 60 s: on a busy 2-core machine four replica processes starting at once take 20-40 s.
        engine={"kind": "sim", "start_timeout_s": 60, "faults": [
            {"kind": "start_crash", "after_s": 0.5, "when": {"max_num_seqs": 8}},
            {"kind": "oom", "after_requests": 3, "when": {"max_num_seqs": 32}},
            {"kind": "crash", "after_s": 1.0, "when": {"max_num_seqs": 64}},  # 1 s into the load
        ]},
        budget={"trials": len(EXPECTED), "max_concurrent_trials": len(EXPECTED)})
    run = run_study(study, quiet=True, serve_port=SERVE_PORT)
    assert_nothing_left()

    trials = load_trials(run.study_dir)
    assert len(trials) == len(EXPECTED) and trials["trial_id"].is_unique
    for _, row in trials.iterrows():
        status, kind, words = EXPECTED[row["max_num_seqs"]]
        assert row["status"] == status, (row["max_num_seqs"], row["status"], row["failure_message"])
        if kind is not None:
            assert row["failure_kind"] == kind and words in row["failure_message"], \
                (row["max_num_seqs"], row["failure_kind"], row["failure_message"])
    assert (trials.loc[trials["status"] == "completed", "completed"] == 18).all()
    died = trials[trials["failure_kind"].isin(["runtime_oom", "engine_died"])]
    assert (died["failed"] > 0).all()  # requests in flight when the engine died count as failed
    assert set(load_requests(run.study_dir)["trial_id"]) <= set(trials["trial_id"])


# ------------------------------------------------------------------ 2. packing
def gpus_in_use_per_node(trials: pd.DataFrame) -> dict[str, int]:
    """Most GPUs held at once on each node, from the rows alone: a replica holds ``gpus`` on
    the node it reported from deploy start (start + queue) to teardown end (+ its phases)."""
    events = []
    for _, r in trials[trials["status"] == "completed"].iterrows():
        node = json.loads(r["extra_json"])["engine_facts"]["node_id"]
        start = r["started_at"].timestamp() + r["queue_s"]
        end = start + r["startup_s"] + r["load_window_s"] + r["teardown_s"]
        events += [(start, +int(r["gpus"]), node), (end, -int(r["gpus"]), node)]
    used: dict[str, int] = {}
    peak: dict[str, int] = {}
    for _, delta, node in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        used[node] = used.get(node, 0) + delta
        peak[node] = max(peak.get(node, 0), used[node])
    return peak


def test_tensor_parallel_trials_pack_without_oversubscribing(cluster, tmp_path):
    from orchestrator.search.driver import run_study

    _, workers = cluster
    study = study_of(tmp_path, "packing", space={"tensor_parallel_size": [2, 4], "max_num_seqs": [32, 64]},
                     budget={"trials": 4, "max_concurrent_trials": 8})
    run = run_study(study, quiet=True, serve_port=SERVE_PORT)
    assert_nothing_left()

    trials = load_trials(run.study_dir)
    assert (trials["status"] == "completed").all(), trials[["status", "failure_message"]]
    assert sorted(trials["gpus"]) == [2, 2, 4, 4]
    worker_ids = {w.node_id for w in workers}
    peak = gpus_in_use_per_node(trials)
    assert set(peak) <= worker_ids  # replicas only where the GPUs are
    assert all(v <= GPUS_PER_NODE for v in peak.values()), peak
    assert all(used <= total == GPUS_PER_NODE for used, total in run.gpu_peaks.values()), run.gpu_peaks
    assert sum(used for used, _ in run.gpu_peaks.values()) > GPUS_PER_NODE  # both nodes busy at once


# ------------------------------------------------------------------ 3. a node lost
def test_study_finishes_when_a_node_dies(cluster, tmp_path):
    from ray._private.state import actors

    from orchestrator.search.driver import run_study

    c, workers = cluster
    study = study_of(tmp_path, "nodeloss", space={"max_num_seqs": [16, 32, 64, 128]},
                     workload={"arrival": {"kind": "poisson", "rate": 2}, "num_requests": 16},
                     budget={"trials": 4, "max_concurrent_trials": 8, "trial_retries": 1})
    box: dict = {}
    driver = threading.Thread(target=lambda: box.update(run=run_study(study, quiet=True, serve_port=SERVE_PORT)))
    driver.start()
    deadline = time.monotonic() + 240
    victim = None
    while victim is None and time.monotonic() < deadline:  # wait until a replica serves on a worker
        serving = {a["Address"]["NodeID"] for a in actors().values()
                   if a["State"] == "ALIVE" and "SimLLMServer" in a["ActorClassName"]}
        victim = next((w for w in workers if w.node_id in serving), None)
        time.sleep(0.5)
    assert victim is not None, "no replica ever started"
    c.remove_node(victim, allow_graceful=False)  # its trial is starting, warming up or under load
    driver.join(timeout=600)
    assert not driver.is_alive() and "run" in box
    assert_nothing_left()

    trials = load_trials(box["run"].study_dir)
    assert len(trials) == 4 and trials["trial_id"].is_unique
    assert set(trials["status"]) <= {"completed", "failed", "error"}
    # The trial whose replica was on the lost node failed, and says why; the others ran to the end.
    hit = trials[trials["status"] != "completed"]
    assert len(hit) >= 1, trials[["status", "failure_kind"]]
    assert set(hit["failure_kind"]) <= {"engine_died", "unresponsive", "start_crash", "start_timeout"}, \
        hit[["failure_kind", "failure_message"]]
    assert hit["failure_message"].str.len().gt(0).all()
    assert set(load_requests(box["run"].study_dir)["trial_id"]) <= set(trials["trial_id"])
