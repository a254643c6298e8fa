"""What many generated texts say about a dataset: where it ran, which versions, which run, the calls.

Pure readers of a study folder (its trials rows, its run logs); the texts' modules build sentences
from them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd

from orchestrator.doc_tables.blocks import series
from orchestrator.doc_tables.h200 import journal_trials, short_id

_SIGTERM = re.compile(r"SIGTERM received at time=(\d+)")
_RESUMING = re.compile(r"resuming run (\S+): (\d+) trials? already recorded")
_RUN_DONE = re.compile(r"^run (\S+): (\d+) trial\(s\) in (\d+) s", re.MULTILINE)
_COMPLETED = re.compile(r"\] (r\d{8}-\d{6}-\w+-\d{4}) completed")
_SCORED = re.compile(r"scored (\d+) of (\d+) configurations in the simulator in ([0-9.]+) s")


def gpu_name(trials: pd.DataFrame) -> str:
    """``H200``, ``H100 80GB``: the rows' GPU as the docs write it (one GPU model per dataset)."""
    gpus = set(trials["gpu"].dropna())
    if len(gpus) != 1:
        raise ValueError(f"expected one GPU model in the rows, found {sorted(gpus)}")
    return gpus.pop().replace("-", " ")


def versions(trials: pd.DataFrame, *names: str) -> str:
    """``vLLM 0.26.0, Ray 2.58.0`` from the rows' ``versions_json`` (one version of each per dataset)."""
    titles = {"vllm": "vLLM", "ray": "Ray", "torch": "torch", "python": "Python"}
    found = [json.loads(v) for v in trials["versions_json"].dropna()]
    out = []
    for name in names:
        seen = {f.get(name) for f in found} - {None}
        if len(seen) != 1:
            raise ValueError(f"expected one {name} version in the rows, found {sorted(seen)}")
        out.append(f"{titles.get(name, name)} {seen.pop()}")
    return ", ".join(out)


def run_id(trials: pd.DataFrame) -> str:
    ids = set(trials["run_id"].dropna())
    if len(ids) != 1:
        raise ValueError(f"expected one run in the rows, found {sorted(ids)}")
    return ids.pop()


@dataclass(frozen=True)
class Call:
    """One ``orchestrator run`` call of a study, from its log (``run<N>.log``)."""

    log: str
    resumed_with: Optional[int]  # trials recorded before this call, when it resumed
    stopped_at: Optional[pd.Timestamp]  # when the call was stopped (SIGTERM), if it was
    seconds: Optional[int]  # the run's own "in N s", when it finished
    scored: Optional[tuple[int, float]]  # configurations the simulator scored, and the seconds it took


def calls(study_dir: str | Path) -> list[Call]:
    """The study's calls in order, read from its ``run*.log`` files."""
    out = []
    for log in sorted(Path(study_dir).glob("run*.log")):
        text = log.read_text()
        resumed = _RESUMING.search(text)
        stop = _SIGTERM.search(text)
        done = _RUN_DONE.search(text)
        scored = _SCORED.search(text)
        out.append(Call(log.name, int(resumed.group(2)) if resumed else None,
                        pd.Timestamp(int(stop.group(1)), unit="s", tz="UTC") if stop else None,
                        int(done.group(3)) if done else None,
                        (int(scored.group(1)), float(scored.group(3))) if scored else None))
    return out


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def clock(ts) -> str:
    return pd.Timestamp(ts).round("s").strftime("%H:%M:%S")


def _completed_in(study_dir: str | Path, log: str) -> list[str]:
    """The trials a call's log reports completed, by their short ids."""
    return [short_id(m.group(1)) for m in _COMPLETED.finditer((Path(study_dir) / log).read_text())]


def stop_story(study_dir: str | Path) -> str:
    """How a study run in several calls was stopped and resumed, from its logs and its Optuna journal
    (when each trial started and completed): "the first stopped at the call's time limit at 20:18:34,
    76 s after trial 0001 had completed (20:17:18), before the next started; the second resumed with
    2 trials recorded and ran trial 0002"."""
    journal = journal_trials(study_dir)
    parts = []
    ordinals = ("first", "second", "third", "fourth")
    for i, call in enumerate(calls(study_dir)):
        done = _completed_in(study_dir, call.log)
        if call.resumed_with is not None:
            parts.append(f"the {ordinals[i]} resumed with {plural(call.resumed_with, 'trial')} recorded"
                         + (f" and ran trial {series(done)}" if done else ""))
        if call.stopped_at is None:
            continue
        when = call.stopped_at.tz_convert(None)
        running = [n for n, t in journal.items() if t.datetime_start is not None and t.datetime_start <= when
                   and (t.datetime_complete is None or t.datetime_complete > when)]
        if running:
            parts.append(f"the {ordinals[i]} stopped at the call's time limit during trial {running[0]:04d}, "
                         "which the journal leaves running")
            continue
        last = max((n for n, t in journal.items() if t.datetime_complete is not None
                    and t.datetime_complete <= when), key=lambda n: journal[n].datetime_complete)
        completed = journal[last].datetime_complete
        parts.append(f"the {ordinals[i]} stopped at the call's time limit at {clock(when)}, "
                     f"{round((when - completed).total_seconds()):.0f} s after trial {last:04d} had completed "
                     f"({clock(completed)}), before the next started")
    return "; ".join(parts)
