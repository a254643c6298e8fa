"""Where a study's state lives: run ids, the local state folder, the Optuna journal.

Engines that need the state folder (a server's log directory) get it through the trial
context, not by importing the driver.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.study import Study

# Consonants only: a random suffix never spells a word, and never reads as a number.
_RUN_ID_LETTERS = "bcdfghjklmnpqrstvwxz"


def new_run_id(study: Study) -> str:
    """``r<YYYYMMDD>-<HHMMSS>-<4 letters>``, UTC start time: ids sort by time.

    The run id is a hive partition value (``run=<run_id>``), which readers type by guessing:
    the old ``20261203T071410-2711`` (a hex suffix, sometimes all digits) read as a datetime
    in Polars. A leading letter and a letters-only suffix leave nothing to guess.
    """
    suffix = "".join(secrets.choice(_RUN_ID_LETTERS) for _ in range(4))
    return datetime.now(timezone.utc).strftime("r%Y%m%d-%H%M%S-") + suffix


def local_state_dir(study: Study) -> Path:
    """Where the Optuna journal and Tune's experiment live (a local path, even for s3:// output)."""
    if "://" in study.output and not study.output.startswith("file://"):
        base = Path(os.environ.get("ORCHESTRATOR_STATE_DIR", Path.home() / ".cache" / "orchestrator"))
    else:
        base = Path(study.output.removeprefix("file://"))
    return (base / study.name).resolve()


def optuna_storage(state_dir: Path):
    """The study's Optuna journal: repaired if a killed writer tore its last record, locked with
    ``flock`` (released by the kernel when a driver dies, where Optuna's own lock files would make
    the next start wait out a 30 s grace period)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from orchestrator.resume import JournalFlock, repair_journal

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "optuna.journal"
    repair_journal(path)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFlock(str(path) + ".flock")))


def optuna_study_name(study: Study) -> str:
    return f"{study.name}-{study.fingerprint()}"
