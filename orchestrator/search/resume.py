"""Resuming a study whose driver died: run state, one driver per run, orphans, the journal vs the rows.

* ``<state>/_runs/<run_id>.json`` marks an unfinished run; the same command continues
  it under the same run id with the rest of its budget.
* Serve applications of a run whose driver is gone (SIGKILL on a cluster that outlived it) still hold
  their engines: the next run of the study deletes them before its first trial (:func:`cleanup_apps`).
* ``<run_id>.lock`` is held (``flock``) by the driver running it: the kernel drops it
  when the driver dies, even by SIGKILL, so a second driver on the same run is refused
  while the first lives and welcome after.
* The Ray processes a driver started are written down; on Linux they die with it, but
  whatever is left (other platforms, a stuck process) is stopped on the next start.
* The Parquet rows are the record; the Optuna journal is the sampler's memory. A trial
  left RUNNING in the journal whose row was written is told from its row (nothing is
  measured twice); one without a row is marked failed (``orchestrator:interrupted``)
  and its configuration queued again. A request file without its trial row (a write
  interrupted between the two files) is removed.

Tune's own experiment restore is not used: it would rebuild Tune's trial list and
searcher state, all of which the journal already holds, and resume trials mid-way,
which a serving measurement cannot do (the engine died with the driver).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Optional

from orchestrator.engines.serve_app import delete_app
from orchestrator.results.query import list_data_files

try:
    import psutil
except ImportError:  # optional (not a core dependency): without it no orphan is found
    psutil = None

log = logging.getLogger(__name__)

INTERRUPTED_ATTR = "orchestrator:interrupted"


class RunInProgress(Exception):
    """Another live driver is running this run."""


class DamagedState(Exception):
    """A state file or folder the run cannot use as it is (``str(e)``: one line, naming it and what to do)."""


def check_state(state_dir: Path) -> None:
    """Raises :class:`DamagedState` for a file where the run-state folder belongs, or a folder where
    the journal does."""
    for name, folder in (("_runs", True), ("_tune", True), ("optuna.journal", False)):
        p = state_dir / name
        if p.exists() and p.is_dir() != folder:
            raise DamagedState(f"{p}: a {'file' if folder else 'folder'} where the {'folder' if folder else 'file'} "
                               "belongs; move it away and run the same command again")


class RunStatus(str, Enum):
    """Where a run stands, as its state file says (the file holds the value, ``"running"``)."""

    RUNNING = "running"  # started and not ended: the same command resumes it
    FINISHED = "finished"  # its budget spent, or stopped for good: a new command starts a new run


_damaged_warned: set[str] = set()
# A state file's fields and their types (a hand edit or garbage must not reach the driver's arithmetic).
_STATE_TYPES = {"run_id": str, "status": str, "started_at": str, "budget_trials": int, "fingerprint": str,
                "driver_pid": (int, type(None)), "ray_session": (str, type(None)), "ray_procs": list}


@dataclass
class RunState:
    """``<state>/_runs/<run_id>.json``: lets a killed run resume under the same id."""

    run_id: str
    status: RunStatus
    started_at: str
    budget_trials: int
    fingerprint: str
    driver_pid: Optional[int] = None
    ray_session: Optional[str] = None
    ray_procs: list[list[float]] = field(default_factory=list)  # [pid, create_time] of a local Ray we started

    def __post_init__(self) -> None:
        # A file's string (or a caller's) becomes the enum; any other value raises ValueError (a damaged file).
        if isinstance(self.status, str):
            self.status = RunStatus(self.status)

    @staticmethod
    def path(state_dir: Path, run_id: str) -> Path:
        return state_dir / "_runs" / f"{run_id}.json"

    def save(self, state_dir: Path, *, must: bool = True) -> None:
        """Write atomically; ``must=False``: a failure (full disk while stopping) only logs,
        the file on disk keeps its last good state."""
        p = self.path(state_dir, self.run_id)
        tmp = p.with_name("." + p.name + ".tmp")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(asdict(self), indent=2))
            os.replace(tmp, p)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if must:
                raise
            log.warning("could not update run state %s: %s", p, e)

    @classmethod
    def load(cls, p: Path) -> Optional["RunState"]:
        try:
            data = json.loads(p.read_text())
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            st = cls(**known)
            bad = [k for k, t in _STATE_TYPES.items() if not isinstance(getattr(st, k), t)
                   or (isinstance(getattr(st, k), bool) and t is int)]
            if bad or not all(isinstance(x, list) and len(x) == 2 for x in st.ray_procs):
                raise TypeError(f"{(bad or ['ray_procs'])[0]} has the wrong type")
            return st
        except Exception as e:  # noqa: BLE001 - a damaged state file is not resumed
            if str(p) not in _damaged_warned:
                _damaged_warned.add(str(p))
                log.warning("run state %s is damaged (%s): that run is not resumed; the file is left as it is", p,
                            " ".join(str(e).split()) or type(e).__name__)
            return None

    @classmethod
    def all(cls, state_dir: Path) -> list["RunState"]:
        return [st for p in sorted((state_dir / "_runs").glob("*.json")) if (st := cls.load(p)) is not None]

    @classmethod
    def latest_unfinished(cls, state_dir: Path, fingerprint: str) -> Optional["RunState"]:
        runs = [st for st in cls.all(state_dir) if st.status is RunStatus.RUNNING and st.fingerprint == fingerprint]
        return runs[-1] if runs else None


class RunLock:
    """An exclusive ``flock`` on ``<run_id>.lock`` for as long as this driver runs the run."""

    def __init__(self, state_dir: Path, run_id: str):
        self.path = state_dir / "_runs" / f"{run_id}.lock"
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunInProgress(str(self.path)) from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None

    @staticmethod
    def held(state_dir: Path, run_id: str) -> bool:
        """True if a live process holds the run's lock."""
        try:
            RunLock(state_dir, run_id).acquire().release()
            return False
        except RunInProgress:
            return True


