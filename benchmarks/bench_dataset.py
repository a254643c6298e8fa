"""A benchmark's dataset under results/examples/<name>: the raw measurements and a run record.

The machine a benchmark runs on may be shared, so the record holds how busy it was (the load
average before and after) beside the command, the date and the core count; the docs' generated
text quotes them. The folder is written whole into a temporary sibling and renamed into place,
so a run that dies half-way leaves the previous dataset as it was.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "results" / "examples"
RUN_FILE = "run.json"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class RunRecord:
    """What ran, when and on how busy a machine: started before the measurements, finished after."""

    command: str
    started: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)
    load_avg_before: list[float] = field(default_factory=_load)
    load_avg_after: list[float] = field(default_factory=list)
    commit: str = field(default_factory=_commit)

    @classmethod
    def from_argv(cls) -> "RunRecord":
        script = Path(sys.argv[0]).resolve()
        try:
            shown = script.relative_to(ROOT).as_posix()
        except ValueError:
            shown = script.name
        return cls(" ".join(["python", shown, *map(shlex.quote, sys.argv[1:])]))

    def finish(self, **extra: Any) -> dict[str, Any]:
        self.load_avg_after = _load()
        return {**self.__dict__, **extra}


def write_dataset(folder: Path, record: Mapping[str, Any], files: Mapping[str, Callable[[Path], None]]) -> None:
    """Write ``files`` (name -> a function that writes that path) and ``run.json`` into ``folder``, atomically."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp's is 0700
    try:
        for name, write in files.items():
            write(tmp / name)
        (tmp / RUN_FILE).write_text(json.dumps(dict(record), indent=2, sort_keys=True) + "\n")
        old = folder.with_name(f".{folder.name}-old")
        if folder.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {folder}")
