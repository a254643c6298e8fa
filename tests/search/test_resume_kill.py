"""Resume after SIGKILL: the same command continues the run, nothing lost, nothing measured twice.

The study runs as ``orchestrator run`` in its own process (with the local Ray it
starts); the test SIGKILLs that process while trials are running, checks that the Ray
processes it started died with it, runs the same command again and checks the result:
every grid point measured exactly once, the interrupted trials marked in the Optuna
journal and run again, no Serve application or engine process left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import optuna
import psutil
import pytest
import yaml

from orchestrator.results import load_requests, load_trials
from orchestrator.study.load import load_study
from support.studies import sim_doc

pytestmark = pytest.mark.slow

SERVE_PORT = 8304


def write_study(tmp_path, repo) -> str:
    doc = sim_doc(
        name="killed", seed=5, engine={"mode": "served"}, hardware={"gpus_per_node": 2},
        # ~5 s of load per trial: long enough to be killed in the middle of one.
        workload={"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 20, "warmup_requests": 0,
                  "input_len": {"kind": "uniform", "min": 100, "max": 400}, "output_len": 24, "timeout_s": 30},
        space={"max_num_seqs": [16, 32], "max_num_batched_tokens": [2048, 8192]},
        objectives=["maximize output_throughput_per_gpu"], search={"sampler": "grid"},
        budget={"trials": 4, "max_concurrent_trials": 2}, output=str(tmp_path / "out"))
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def command(path: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "run", path, "--port", str(SERVE_PORT)]


def run_state(tmp_path) -> dict:
    (state,) = (tmp_path / "out" / "killed" / "_runs").glob("*.json")
    return json.loads(state.read_text())


def alive(procs: list[list[float]]) -> list[int]:
    out = []
    for pid, created in procs:
        try:
            p = psutil.Process(int(pid))
            if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                out.append(int(pid))
        except psutil.Error:
            pass
    return out


def running_trials(path: str) -> set[int]:
    """Numbers of the trials the run's Optuna study has handed out and not yet been told about."""
    from orchestrator.search.state import local_state_dir, optuna_storage, optuna_study_name

    study = load_study(path)
    try:
        ostudy = optuna.load_study(study_name=optuna_study_name(study), storage=optuna_storage(local_state_dir(study)))
    except KeyError:  # not created yet
        return set()
    return {t.number for t in ostudy.trials if t.state == optuna.trial.TrialState.RUNNING}


def recorded_trials(out_dir) -> set[int]:
    """Optuna numbers of the trials with a row."""
    return {int(n) for n in load_trials(out_dir)["trial_number"]}


def kill_while_a_trial_is_unrecorded(first: subprocess.Popen, path: str, out_dir, session: str) -> tuple[set, set]:
    """SIGKILL the driver at a moment when a trial the searcher handed out has no row yet. The run's
    one journal writer (the driver) and its one row writer (its results-sink actor) are stopped while
    the journal and the rows are compared, so neither changes between that look and the kill; the
    sink stays stopped (the resumed run stops what is left).
    Returns (trials running in the journal, trials with a row) at the kill."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert first.poll() is None, first.stdout.read()
        sinks = [int(line.split()[0]) for line in of_session(session) if "ResultsSinkActor" in line]
        assert sinks, "the run's results-sink actor was not found"
        writers = [first.pid, *sinks]
        _signal(writers, signal.SIGSTOP)
        try:
            running, recorded = running_trials(path), recorded_trials(out_dir)
        except Exception:  # noqa: BLE001 - the driver stopped in the middle of a journal line: look again
            running, recorded = set(), set()
        if running - recorded:
            os.kill(first.pid, signal.SIGKILL)
            return running, recorded
        _signal(writers, signal.SIGCONT)
        time.sleep(0.2)
    raise AssertionError("no trial in flight without a row after the first one finished")


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def of_session(session_dir: str) -> list[str]:
    """Live processes of a Ray session: named on their command line, or with its log files open
    (agents and workers rename their command line)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        try:
            files = [f.path for f in p.open_files()]
        except psutil.Error:
            continue
        named = re.search(re.escape(session_dir) + r"(/|\s|$)", cmd) or \
            any(f.startswith(session_dir + "/") for f in files)
        if named and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(f"{p.pid} {cmd[:160]}")
    return out