def process_identity(pid: int) -> Optional[list[float]]:
    try:
        return [pid, psutil.Process(pid).create_time()]
    except Exception:  # noqa: BLE001 - gone, or psutil missing
        return None


def session_processes(session_dir: str) -> list:
    """Every live process of the local Ray session at ``session_dir``: GCS, raylet and monitors name
    the directory on their command line; the agents and workers (``ray::DashboardAgent``,
    ``ray::RuntimeEnvAgent``, ``ray::IDLE``) rename theirs, but keep their logs in it open.
    Session directories are unique (start time and pid in the name), so nothing else matches."""
    sd = session_dir.rstrip("/")
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid == os.getpid():
            continue
        args = p.info.get("cmdline") or []
        try:
            mine = (any(a == sd or a.endswith("=" + sd) or sd + "/" in a for a in args)
                    or any(f.path.startswith(sd + "/") for f in p.open_files()))
        except psutil.Error:  # gone, or not ours to inspect
            continue
        if mine:
            found.append(p)
    return found


def _terminate(procs: list, timeout_s: float) -> None:
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout_s)


def stop_orphans(state_dir: Path) -> list[int]:
    """Stop Ray processes that drivers of this study started and left behind when they died.

    Only a local Ray a dead driver started itself is touched (never a cluster it connected to),
    and only once that driver no longer holds its run lock: the processes it wrote down (pid
    *and* start time must match: a reused pid is another program), and every other process of
    that Ray session, found by its session directory. After a SIGKILL the dashboard and
    runtime-env agents outlive the raylet for a minute or more, re-parented to init.
    """
    if psutil is None:
        return []
    stopped: list[int] = []
    for st in RunState.all(state_dir):
        if not st.ray_procs or RunLock.held(state_dir, st.run_id):
            continue
        procs = {}
        for pid, created in st.ray_procs:
            try:
                p = psutil.Process(int(pid))
                if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                    procs[p.pid] = p
            except psutil.Error:
                continue
        if st.ray_session:
            procs.update((p.pid, p) for p in session_processes(st.ray_session))
        _terminate(list(procs.values()), timeout_s=5)
        stopped += sorted(procs)
        st.ray_procs = []
        st.save(state_dir)
    if stopped:
        log.warning("stopped %d Ray process(es) left by a killed driver: %s", len(stopped), stopped)
    return stopped


def _record_problem(line: bytes) -> Optional[str]:
    """Why a journal line is not an Optuna record (None: it is one)."""
    try:
        record = json.loads(line)
    except ValueError as e:  # not JSON, or not UTF-8 (UnicodeDecodeError is a ValueError)
        return " ".join(str(e).split())[:120]
    if not isinstance(record, dict) or type(record.get("op_code")) is not int:
        return "no op_code"
    return None


