"""A second stop signal skips the bookkeeping but still ends the engines (``search/stop_signals.py``).

* The signal handling alone, in a process of its own: the first signal runs what the driver registered
  to end the engines at once, in a thread; a second one waits for that, runs the hard stop and exits
  with 128 + its signal, cutting the bookkeeping short.
* A served-simulator study on the served unit's Ray (``orchestrator run --address``: the cluster outlives
  the driver, so shutting Ray down in the driver ends no replica): SIGTERM then SIGINT while its trial's
  engine serves. The driver exits at once; within 30 s the run's Serve application and replica are gone;
  the trial is left as a killed driver leaves it (running in the journal, for the next run to mark).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest
import yaml

from conftest import REPO, SHARED_SERVE_PORT, shared_serve
from support.studies import sim_doc

pytestmark = pytest.mark.slow

# The driver's part: a block of stop_on_signals with a hard stop and an engine-ending step that leave
# marks in a folder, then bookkeeping that takes ``argv[2]`` seconds once a signal came.
DRIVER = """\
import sys, time
from pathlib import Path
from orchestrator.search import stop_signals
marks = Path(sys.argv[1])
with stop_signals.stop_on_signals() as request:
    request.hard_stop.append(lambda: (marks / "hard").write_text("x"))
    with stop_signals.ending(lambda: (marks / "ended").open("a").write("x")):
        print("ready", flush=True)
        while stop_signals.requested() is None:
            time.sleep(0.05)
    time.sleep(float(sys.argv[2]))  # the bookkeeping
    try:
        stop_signals.check()
    except stop_signals.StudyInterrupted as e:
        print(e, flush=True)
        sys.exit(e.exit_code)
"""


def _driver(tmp_path, bookkeeping_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(bookkeeping_s)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.communicate()
    return proc


def test_one_signal_ends_the_engines_at_once_then_does_the_bookkeeping(tmp_path):
    proc = _driver(tmp_path, 1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and out.strip() == "stopped by SIGTERM", (out, err)
    assert (tmp_path / "ended").read_text() and not (tmp_path / "hard").exists()


def test_a_second_signal_ends_the_engines_and_exits_without_the_bookkeeping(tmp_path):
    proc = _driver(tmp_path, 60.0)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - t0 < 10, (out, err)
    assert out.strip() == "" and (tmp_path / "ended").read_text() and (tmp_path / "hard").exists()


def _study(tmp_path) -> str:
    doc = sim_doc(
        name="twice", seed=4, engine={"mode": "served"}, hardware={"gpus_per_node": 2},
        # ~15 s of load: the signals land while the engine serves it.
        workload={"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 60, "warmup_requests": 0,
                  "output_len": 16, "timeout_s": 30},
        space={"max_num_seqs": 16}, objectives=["maximize output_throughput_per_gpu"], search={"sampler": "grid"},
        budget={"trials": 1, "max_concurrent_trials": 1}, output=str(tmp_path / "out"))
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _replicas(app_prefix: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if " ".join(p.info["cmdline"] or []).startswith(f"ray::ServeReplica:{app_prefix}")]


def test_a_second_signal_still_ends_the_engines_on_a_cluster_that_outlives_the_driver(tmp_path):
    import ray
    from ray import serve

    from orchestrator.search.state import local_state_dir, optuna_storage, optuna_study_name
    from orchestrator.study.load import load_study

    shared_serve()
    path = _study(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", path, "--quiet", "--address",
                             ray.get_runtime_context().gcs_address, "--port", str(SHARED_SERVE_PORT)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        apps: list[str] = []
        while not apps:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            apps = [name for name, app in serve.status().applications.items()
                    if name.startswith("tune-") and str(app.status).endswith("RUNNING")]
            time.sleep(0.3)
        time.sleep(2.0)  # into the load
        assert _replicas(apps[0])
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and time.monotonic() - t0 < 15, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    deadline = t0 + 30
    while time.monotonic() < deadline and (apps[0] in serve.status().applications or _replicas(apps[0])):
        time.sleep(0.5)
    assert apps[0] not in serve.status().applications and not _replicas(apps[0]), "the engine outlived the stop"
    # No bookkeeping: the trial is left running in the journal, as a killed driver leaves it.
    study = load_study(path)
    trials = optuna.load_study(study_name=optuna_study_name(study),
                               storage=optuna_storage(local_state_dir(study))).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.RUNNING]
