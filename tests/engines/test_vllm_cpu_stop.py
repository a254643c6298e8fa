"""A stopped study stops: real vLLM (the CPU build) under ``orchestrator run``, as ``ray job submit`` runs
it on a cluster (``--address``: the engine unit's Ray, which outlives every driver).

One study, five runs of it (one run id, resumed each time), one signal each:

* SIGKILL of the driver while its engine starts: nothing runs in it, so the cluster keeps the run's
  engine; the next run of the study ends it before its first trial (the Serve applications of runs whose
  driver is gone are deleted, and each engine's supervisor takes its process group with its replica).
* SIGTERM (a CronJob's deadline, a Kubernetes eviction) while the engine serves a trial's load, and
  SIGINT (Ctrl-C) while an engine starts: the driver exits 143 / 130 with one line.
* ``ray job stop`` of the run submitted as a Ray job: SIGTERM, and SIGKILL 3 s later (Ray's default).

After each signal, within 30 s, no process of the run is left (``vllm serve``, its engine core, Serve
replicas, trial actors, the run's writer and GPU ledger) and no Serve application; the trial in flight is
marked interrupted in the Optuna journal (by the driver it stopped, or by the next run when that driver
was killed) and runs again: the last run resumes the study to its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from conftest import REPO
from orchestrator.results import load_trials
from support.studies import cpu_vllm_doc
from support.vllm_processes import vllm_processes

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

BIN = Path(sys.executable).parent
SIGNAL_BOUND_S = 30  # the bound: no process of the run 30 s after the signal
# The Ray actors of a run, by the process title Ray gives them: its Serve replicas, Tune's trial actors,
# its results writer and GPU ledger.
RUN_ACTORS = ("ray::ServeReplica:tune-", "ray::ImplicitFunc", "ray::ResultsSinkActor", "ray::GpuLedgerActor")
# vLLM's processes: the API server (and its supervisor), the engine core, a worker where it has one.
VLLM_KINDS = ("vllm.entrypoints", "EngineCore", "VLLM::Worker")


def _study_file(tmp_path, name: str) -> str:
    from orchestrator.models.modelgen import make_model_dir

    model_dir = tmp_path / "tiny-llama"
    if not model_dir.exists():
        make_model_dir("tiny-llama", model_dir, weights="random", max_position_embeddings=2048)
    doc = cpu_vllm_doc(
        model_dir, name=name, seed=2,
        # A load of about 15 s: the SIGTERM lands while the engine serves it.
        workload={"num_requests": 60, "input_len": {"kind": "uniform", "min": 100, "max": 200}, "output_len": 8},
        space={"max_num_seqs": 4}, search={"sampler": "grid"}, budget={"trials": 1, "max_concurrent_trials": 1},
        output=str(tmp_path / "out"))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _command(study: str, engine_cluster) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", "run", study, "--quiet", "--port", str(engine_cluster.serve_port)]


def _run(study: str, engine_cluster) -> subprocess.Popen:
    import ray

    cmd = _command(study, engine_cluster) + ["--address", ray.get_runtime_context().gcs_address]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _apps(prefix: str = "tune-") -> list[str]:
    from ray import serve

    return [a for a in serve.status().applications if a.startswith(prefix)]


def _cluster_state() -> str:
    """What the cluster holds when an engine does not come: the Serve applications and the actors not dead
    (a trial actor pending on its unit, a replica that never started)."""
    from ray import serve
    from ray.util.state import list_actors

    apps = {name: str(app.status) for name, app in serve.status().applications.items()}
    actors = [(a.class_name, a.state) for a in list_actors(filters=[("state", "!=", "DEAD")], limit=200)]
    return f"serve applications: {apps}; actors not dead: {actors}"


def _wait_for_engine(cache_root, alive, *, serving: bool, timeout: float = 300.0, diagnose=lambda: "") -> None:
    """Until the trial's ``vllm serve`` runs: started (its process is up), or ``serving`` (its application
    is RUNNING, and a few seconds into the load). ``alive()`` fails when the driver ended first; on a
    timeout the error carries the cluster's state and ``diagnose()`` (the run's own output where it has one)."""
    from ray import serve

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive()
        if vllm_processes(cache_root, kinds=("vllm.entrypoints",)):
            if not serving:
                return
            if any(str(app.status).endswith("RUNNING") for name, app in serve.status().applications.items()
                   if name.startswith("tune-")):
                time.sleep(3.0)  # into the load
                return
        time.sleep(0.5)
    raise AssertionError(("no vLLM engine started" if not serving else "the engine never served")
                         + f" within {timeout:.0f} s; {_cluster_state()}\n{diagnose()}")


def _run_actors(cache_root) -> list[str]:
    """The Ray actor processes of runs on the engine unit's Ray (its workers carry its ``VLLM_CACHE_ROOT``)."""
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            title = " ".join(p.info["cmdline"] or []) or p.info["name"] or ""
            if not title.startswith(RUN_ACTORS) or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("VLLM_CACHE_ROOT", "").startswith(str(cache_root)):
                out.append(title[:80])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _left_after(cache_root, deadline: float) -> list:
    """What of the run is still there at ``deadline`` (nothing as soon as nothing is)."""
    while True:
        left = ([" ".join(p.cmdline()[:3]) for p in vllm_processes(cache_root, kinds=VLLM_KINDS)]
                + _run_actors(cache_root) + _apps())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _journal(study_path: str) -> list:
    from orchestrator.search.state import local_state_dir, optuna_storage, optuna_study_name
    from orchestrator.study.load import load_study

    study = load_study(study_path)
    storage = optuna_storage(local_state_dir(study))
    return optuna.load_study(study_name=optuna_study_name(study), storage=storage).trials