def repair_journal(path: Path) -> int:
    """Make an Optuna journal readable again, or say why it cannot be; returns the bytes removed.

    A torn last record (a write killed mid-line, or a full disk) is cut: it was never
    acknowledged, so nothing is lost; left in place, the next append would glue onto it and
    make the whole journal unreadable. A complete last line that is no record (garbage bytes)
    is cut too, after a copy of the journal is kept beside it. A damaged line before the last
    raises :class:`DamagedState` and changes nothing: cutting it would renumber every later
    trial, whose rows are already written under their numbers.
    """
    if path.is_dir():
        raise DamagedState(f"{path}: a folder where the Optuna journal belongs; move it away and run the same "
                           "command again")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        lines = f.read().split(b"\n")
        torn = lines.pop()  # b"" when the last record ended with its newline
        damaged = [(i, why) for i, line in enumerate(lines) if (why := _record_problem(line))]
        if damaged and damaged[0][0] < len(lines) - 1:
            i, why = damaged[0]
            raise DamagedState(f"{path}: line {i + 1} of {len(lines)} is not an Optuna record ({why}): the sampler's "
                               "history after it cannot be read. Nothing was changed: restore the journal from a "
                               "copy, or move it away and start a new run with --new-run (the trial rows are kept; "
                               "the sampler starts afresh)")
        keep = size - len(torn) - (len(lines[-1]) + 1 if damaged else 0)
        if keep == size:
            return 0
        if damaged:
            backup = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
            backup.write_bytes(b"\n".join(lines + [torn]))
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    if damaged:
        log.warning("Optuna journal %s: removed a damaged last record (%d bytes: %s); the journal as it was is "
                    "kept at %s", path, size - keep, damaged[0][1], backup)
    else:
        log.warning("Optuna journal %s: removed a torn last record (%d bytes)", path, size - keep)
    return size - keep


class JournalFlock:
    """Optuna journal lock on ``flock``: no stale lock files after a killed driver (local files only)."""

    def __init__(self, path: str):
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def drop_orphan_requests(store, run_id: str) -> int:
    """Remove request files of this run whose trial row is missing (a write cut between the two)."""
    try:
        trials = store.trial_ids(run_id=run_id)
        files = [f for f in list_data_files(store.filesystem, store.requests_dir) if f.run == run_id]
    except Exception:  # noqa: BLE001 - nothing to read yet
        return 0
    n = 0
    for f in files:
        if f.trial_id not in trials:
            try:
                store.filesystem.delete_file(f.path)
                n += 1
            except OSError:
                pass
    return n


def dead_run_ids(state_dir: Path, current: str) -> list[str]:
    """This run and every other run of the study no live driver holds (their apps are orphans)."""

    ids = [current]
    for st in RunState.all(state_dir):
        if st.run_id != current and st.status is RunStatus.RUNNING and not RunLock.held(state_dir, st.run_id):
            ids.append(st.run_id)
    return ids


def cleanup_apps(run_ids: list[str]) -> None:
    """Delete Serve apps of these runs that a killed trial or driver left behind."""
    try:
        from ray import serve


        prefixes = tuple(f"tune-{rid}" for rid in run_ids)
        for name in list(serve.status().applications):
            if name.startswith(prefixes):
                delete_app(name, timeout_s=60)
    except Exception as e:  # noqa: BLE001
        log.warning("could not clean up Serve applications: %s", e)


def end_run_now(run_id: str, sink=None) -> None:
    """What a stop signal does at once, before any bookkeeping (``stop_signals.ending`` runs it): the run's
    writer takes no more rows (a trial whose engine is ended under it is not recorded as a failure of its
    configuration: it runs again when the run resumes), and Serve's controller is asked to delete every
    application of the run without waiting: the controller ends their engines even if the driver is
    killed a moment later (``ray job stop`` sends SIGKILL 3 s after SIGTERM)."""
    import ray
    from ray import serve

    if sink is not None:
        ray.get(sink.close.remote(), timeout=10)
    prefix = f"tune-{run_id}"
    for name, app in serve.status().applications.items():
        if name.startswith(prefix) and getattr(app.status, "value", app.status) != "DELETING":
            serve.delete(name, _blocking=False)
