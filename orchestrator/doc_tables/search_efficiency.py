"""docs/benchmarks.md's search-efficiency table and its prose, from ``results/examples/search-efficiency``.

``benchmarks/search_efficiency.py --output DIR`` stores every grid point it measured (``grid.parquet``:
landscape, configuration, status, whether it met the SLOs, goodput), every search's count of
measured trials until one reached the target (``searches.parquet``: landscape, sampler, seed,
trials, and the cap a search that never reached it stands at, plus one) and the run
(``run.json``). The optimum, the points near it, the medians and the ratios are computed here.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, count_word, join, paragraph, series, span
from orchestrator.doc_tables.h200 import markdown

GRID_FILE, SEARCHES_FILE, RUN_FILE = "grid.parquet", "searches.parquet", "run.json"
BASELINES = ("random", "grid")
SHARE_BOUND = 0.15  # the benchmark's target: the default sampler's median share of the grid's trials
NAMES = {"tpe": "TPE", "nsga2": "NSGA-II", "gp": "GP", "random": "random", "grid": "grid"}


@dataclass(frozen=True)
class Landscape:
    """One measured grid: its size, how many points start and meet the SLOs, the best goodput among
    those that do, and how many are within the target share of it."""

    name: str
    size: int
    started: int
    feasible: int
    best: float
    good: int


@dataclass(frozen=True)
class Row:
    """One sampler on one landscape: median and p90 measured trials (``cap + 1``: never reached)."""

    landscape: Landscape
    sampler: str
    median: float
    p90: int
    cap: int
    vs: dict[str, Optional[float]]  # the median over each baseline's median, measured in the same run

    @property
    def share(self) -> float:
        return self.median / self.landscape.size


def landscapes(grid: pd.DataFrame, target: float) -> list[Landscape]:
    """The grids, in the order they were measured."""
    out = []
    for name in dict.fromkeys(grid["landscape"]):
        g = grid[grid["landscape"] == name]
        ok = g[g["feasible"]]
        best = float(ok["goodput"].max()) if len(ok) else 0.0
        out.append(Landscape(name, len(g), int((g["status"] == "completed").sum()), len(ok), best,
                             int((ok["goodput"] >= target * best).sum())))
    return out


def p90(xs: list[int]) -> int:
    """The benchmark's p90: the value at rank ceil(0.9 n) of the sorted counts."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.9 * len(xs)) - 1)]


def rows(grid: pd.DataFrame, searches: pd.DataFrame, target: float) -> list[Row]:
    out = []
    for land in landscapes(grid, target):
        s = searches[searches["landscape"] == land.name]
        medians = {k: float(statistics.median(g["trials"])) for k, g in s.groupby("sampler", sort=False)}
        for sampler, g in s.groupby("sampler", sort=False):
            m = medians[sampler]
            out.append(Row(land, str(sampler), m, p90(list(g["trials"])), int(g["cap"].iloc[0]),
                           {b: m / medians[b] if b in medians else None for b in BASELINES}))
    return out


def _shown(x: float, cap: int) -> str:
    return f">{cap}" if x > cap else f"{x:g}"


def table(grid: pd.DataFrame, searches: pd.DataFrame, run: dict[str, Any]) -> str:
    """The table and the verdict line, as the benchmark prints them."""
    target = float(run["target"])
    lines = [[r.landscape.name, str(r.landscape.size), str(r.landscape.good), r.sampler, _shown(r.median, r.cap),
              _shown(r.p90, r.cap), f"{r.share:.1%}",
              *(_ratio_cell(r.vs[b]) for b in BASELINES)] for r in rows(grid, searches, target)]
    text = markdown(["landscape", "grid size", f"within {target:.0%}", "sampler", "median trials", "p90",
                     "share of grid", "vs random", "vs grid"], "lrrlrrrrr", lines)
    return text + "\n\n" + verdict(grid, searches, run)


def _ratio_cell(ratio: Optional[float]) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _default_rows(grid: pd.DataFrame, searches: pd.DataFrame, run: dict[str, Any]) -> list[Row]:
    return [r for r in rows(grid, searches, float(run["target"])) if r.sampler == run["default_sampler"]]


def verdict(grid: pd.DataFrame, searches: pd.DataFrame, run: dict[str, Any]) -> str:
    default = _default_rows(grid, searches, run)
    if not default:
        return f"default sampler ({run['default_sampler']}): not run"
    worst = max(r.share for r in default)
    return (f"default sampler ({run['default_sampler']}): median share of the grid's trials {worst:.1%} on the "
            f"hardest landscape (target <= {SHARE_BOUND:.0%}): {'MET' if worst <= SHARE_BOUND else 'MISSED'}")


