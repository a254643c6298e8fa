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
from orchestrator.search.resume import (INTERRUPTED_ATTR, DamagedState, RunInProgress, RunLock, RunState, RunStatus,
                                        check_state, repair_journal, stop_orphans)
from orchestrator.search.state import optuna_storage
from orchestrator.study.spec import parse_study

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
    code = ("import sys, time; from pathlib import Path; from orchestrator.search.resume import RunLock; "
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


def _journal_of_three_trials(tmp_path: Path) -> Path:
    study = optuna.create_study(storage=optuna_storage(tmp_path), study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    return tmp_path / "optuna.journal"


def test_a_garbage_last_line_is_cut_and_the_journal_as_it_was_kept(tmp_path, caplog):
    path = _journal_of_three_trials(tmp_path)
    intact = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b"\x80\xfe not a record \x00\n")  # a complete line of garbage bytes (once UnicodeDecodeError)
    damaged = path.read_bytes()
    assert repair_journal(path) > 0 and path.read_bytes() == intact
    (backup,) = tmp_path.glob("optuna.journal.damaged-*")
    assert backup.read_bytes() == damaged
    assert any("removed a damaged last record" in r.getMessage() and str(backup) in r.getMessage()
               for r in caplog.records)
    again = optuna.load_study(storage=optuna_storage(tmp_path), study_name="s")
    again.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert len(again.trials) == 4


def test_a_damaged_line_before_the_last_stops_the_run_and_changes_nothing(tmp_path, study_doc):
    """Cutting it would renumber every later trial: one line naming the journal and the line, exit
    code 2, before any engine or Ray starts; the journal byte for byte as it was."""
    import yaml

    study_doc["engine"] = {"kind": "sim", "mode": "virtual"}
    study_doc["output"] = str(tmp_path / "out")
    study_file = tmp_path / "s.yaml"
    study_file.write_text(yaml.safe_dump(study_doc))
    path = _journal_of_three_trials(tmp_path / "out" / "unit")
    lines = path.read_bytes().split(b"\n")
    lines.insert(2, b"\x80 garbage")
    path.write_bytes(b"\n".join(lines))
    damaged = path.read_bytes()
    with pytest.raises(DamagedState, match=r"line 3 of \d+ is not an Optuna record"):
        repair_journal(path)
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(study_file), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"{path}: line 3 of") and "--new-run" in line, line
    assert path.read_bytes() == damaged
    assert not list(path.parent.glob("optuna.journal.damaged-*"))


@pytest.mark.parametrize("content", [b'{"run_id": "r1", "status": "running", "started_at": "x", "budget_trials": "lots",'
                                     b' "fingerprint": "fp"}', b"\x00\xff", b"[]"], ids=["wrong-type", "garbage", "list"])
def test_a_damaged_run_state_is_named_and_not_resumed(tmp_path, caplog, content):
    (tmp_path / "_runs").mkdir()
    (tmp_path / "_runs" / "r1.json").write_bytes(content)
    assert RunState.all(tmp_path) == [] and RunState.latest_unfinished(tmp_path, "fp") is None
    assert stop_orphans(tmp_path) == []
    assert any("run state" in r.getMessage() and "r1.json" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "_runs" / "r1.json").read_bytes() == content


def test_run_status_is_an_enum_written_as_its_word_and_old_files_still_load(tmp_path, caplog):
    runs = tmp_path / "_runs"
    runs.mkdir()
    # A file written before the enum: the same words.
    (runs / "r1.json").write_text('{"run_id": "r1", "status": "running", "started_at": "x", "budget_trials": 4, '
                                  '"fingerprint": "fp"}')
    (runs / "r2.json").write_text('{"run_id": "r2", "status": "finished", "started_at": "y", "budget_trials": 4, '
                                  '"fingerprint": "fp"}')
    old = RunState.latest_unfinished(tmp_path, "fp")
    assert old is not None and old.run_id == "r1" and old.status is RunStatus.RUNNING
    assert [st.status for st in RunState.all(tmp_path)] == [RunStatus.RUNNING, RunStatus.FINISHED]
    old.status = RunStatus.FINISHED
    old.save(tmp_path)
    assert '"status": "finished"' in (runs / "r1.json").read_text()
    assert RunState.latest_unfinished(tmp_path, "fp") is None
    (runs / "r3.json").write_text('{"run_id": "r3", "status": "paused", "started_at": "z", "budget_trials": 4, '
                                  '"fingerprint": "fp"}')
    assert RunState.latest_unfinished(tmp_path, "fp") is None  # a status no run has is a damaged file
    assert any("r3.json" in r.getMessage() and "paused" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["_runs", "optuna.journal"])
def test_a_file_where_a_folder_belongs_and_the_reverse(tmp_path, name):
    (tmp_path / name).mkdir() if name == "optuna.journal" else (tmp_path / name).write_text("x")
    with pytest.raises(DamagedState, match=f"{tmp_path / name}: a (file|folder) where the (folder|file) belongs"):
        check_state(tmp_path)