def test_sigkilled_driver_resumes_without_loss_or_duplicates(tmp_path, repo):
    frozen: list[int] = []
    try:
        _killed_and_resumed(tmp_path, repo, frozen)
    finally:  # a failed run must not leave stopped processes behind
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _killed_and_resumed(tmp_path, repo, frozen: list[int]) -> None:
    path = write_study(tmp_path, repo)
    trials_dir = tmp_path / "out" / "killed" / "trials"
    first = subprocess.Popen(command(path), cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list(trials_dir.rglob("*.parquet")):
            assert first.poll() is None, first.stdout.read()
            time.sleep(0.5)
        assert list(trials_dir.rglob("*.parquet")), "no trial finished in time"
        ray_procs = run_state(tmp_path)["ray_procs"]
        assert ray_procs, "the driver should have written down the Ray it started"
        session = run_state(tmp_path)["ray_session"]
        assert session
        # Killed while a trial is in flight: the searcher has handed out a trial not recorded yet.
        running, recorded = kill_while_a_trial_is_unrecorded(first, path, tmp_path / "out" / "killed", session)
        first.wait(timeout=30)
        # The rest of that Ray session (its dashboard and runtime-env agents, idle workers) outlives it,
        # re-parented to init: a few seconds here, 40-90 s on a busy machine. Frozen, they stay until
        # something stops them: the resumed run must, before it runs anything.
        started = {int(pid) for pid, _ in ray_procs}
        frozen += [pid for line in of_session(session) if (pid := int(line.split()[0])) not in started]
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
    finally:
        if first.poll() is None:
            first.kill()
    done_before = len(list(trials_dir.rglob("*.parquet")))
    assert done_before < 4

    # The Ray it started dies with it (Linux parent-death signal); whatever is left the next start stops.
    deadline = time.monotonic() + 30
    while alive(ray_procs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert alive(ray_procs) == [], "Ray processes outlived their SIGKILLed driver"

    second = subprocess.Popen(command(path), cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in second.stdout:
            lines.append(line)
            if line.strip().startswith("resuming run"):
                assert of_session(session) == [], "processes of the killed driver's Ray session outlived the resume"
                break
        lines += second.stdout.readlines()
        second.wait(timeout=600)
    finally:
        if second.poll() is None:
            second.kill()
    output = "".join(lines)
    assert second.returncode == 0, output[-6000:]
    assert "Traceback" not in output
    state = run_state(tmp_path)
    assert f"resuming run {state['run_id']}: {done_before} trials already recorded" in output
    assert state["status"] == "finished" and state["ray_procs"] == []

    trials = load_trials(tmp_path / "out" / "killed")
    assert len(trials) == 4 and trials["trial_id"].is_unique and set(trials["run_id"]) == {state["run_id"]}
    measured = sorted(zip(trials["max_num_seqs"], trials["max_num_batched_tokens"]))
    assert measured == sorted((a, b) for a in (16, 32) for b in (2048, 8192))  # each point once
    assert (trials["status"] == "completed").all()
    requests = load_requests(tmp_path / "out" / "killed")
    assert requests.groupby("trial_id").size().reindex(trials["trial_id"]).eq(20).all()

    study = load_study(path)
    from orchestrator.search.state import local_state_dir, optuna_storage, optuna_study_name

    ostudy = optuna.load_study(study_name=optuna_study_name(study), storage=optuna_storage(local_state_dir(study)))
    interrupted = [t for t in ostudy.trials if "orchestrator:interrupted" in t.system_attrs]
    retries = [t for t in ostudy.trials if "retry_of" in t.user_attrs]
    # Exactly the trials running without a row at the kill are marked; one with a row was told from it.
    at_kill = f"at the kill: running {sorted(running)}, with a row {sorted(recorded)}; now: " + ", ".join(
        f"{t.number} {t.state.name} {t.params} {t.user_attrs}" for t in ostudy.trials)
    assert {t.number for t in interrupted} == running - recorded != set(), at_kill
    assert all(ostudy.trials[n].state == optuna.trial.TrialState.COMPLETE for n in running & recorded)
    # A trial the searcher had created but not yet given its configuration when the driver died (the
    # kill lands between Optuna's ask and its suggestions now and then) ran nothing: nothing to retry.
    configured = [t.number for t in interrupted if t.params]
    assert sorted(t.user_attrs["retry_of"] for t in retries) == sorted(configured)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in retries)
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in ostudy.trials)
