"""docs/benchmarks.md's interval-coverage table and its prose, from ``results/examples/ci-coverage``.

``benchmarks/ci_coverage.py --output DIR`` stores every window's point value and interval per metric
(``windows.parquet``: rate, seed, metric, block length, point, whether it has an interval, low,
high; an empty end is unbounded) and the run (``run.json``). The truth (the median point value over the seeds), the
seeds' spread, the coverage and the intervals' widths are computed here.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from orchestrator.doc_tables.blocks import join, paragraph, series, span
from orchestrator.doc_tables.h200 import markdown
from orchestrator.doc_tables.search_efficiency import code_block, duration, machine

WINDOWS_FILE, RUN_FILE = "windows.parquet", "run.json"
SLO_METRICS = ("ttft_p99_ms", "ttft_p90_ms", "ttft_p50_ms", "tpot_p50_ms", "e2el_p99_ms")  # the studies' usual limits
UNDER = 0.10  # coverage this far below the promise is called under-covered
NAMES = {"ttft_p99_ms": "TTFT p99", "ttft_p90_ms": "TTFT p90", "ttft_p50_ms": "TTFT p50", "tpot_p50_ms": "TPOT p50",
         "tpot_p99_ms": "TPOT p99", "e2el_p99_ms": "E2E latency p99", "output_throughput": "output throughput"}


@dataclass(frozen=True)
class Coverage:
    """One metric at one rate and block length, over the seeds."""

    rate: float
    metric: str
    block_s: float
    truth: float  # the median point value
    spread_90: float  # the seeds' 5-95% range over the truth
    coverage: float  # share of the windows whose interval holds the truth
    median_width: float  # of the intervals, over the truth
    windows: int


def coverage(windows: pd.DataFrame) -> list[Coverage]:
    """Per rate, metric and block length, in the order the benchmark measured them."""
    out = []
    for (rate, metric), g in windows.groupby(["rate", "metric"], sort=False):
        points = g.drop_duplicates("seed")["point"].to_numpy(float)
        truth = float(statistics.median(points))
        spread = float((np.percentile(points, 95) - np.percentile(points, 5)) / truth)
        for block_s, b in g.groupby("block_s", sort=False):
            b = b[b["interval"]]
            low = b["low"].fillna(-math.inf).to_numpy(float)
            high = b["high"].fillna(math.inf).to_numpy(float)
            covered = float(((low <= truth) & (truth <= high)).mean())
            width = float(statistics.median((high - low) / truth))
            out.append(Coverage(float(rate), str(metric), float(block_s), truth, spread, covered, width, len(b)))
    return out


def load(folder: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    folder = Path(folder)
    return pd.read_parquet(folder / WINDOWS_FILE), json.loads((folder / RUN_FILE).read_text())


def table(windows: pd.DataFrame, block_column: Optional[bool] = None) -> str:
    """The coverage table; a block-length column where asked, or by default when the run compared several."""
    rows = coverage(windows)
    blocks = len({r.block_s for r in rows}) > 1 if block_column is None else block_column
    cells = [[f"{r.rate:g}", r.metric, f"{r.truth:.4g}", f"{r.spread_90:.1%}",
              *([f"{r.block_s:g}"] if blocks else []), f"{r.coverage:.0%}", f"{r.median_width:.1%}"] for r in rows]
    return markdown(["rate req/s", "metric", "truth (median)", "seeds' 5–95% spread", *(["block s"] if blocks else []),
                     "coverage", "median interval width"], "rlrr" + ("r" if blocks else "") + "rr", cells)


def coverage_table(folder: str | Path) -> str:
    return table(load(folder)[0])


# ---------------------------------------------------------------- prose
def _pcts(values) -> str:
    return span([100 * v for v in values], ".0f") + "%"


def coverage_setup(folder: str | Path) -> str:
    """What was measured, how, with the command that wrote the dataset and what the run took."""
    windows, run = load(folder)
    blocks = series([f"{b:g}" for b in run["blocks"]], "or")
    return join(
        paragraph(f"`benchmarks/ci_coverage.py`: on the simulator in virtual time the truth is known (the median over "
                  f"{run['seeds']} seeds at a rate), so the coverage of one window's {run['confidence']:.0%} intervals "
                  f"can be counted. The H200 chat workload and vLLM's defaults on an H200 simulator, "
                  f"{run['duration']:g} s windows at {series([f'{r:g}' for r in run['rates']])} req/s, the product's "
                  f"intervals (`orchestrator/measure/confidence.py`: block bootstrap, {blocks} s blocks, widened per "
                  "statistic):"),
        code_block(run["command"]),
        paragraph(f"{machine(run)}, one process, "
                  f"{duration(run['seconds'])}, at commit {run['commit']} on {run['started'][:10]}; "
                  f"{len(windows.drop_duplicates(['rate', 'seed']))} windows:"))


def coverage_findings(folder: str | Path) -> str:
    """How close the intervals come to what they promise: the usual SLO metrics, and those under-covered."""
    windows, run = load(folder)
    rows = coverage(windows)
    promise = float(run["confidence"])
    slo = [r for r in rows if r.metric in SLO_METRICS]
    under = [r for r in rows if r.coverage < promise - UNDER]
    sentences = []
    if slo:
        sentences.append(f"The intervals of the metrics that studies usually limit ({series([NAMES[m] for m in SLO_METRICS])})"
                         f" covered the truth {_pcts(r.coverage for r in slo)} of the time at every rate, against "
                         f"{promise:.0%} promised.")
    if under:
        by_metric: dict[str, list[Coverage]] = {}
        for r in under:
            by_metric.setdefault(r.metric, []).append(r)
        parts = [f"{NAMES.get(m, m)} at {series([f'{r.rate:g}' for r in rs])} req/s ({_pcts(r.coverage for r in rs)})"
                 for m, rs in by_metric.items()]
        sentences.append(f"Under-covered (more than {100 * UNDER:.0f} points short): {series(parts)}."
                         + (f" TPOT p99's tail moves with the batch size over longer than a {run['duration']:g} s "
                            "window." if "tpot_p99_ms" in by_metric else ""))
    else:
        sentences.append(f"No metric at any rate covered more than {100 * UNDER:.0f} points less often than promised.")
    return paragraph(*sentences)