def _interrupted(study_path: str) -> list[int]:
    """Numbers of the trials the journal marks interrupted (failed, their configuration queued again)."""
    return [t.number for t in _journal(study_path)
            if "orchestrator:interrupted" in t.system_attrs and t.state == optuna.trial.TrialState.FAIL]


def _stopped_by_a_signal(proc: subprocess.Popen, sig: signal.Signals, cache_root, study: str) -> None:
    """``sig`` to the driver: 128 + sig and one line, nothing of the run left within the bound, and the trial
    that was in flight marked interrupted by the driver itself."""
    running_before = len(_interrupted(study))
    proc.send_signal(sig)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert f"stopped by {sig.name}: 1 trial(s) in flight stopped" in last and "Traceback" not in err, err[-3000:]
    assert _left_after(cache_root, t0 + SIGNAL_BOUND_S) == [], f"left {SIGNAL_BOUND_S} s after {sig.name}"
    assert len(_interrupted(study)) == running_before + 1, "the driver did not mark its trial interrupted"


def _submit_job(engine_cluster, study: str, job_id: str) -> None:
    """The run as a Ray job (its driver joins the cluster through ``RAY_ADDRESS``), retried while the
    dashboard's job agent registers (a cluster just started)."""
    deadline = time.monotonic() + 120
    while True:
        r = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", engine_cluster.dashboard_url,
                            "--submission-id", job_id, "--no-wait", "--", *_command(study, engine_cluster)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode == 0 or "No available agent" not in r.stdout + r.stderr or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def _job_status(engine_cluster, job_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    return str(JobSubmissionClient(engine_cluster.dashboard_url).get_job_status(job_id))


def _job_logs(engine_cluster, job_id: str) -> str:
    from ray.job_submission import JobSubmissionClient

    return "job logs (tail): " + JobSubmissionClient(engine_cluster.dashboard_url).get_job_logs(job_id)[-4000:]


def test_every_stop_signal_leaves_no_process_of_the_run_and_the_study_resumes(tmp_path, engine_cluster):
    cache_root = engine_cluster.cache_root
    study = _study_file(tmp_path, "stop")

    # SIGKILL of the driver while the engine starts: nothing runs in it, so the cluster keeps the run's engine ...
    first = _run(study, engine_cluster)
    _wait_for_engine(cache_root, lambda: first.poll() is None or pytest.fail(first.communicate()[1][-3000:]),
                     serving=False)
    time.sleep(3.0)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and nothing else: the cluster outlives it
    first.communicate(timeout=30)
    orphans = vllm_processes(cache_root)
    assert orphans, "the engine of a killed driver's run is the cluster's until a run cleans it up"

    # ... until the next run of the study, which deletes the dead driver's application before its first
    # trial (its own run: it resumes it, and marks the killed trial interrupted) and starts an engine of its own.
    second = _run(study, engine_cluster)
    _, alive = psutil.wait_procs(orphans, timeout=120)
    assert not alive, "the next run left the old engine running"
    _wait_for_engine(cache_root, lambda: second.poll() is None or pytest.fail(second.communicate()[1][-3000:]),
                     serving=True)
    assert _interrupted(study) == [0]

    # SIGTERM while that engine serves the trial's load; SIGINT (Ctrl-C) while the next one starts.
    _stopped_by_a_signal(second, signal.SIGTERM, cache_root, study)
    third = _run(study, engine_cluster)
    _wait_for_engine(cache_root, lambda: third.poll() is None or pytest.fail(third.communicate()[1][-3000:]),
                     serving=False)
    _stopped_by_a_signal(third, signal.SIGINT, cache_root, study)
    assert _interrupted(study) == [0, 1, 2]

    # `ray job stop`: SIGTERM to the job's driver, SIGKILL 3 s later. The engine still ends: the first
    # signal asked Serve's controller to delete the run's applications before anything else.
    _submit_job(engine_cluster, study, "stop-job")
    _wait_for_engine(cache_root, lambda: _job_status(engine_cluster, "stop-job") in ("PENDING", "RUNNING")
                     or pytest.fail(_job_status(engine_cluster, "stop-job")), serving=False,
                     diagnose=lambda: _job_logs(engine_cluster, "stop-job"))
    t0 = time.monotonic()
    stop = subprocess.run([str(BIN / "ray"), "job", "stop", "--address", engine_cluster.dashboard_url, "stop-job"],
                          capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    assert _left_after(cache_root, t0 + SIGNAL_BOUND_S) == [], "left 30 s after ray job stop"
    assert _job_status(engine_cluster, "stop-job") == "STOPPED"

    # The same command resumes the run to its end: the trial the job was running is marked interrupted now
    # (or was, if the driver got to it before its SIGKILL), and each interrupted one ran again.
    last = _run(study, engine_cluster)
    _, err = last.communicate(timeout=600)
    assert last.returncode == 0, err[-3000:]
    trials = load_trials(tmp_path / "out" / "stop")
    assert (trials["status"] == "completed").sum() == 1 and len(trials) == 1, trials[["status", "failure_kind"]]
    assert trials["run_id"].nunique() == 1  # resumed: the same run
    assert _interrupted(study) == [0, 1, 2, 3]
    assert [t.state for t in _journal(study)][4:] == [optuna.trial.TrialState.COMPLETE]
    assert _left_after(cache_root, time.monotonic() + SIGNAL_BOUND_S) == []
