"""Where a study's state lives: run ids, the local state folder, the Optuna journal.

The state folder itself is :func:`orchestrator.study.state_dir.local_state_dir` (engines use it too).
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.search.resume import JournalFlock, repair_journal
from orchestrator.study.spec import Study
from orchestrator.study.state_dir import local_state_dir  # noqa: F401 - part of the state API

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


def optuna_storage(state_dir: Path):
    """The study's Optuna journal: repaired if a killed writer tore its last record, locked with
    ``flock`` (released by the kernel when a driver dies, where Optuna's own lock files would make
    the next start wait out a 30 s grace period)."""
    # deferred: optuna is slow to import; validate/show load this module
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "optuna.journal"
    repair_journal(path)
    return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFlock(str(path) + ".flock")))


def optuna_study_name(study: Study) -> str:
    return f"{study.name}-{study.fingerprint()}"
