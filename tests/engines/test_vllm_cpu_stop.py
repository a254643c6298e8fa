"""A stopped study stops: real vLLM (the CPU build) under ``orchestrator run``, as ``ray job submit`` runs
it on a cluster (``--address``: the engine unit's Ray).

* SIGKILL of the driver: nothing runs in it, so the cluster keeps the run's engine; the next run of the
  study ends it before its first trial (the Serve applications of runs whose driver is gone are deleted,
  and each engine's supervisor takes its process group with its replica).
* SIGTERM (``ray job stop``, a CronJob's deadline) while an engine serves a trial: the driver exits 143
  with one line, within 30 s of the signal no vLLM process of the run is left and no Serve application,
  and the same command resumes the run to its end.

One test, three runs of one study: two engine starts instead of four."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO
from orchestrator.results import load_trials
from support.vllm_processes import one_process, vllm_processes

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KV_BYTES = 8 << 20


def _study_file(tmp_path, name: str) -> str:
    from orchestrator.models.modelgen import make_model_dir

    model_dir = tmp_path / "tiny-llama"
    if not model_dir.exists():
        make_model_dir("tiny-llama", model_dir, weights="random", max_position_embeddings=2048)
    doc = {
        "name": name, "seed": 2,
        "engine": one_process({"kind": "vllm", "platform": "cpu", "model_source": str(model_dir),
                               "start_timeout_s": 600, "engine_kwargs": {"kv_cache_memory_bytes": KV_BYTES}}),
        "model": {"name": "tiny-llama", "dtype": "float32"},
        "hardware": {"gpu": "CPU"},
        # A load of about 15 s: the signal lands while the engine serves it.
        "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 60, "warmup_requests": 1,
                     "input_len": {"kind": "uniform", "min": 100, "max": 200}, "output_len": 8, "timeout_s": 60},
        "space": {"max_num_seqs": 4, "max_model_len": 1024, "enforce_eager": True},
        "objectives": ["maximize output_throughput"],
        "search": {"sampler": "grid", "preflight": False},
        "budget": {"trials": 1, "max_concurrent_trials": 1},
        "output": str(tmp_path / "out"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _run(study: str, engine_cluster) -> subprocess.Popen:
    import ray

    cmd = [sys.executable, "-m", "orchestrator.cli", "run", study, "--quiet",
           "--address", ray.get_runtime_context().gcs_address, "--port", str(engine_cluster.serve_port)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_engine(cache_root, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if vllm_processes(cache_root, kinds=("vllm.entrypoints",)):
            time.sleep(3.0)  # serving: past its start, into the load
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    raise AssertionError("no vLLM engine started")


def _engines_gone(cache_root, deadline: float) -> list:
    while time.monotonic() < deadline:
        left = vllm_processes(cache_root)
        if not left:
            return []
        time.sleep(0.5)
    return [p.cmdline()[:3] for p in vllm_processes(cache_root)]


def _apps(prefix: str) -> list[str]:
    from ray import serve

    return [a for a in serve.status().applications if a.startswith(prefix)]


def test_a_killed_driver_s_engine_ends_with_the_next_run_which_sigterm_stops_and_which_resumes(tmp_path,
                                                                                              engine_cluster):
    cache_root = engine_cluster.cache_root
    study = _study_file(tmp_path, "stop")
    # SIGKILL of the driver: nothing runs in it, so the cluster keeps the run's engine ...
    first = _run(study, engine_cluster)
    _wait_for_engine(cache_root, first)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and nothing else: the cluster outlives it
    first.communicate(timeout=30)
    orphans = [p.pid for p in vllm_processes(cache_root)]
    assert orphans, "the engine of a killed driver's run is the cluster's until a run cleans it up"

    # ... until the next run of the study, which deletes the dead driver's application before its first
    # trial (its own run: it resumes it) and starts an engine of its own.
    second = _run(study, engine_cluster)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in orphans):
        time.sleep(0.5)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in orphans), "the next run left the old engine running"
    _wait_for_engine(cache_root, second)

    # SIGTERM while that engine serves: 143 and one line, no vLLM process within 30 s, no Serve application.
    second.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, err = second.communicate(timeout=90)
    assert second.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in err.strip().splitlines()[-1] and "Traceback" not in err, err[-2000:]
    assert _engines_gone(cache_root, t0 + 30) == [], "a vLLM process outlived the stop"
    assert _apps("tune-") == []

    # The same command resumes the run to its end.
    third = _run(study, engine_cluster)
    _, err = third.communicate(timeout=600)
    assert third.returncode == 0, err[-2000:]
    trials = load_trials(tmp_path / "out" / "stop")
    assert (trials["status"] == "completed").sum() == 1, trials[["status", "failure_kind"]]
    assert trials["run_id"].nunique() == 1  # resumed: the same run
    assert _engines_gone(cache_root, time.monotonic() + 30) == []
