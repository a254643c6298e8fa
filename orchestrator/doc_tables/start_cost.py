"""docs/benchmarks.md's table and text on what one ``orchestrator run`` costs to start, from
``results/examples/run-start-cost``.

``benchmarks/run_start_cost.py`` stores one row per timed run (``runs.parquet``: the variant, the
repeat, wall and CPU seconds; the command line's parser timings are rows of their own variants,
CPU only) and the run record (``run.json``). Means, intervals and ratios are computed here.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.blocks import paragraph
from orchestrator.doc_tables.h200 import markdown
from orchestrator.doc_tables.overhead import load_average
from orchestrator.measure.confidence import t_of

RUNS_FILE, RUN_FILE = "runs.parquet", "run.json"
NOW, BEFORE = "now", "before"
PARSER_RUN, PARSER_EVERY = "parser-run", "parser-every"
LEVEL = 0.9
VARIANT_NAMES = {BEFORE: "before (Tune loggers, idle workers ahead)", NOW: "as shipped"}
COUNTED = {"cgroup": "a cpuacct cgroup per run", "machine": "the machine's CPU counters (which count other work too)"}


@dataclass(frozen=True)
class Spread:
    """The mean of repeated measurements, its 90% t interval and the range."""

    mean: float
    low: float
    high: float
    lo: float  # min
    hi: float  # max

    def __str__(self) -> str:
        return f"{self.mean:.2f} [{self.low:.2f}, {self.high:.2f}]"


def spread(values: list[float]) -> Spread:
    m = statistics.fmean(values)
    half = t_of(LEVEL, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return Spread(m, m - half, m + half, min(values), max(values))


def load(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    folder = Path(folder)
    return pd.read_parquet(folder / RUNS_FILE), json.loads((folder / RUN_FILE).read_text())


def _of(frame: pd.DataFrame, variant: str, column: str) -> Spread:
    return spread(frame[frame["variant"] == variant][column].tolist())


def start_cost_setup(folder: str | Path) -> str:
    frame, run = load(folder)
    return paragraph(f"{load_average(run)}, CPU counted from {COUNTED[run['cpu_counted']]}; "
                     f"{run['repeats']} runs of each variant, {run['trials']} trials a run "
                     f"(mean [{100 * LEVEL:.0f}% interval], min-max):")


def start_cost_table(folder: str | Path) -> str:
    frame, _ = load(folder)
    rows = []
    for v in (BEFORE, NOW):
        cpu, wall = _of(frame, v, "cpu_s"), _of(frame, v, "wall_s")
        rows.append([VARIANT_NAMES[v], f"{cpu}, {cpu.lo:.2f}-{cpu.hi:.2f}", f"{wall}, {wall.lo:.2f}-{wall.hi:.2f}"])
    return markdown(["variant", "CPU-s", "wall s"], "lll", rows)


def start_cost_findings(folder: str | Path) -> str:
    frame, _ = load(folder)
    now, before = _of(frame, NOW, "cpu_s"), _of(frame, BEFORE, "cpu_s")
    wall_now, wall_before = _of(frame, NOW, "wall_s"), _of(frame, BEFORE, "wall_s")
    one, every = _of(frame, PARSER_RUN, "cpu_s"), _of(frame, PARSER_EVERY, "cpu_s")
    disjoint = now.high < before.low or before.high < now.low
    dwall = wall_before.mean - wall_now.mean
    return paragraph(
        f"As shipped / before: {now.mean / before.mean:.2f}x CPU, the intervals "
        f"{'disjoint' if disjoint else '**overlapping** (no difference shown at this many runs)'}; the wall time "
        f"{abs(dwall):.1f} s {'shorter' if dwall >= 0 else 'longer'}"
        + ("." if wall_now.high < wall_before.low or wall_before.high < wall_now.low else
           ", its intervals overlapping (on a shared machine the wall time carries the other work's noise).")
        + f" The command line: {one} CPU-s for `run` "
        f"alone against {every} with every command ({one.mean / every.mean:.2f}x), another "
        f"{every.mean - one.mean:.1f} CPU-s a run that the `before` variant already has. Nothing read Tune's logger "
        "files (the study's rows are its results, and resuming reads the Optuna journal and the rows); the trial "
        "actors, the sink and the replicas each get a worker started for them, so the ones started ahead only "
        "imported Ray and waited.")
