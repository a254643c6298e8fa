"""``ray job submit --working-dir . -- orchestrator run ...`` against a local Ray head with the dashboard.

The head is started and stopped with ``clusters/local.sh`` (``ray start --head --block``
in a process group of its own, with its own temp dir, ports and auth token; ``stop``
ends that process group only): other Ray clusters on the machine are left alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO
from support.scheduling import step_back_session

BIN = Path(sys.executable).parent
# Dashboard, GCS, client server, agent (listen, grpc), metrics, runtime-env agent, node manager, object manager, Serve.
PORTS = dict(dashboard=8480, gcs=8481, client=8482, agent_listen=8483, agent_grpc=8484, metrics=8485,
             runtime_env=8486, node_manager=8487, object_manager=8488, serve=8489)

pytestmark = pytest.mark.slow


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no conflict
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.fixture(scope="module")
def ray_head():
    """A head started (and stopped) by the documented recipe, clusters/local.sh, on ports of its own."""
    busy = [f"{k}={p}" for k, p in PORTS.items() if not _free(p)]
    assert not busy, f"ports needed by the local Ray head are in use: {busy}"
    local_dir = Path(f"/tmp/rayjobs-{os.getpid()}")  # short: Ray's socket paths must fit in 107 bytes
    extra = (f"--ray-client-server-port={PORTS['client']} --dashboard-agent-listen-port={PORTS['agent_listen']} "
             f"--dashboard-agent-grpc-port={PORTS['agent_grpc']} --metrics-export-port={PORTS['metrics']} "
             f"--runtime-env-agent-port={PORTS['runtime_env']} --node-manager-port={PORTS['node_manager']} "
             f"--object-manager-port={PORTS['object_manager']}")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "RAY": str(BIN / "ray"),
           "RAY_LOCAL_DIR": str(local_dir), "DASHBOARD_PORT": str(PORTS["dashboard"]), "GCS_PORT": str(PORTS["gcs"]),
           "NUM_CPUS": "4", "NUM_GPUS": "2", "RAY_START_ARGS": extra,
           # what local.sh exports, for the `ray job` commands of the test itself
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(local_dir / "auth_token")}
    recipe = [str(REPO / "clusters" / "local.sh")]
    try:
        for _ in range(2):  # a loaded machine can miss Ray's 30 s raylet registration once
            up = subprocess.run(recipe + ["start"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
            if up.returncode == 0:
                break
            subprocess.run(recipe + ["stop"], env=env, cwd=REPO, capture_output=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        step_back_session(int((local_dir / "head.pid").read_text()))  # a session of its own (setsid)
        yield f"http://127.0.0.1:{PORTS['dashboard']}", env, local_dir / "ray", local_dir / "head.log"
    finally:
        down = subprocess.run(recipe + ["stop"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        shutil.rmtree(local_dir, ignore_errors=True)
        assert down.returncode == 0, down.stderr


def _ray(env, *args, timeout=600):
    return subprocess.run([str(BIN / "ray"), *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _submit(env, *args):
    """``ray job submit``, retried while the head's job agent is still registering (a fresh cluster)."""
    deadline = time.monotonic() + 120
    while True:
        r = _ray(env, "job", "submit", *args)
        if "No available agent to submit job" not in r.stdout + r.stderr or time.monotonic() > deadline:
            return r
        time.sleep(3)