# ---------------------------------------------------------------- the dataset
def load(folder: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    folder = Path(folder)
    return (pd.read_parquet(folder / GRID_FILE), pd.read_parquet(folder / SEARCHES_FILE),
            json.loads((folder / RUN_FILE).read_text()))


def efficiency_table(folder: str | Path) -> str:
    return table(*load(folder))


def code_block(command: str) -> str:
    return f"```\n{command}\n```"


def efficiency_run(folder: str | Path) -> str:
    """The command that wrote the dataset, and what the run took on which machine."""
    grid, searches, run = load(folder)
    lands = landscapes(grid, float(run["target"]))
    timed = [s for s in run["grid_seconds"].values() if s is not None]
    measured = (f"after measuring the grids ({series([str(x.size) for x in lands])} points"
                + (f" in {span(timed)} s each)" if timed else ", from the cache)"))
    return join(code_block(run["command"]), paragraph(
        f"{machine(run)}, {run['jobs']} process{'' if run['jobs'] == 1 else 'es'}, {run['sampling_seconds']:.0f} s of sampling "
        f"{measured}, at commit {run['commit']} on {run['started'][:10]}. Median and p90 over {run['seeds']} seeds per "
        f"sampler; GP stops at {run['gp_cap']:.0%} of the grid:"))


def _ratio_word(r: Row, default: Row) -> str:
    name, theirs = NAMES.get(r.sampler, r.sampler), NAMES.get(default.sampler, default.sampler)
    return f"{name} {r.median:g} ({r.median / default.median:.2f}x {theirs}'s)"


def duration(seconds: float) -> str:
    """``95 s``, ``34 minutes``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def machine(run: dict[str, Any]) -> str:
    """``2 cores (load average 3.1 at the start: other work shared the machine)``."""
    load = float(run["load_avg_before"][0])
    return (f"{run['cpu_count']} cores (load average {load:g} at the start"
            + (": other work shared the machine)" if load >= 1 else ")"))


def efficiency_findings(folder: str | Path) -> str:
    """What the table says: the default sampler against the target and the others where the samplers
    differ; the landscapes where they do not; the grid sweep against random."""
    grid, searches, run = load(folder)
    target = float(run["target"])
    within = f"{100 * (1 - target):.0f}%"
    default = _default_rows(grid, searches, run)
    all_rows = rows(grid, searches, target)
    items = []
    if default:
        worst = max(default, key=lambda r: r.share)
        others = [r for r in all_rows if r.landscape == worst.landscape
                  and r.sampler not in (worst.sampler, *BASELINES)]
        name = NAMES.get(worst.sampler, worst.sampler)
        met = worst.share <= SHARE_BOUND
        items.append(
            f"The default sampler ({name}) needs at most {worst.share:.1%} of the grid's trials ({worst.median:g} of "
            f"{worst.landscape.size} on the {worst.landscape.name} landscape, where {worst.landscape.good} points "
            f"are within {within} of the optimum), against a target of at most {SHARE_BOUND:.0%}: "
            f"{'met' if met else 'missed'}."
            + (f" On that landscape it needs {worst.vs['random']:.2f}x random's trials"
               if worst.vs["random"] is not None else "")
            + (f"; the other samplers' medians there: {series([_ratio_word(r, worst) for r in others])}."
               if others else "."))
    flat = []
    for land in landscapes(grid, target):
        medians = [r.median for r in all_rows if r.landscape == land and r.sampler != "grid"]
        if medians and max(medians) <= 1.25 * min(medians):
            flat.append((land, medians))
    if flat:
        one = len(flat) == 1
        items.append(
            f"{count_word(len(flat)).capitalize()} of the {count_word(len(landscapes(grid, target)))} landscapes "
            f"{'does' if one else 'do'} not separate the samplers: every "
            f"sampler's median there is within 25% of the others' ({span([m for _, ms in flat for m in ms], 'g')} "
            f"trials). {'Its' if one else 'Their'} closed-loop goodput is bound by the users more than by the "
            "configuration: "
            + series([f"{x.good} of {x.size} ({x.name})" for x, _ in flat])
            + f" grid points are within {within} of the optimum. Harder landscapes (more users, tighter SLOs) "
            "would separate them.")
    vs_random = [r.vs["random"] for r in all_rows if r.sampler == "grid" and r.vs["random"] is not None]
    if vs_random:
        items.append(f"A grid sweep in random order needs {span(vs_random, '.1f')}x random's trials.")
    return bullets(items)
