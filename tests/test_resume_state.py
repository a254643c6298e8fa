"""Resume building blocks without Ray: torn journals, the run lock, orphans, the journal vs the rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import psutil
import pytest

from orchestrator.search.reconcile import reconcile
from orchestrator.resume import (INTERRUPTED_ATTR, RunInProgress, RunLock, RunState, repair_journal,
                                 stop_orphans)
from orchestrator.search import optuna_storage
from orchestrator.study import parse_study

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_torn_last_record_is_cut_and_the_journal_reads_again(tmp_path):
    storage = optuna_storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    path = tmp_path / "optuna.journal"
    intact = path.read_bytes()
    assert repair_journal(path) == 0 and path.read_bytes() == intact
    with open(path, "ab") as f:
        f.write(b'{"op_code": 5, "worker_id": "w", "trial_id": 3, "state"')  # killed mid-write
    assert repair_journal(path) > 0 and path.read_bytes() == intact
    again = optuna.load_study(storage=optuna_storage(tmp_path), study_name="s")
    again.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert len(optuna.load_study(storage=optuna_storage(tmp_path), study_name="s").trials) == 4


def _holder(tmp_path: Path) -> subprocess.Popen:
    code = ("import sys, time; from pathlib import Path; from orchestrator.resume import RunLock; "
            "RunLock(Path(sys.argv[1]), 'r1').acquire(); print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_run_lock_is_released_when_its_driver_is_killed(tmp_path):
    p = _holder(tmp_path)
    try:
        assert RunLock.held(tmp_path, "r1")
        with pytest.raises(RunInProgress):
            RunLock(tmp_path, "r1").acquire()
    finally:
        p.kill()
        p.wait()
    lock = RunLock(tmp_path, "r1").acquire()  # the kernel dropped the dead driver's lock
    lock.release()


def test_orphans_of_a_dead_driver_are_stopped_and_nothing_else(tmp_path):
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        created = psutil.Process(orphan.pid).create_time()
        st = RunState("r1", "running", "now", 4, "fp", driver_pid=999999,
                      ray_procs=[[orphan.pid, created], [bystander.pid, created - 100.0]])  # a reused pid
        st.save(tmp_path)
        assert stop_orphans(tmp_path) == [orphan.pid]
        assert orphan.wait(timeout=10) is not None
        assert bystander.poll() is None
        assert RunState.load(RunState.path(tmp_path, "r1")).ray_procs == []
    finally:
        for p in (orphan, bystander):
            p.kill()
            p.wait()


def test_journal_is_brought_in_line_with_the_rows(tmp_path, study_doc):
    study = parse_study(study_doc)
    storage = optuna_storage(tmp_path)
    name = "s"
    ostudy = optuna.create_study(storage=storage, study_name=name, directions=study.directions)
    finished, lost = ostudy.ask(), ostudy.ask()  # both left RUNNING by a killed driver
    for t in (finished, lost):
        study.space.suggest(t)
    rows = pd.DataFrame([{"trial_number": finished.number, "study_fingerprint": study.fingerprint(),
                          "status": "completed", "output_throughput_per_gpu": 1234.0, "ttft_p99_ms": 150.0,
                          "feasible": True}])
    fixed = reconcile(study, storage, name, rows)
    assert fixed.told_from_rows == [finished.number] and fixed.retried == [lost.number]
    trials = optuna.load_study(storage=storage, study_name=name).trials
    done = trials[finished.number]
    assert done.state == optuna.trial.TrialState.COMPLETE and done.values == [1234.0, 150.0]
    assert done.constraints == {"engine_started": 0.0, "slo0": pytest.approx((150.0 - 2000) / 2000)}
    assert trials[lost.number].state == optuna.trial.TrialState.FAIL
    assert INTERRUPTED_ATTR in trials[lost.number].system_attrs
    (retry,) = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert retry.user_attrs["retry_of"] == lost.number and retry.system_attrs["fixed_params"] == lost.params
    assert reconcile(study, storage, name, rows) == type(fixed)()  # idempotent: nothing RUNNING is left