def test_quickstart_through_ray_job_submit(ray_head, tmp_path):
    address, env, temp, head_log = ray_head
    output = tmp_path / "shared" / "results"  # a mounted path, named through pyarrow's file:// filesystem
    job_env = '{"env_vars": {"ORCHESTRATOR_PROGRESS_INTERVAL_S": "15"}}'
    r = _submit(env, "--address", address, "--submission-id", "quickstart-ci", "--working-dir", ".",
             "--runtime-env-json", job_env, "--",
             "orchestrator", "run", "search_spaces/quickstart.yaml", "--trials", "2",
             "--output", output.as_uri(), "--port", str(PORTS["serve"]))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:] + "\nhead:\n" + head_log.read_text()[-2000:]
    assert "Job 'quickstart-ci' succeeded" in r.stdout + r.stderr

    # The working dir went up without the virtual environment and local results.
    uploaded = [p for p in (temp / "session_latest" / "runtime_resources" / "working_dir_files").iterdir()
                if p.is_dir()]
    assert len(uploaded) == 1, uploaded
    names = {p.name for p in uploaded[0].iterdir()}
    assert {"orchestrator", "search_spaces", "pyproject.toml"} <= names
    assert not names & {".venv", "results", ".git"}, names

    # Progress (counts, best, ETA) is in the job's logs.
    logs = _ray(env, "job", "logs", "--address", address, "quickstart-ci", timeout=120)
    assert logs.returncode == 0, logs.stderr
    assert "[1/2]" in logs.stdout and "[2/2]" in logs.stdout
    assert "ETA" in logs.stdout and "done 2, running 0" in logs.stdout

    # The Parquet output is readable afterwards, with plain pandas.
    trials = pd.read_parquet(output / "quickstart" / "trials")
    assert len(trials) == 2 and set(trials["status"]) <= {"completed", "infeasible"}
    completed = trials[trials["status"] == "completed"]
    requests = pd.read_parquet(output / "quickstart" / "requests")
    assert set(requests["trial_id"]) == set(completed["trial_id"])
    assert (output / "quickstart" / "study.json").exists()


def _run_on(ray_head, tmp_path, study_doc, space, faults=(), trials=2):
    """``orchestrator run`` of a small served-sim study against the head; (result, output folder)."""
    _, env, _, _ = ray_head
    study_doc.update(name="tiny-cluster", seed=1)
    study_doc["engine"] = {"kind": "sim", "faults": list(faults), "start_timeout_s": 30}
    study_doc["hardware"] = {"gpu": "H100-80GB", "gpus_per_node": 8}
    study_doc["workload"] = {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 8, "output_len": 8}
    study_doc["space"] = space
    study_doc["budget"] = {"trials": trials, "max_concurrent_trials": 1}
    study_doc["output"] = str(tmp_path / "out")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study_doc))
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(path), "--address",
                        f"127.0.0.1:{PORTS['gcs']}", "--port", str(PORTS["serve"])], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    return r, tmp_path / "out"


def test_a_cluster_that_can_never_place_a_trial_stops_before_the_first(ray_head, tmp_path, study_doc):
    """The head has 2 GPUs; every configuration needs 4 or 8 on one node."""
    t0 = time.monotonic()
    r, out = _run_on(ray_head, tmp_path, study_doc, {"max_num_seqs": 8, "tensor_parallel_size": [4, 8]})
    text = r.stdout + r.stderr
    assert r.returncode == 1, text[-3000:]
    assert "Traceback" not in text
    assert ("stopped before any trial: every configuration needs at least 4 GPU on one node, but its largest "
            "node has 2 GPU") in r.stderr, text[-3000:]
    assert "--num-gpus" in r.stderr and "clusters/local.sh" in r.stderr
    assert not list(out.rglob("*.parquet"))
    assert time.monotonic() - t0 < 120  # no trial waited out its start timeout


def test_a_study_in_which_no_trial_completed_exits_non_zero(ray_head, tmp_path, study_doc):
    r, out = _run_on(ray_head, tmp_path, study_doc, {"max_num_seqs": 8}, faults=[{"kind": "start_crash"}], trials=1)
    text = r.stdout + r.stderr
    assert r.returncode == 1, text[-3000:]
    assert "Traceback" not in text
    assert "no trial completed" in r.stderr, text[-3000:]
    assert len(list((out / "tiny-cluster" / "trials").rglob("*.parquet"))) == 1
