"""Resuming a study whose driver died: run state, one driver per run, orphans, the journal vs the rows.

* ``<state>/_runs/<run_id>.json`` marks an unfinished run; the same command continues
  it under the same run id with the rest of its budget.
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

import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)

INTERRUPTED_ATTR = "orchestrator:interrupted"


class RunInProgress(Exception):
    """Another live driver is running this run."""


@dataclass
class RunState:
    """``<state>/_runs/<run_id>.json``: lets a killed run resume under the same id."""

    run_id: str
    status: str  # running | finished
    started_at: str
    budget_trials: int
    fingerprint: str
    driver_pid: Optional[int] = None
    ray_session: Optional[str] = None
    ray_procs: list[list[float]] = field(default_factory=list)  # [pid, create_time] of a local Ray we started

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
            return cls(**known)
        except Exception:  # noqa: BLE001 - a damaged state file is not resumed
            return None

    @classmethod
    def all(cls, state_dir: Path) -> list["RunState"]:
        return [st for p in sorted((state_dir / "_runs").glob("*.json")) if (st := cls.load(p)) is not None]

    @classmethod
    def latest_unfinished(cls, state_dir: Path, fingerprint: str) -> Optional["RunState"]:
        runs = [st for st in cls.all(state_dir) if st.status == "running" and st.fingerprint == fingerprint]
        return runs[-1] if runs else None


class RunLock:
    """An exclusive ``flock`` on ``<run_id>.lock`` for as long as this driver runs the run."""

    def __init__(self, state_dir: Path, run_id: str):
        self.path = state_dir / "_runs" / f"{run_id}.lock"
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        import fcntl

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
        import psutil

        return [pid, psutil.Process(pid).create_time()]
    except Exception:  # noqa: BLE001 - gone, or psutil missing
        return None


def stop_orphans(state_dir: Path) -> list[int]:
    """Stop Ray processes that drivers of this study started and left behind when they died.

    A process is only touched if its pid *and* start time match what its driver wrote
    down (a reused pid is another program) and that driver no longer holds its run lock.
    """
    try:
        import psutil
    except ImportError:
        return []
    stopped: list[int] = []
    for st in RunState.all(state_dir):
        if not st.ray_procs or RunLock.held(state_dir, st.run_id):
            continue
        procs = []
        for pid, created in st.ray_procs:
            try:
                p = psutil.Process(int(pid))
                if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
            except psutil.Error:
                continue
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        stopped += [p.pid for p in procs]
        st.ray_procs = []
        st.save(state_dir)
    if stopped:
        log.warning("stopped %d Ray process(es) left by a killed driver: %s", len(stopped), stopped)
    return stopped


def repair_journal(path: Path) -> int:
    """Cut a torn last record (a write killed mid-line, or a full disk) off an Optuna journal.

    The record was never acknowledged, so nothing is lost; left in place, the next append
    would glue onto it and make the whole journal unreadable. Returns the bytes removed.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return 0
        # Find the last complete line (read backwards in blocks).
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            block = f.read(end - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            end = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    log.warning("Optuna journal %s: removed a torn last record (%d bytes)", path, size - keep)
    return size - keep


class JournalFlock:
    """Optuna journal lock on ``flock``: no stale lock files after a killed driver (local files only)."""

    def __init__(self, path: str):
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self) -> bool:
        import fcntl

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
    from orchestrator.results.query import list_data_files

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
