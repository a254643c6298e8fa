"""Writing a benchmark's dataset: its raw rows and a ``run.json`` of how they were made.

A benchmark whose numbers the docs show writes them under ``results/examples/<name>/``; the docs'
tables and the figures beside them are computed from those files (``orchestrator/doc_tables``),
never copied from a printout. The folder is written whole or not at all (:func:`write_files`): a run
killed midway leaves the previous dataset in place.

One record of a run, :class:`RunRecord`, in every benchmark's ``run.json``: the command, the commit,
when it started, and how busy the machine was (its cores, the load average before and after), which
the docs text quotes beside the figures.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "results" / "examples"
RUN_FILE = "run.json"


def commit() -> str:
    """The repository's short commit (with ``+dirty`` when tracked files differ from it), or ""."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "orchestrator", "benchmarks"], cwd=ROOT,
                               timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if head and dirty else "")


def command(script: str, argv: Optional[Sequence[str]]) -> str:
    """The command line as run from the repository root (an output folder inside it named relatively)."""
    words = []
    for w in argv or ():
        p = Path(w)
        if p.is_absolute() and p.resolve().is_relative_to(ROOT):
            w = str(p.resolve().relative_to(ROOT))
        words.append(w)
    return shlex.join(["python", f"benchmarks/{script}", *words])


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
    commit: str = field(default_factory=commit)

    @classmethod
    def for_script(cls, script: str, argv: Optional[Sequence[str]]) -> "RunRecord":
        """The record of ``benchmarks/<script>`` run with ``argv``, started now."""
        return cls(command(script, argv))

    @classmethod
    def from_argv(cls) -> "RunRecord":
        script = Path(sys.argv[0]).resolve()
        return cls(command(script.name, sys.argv[1:]) if script.parent == ROOT / "benchmarks"
                   else shlex.join(["python", script.name, *sys.argv[1:]]))

    def finish(self, **extra: Any) -> dict[str, Any]:
        self.load_avg_after = _load()
        return {**self.__dict__, **extra}


def write_files(out: Path, run: Mapping[str, Any], files: Mapping[str, Callable[[Path], None]]) -> Path:
    """Write ``files`` (name -> a function that writes that path) and ``run`` (as run.json) into ``out``,
    replacing what was there. Everything goes to a sibling temporary folder first, which then takes
    ``out``'s name (the same folder, so the same filesystem: a rename)."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's folder is private; the dataset is not
        for name, write_one in files.items():
            write_one(tmp / name)
        (tmp / RUN_FILE).write_text(json.dumps(dict(run), indent=2, sort_keys=True) + "\n")
        old = out.with_name(f".{out.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def write(out: Path, tables: Mapping[str, Any], run: Mapping[str, Any]) -> Path:
    """:func:`write_files` of ``tables`` (file name -> DataFrame, as Parquet)."""
    return write_files(out, run, {name: (lambda path, frame=frame: frame.to_parquet(path, index=False))
                                  for name, frame in tables.items()})
