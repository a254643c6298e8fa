"""Window noise: how far a latency statistic moves between windows measured apart at one rate,
beyond what one window's own requests show (``benchmarks/window_noise.py``).

A window's interval (:mod:`orchestrator.measure.confidence`) is drawn from its own requests: it
knows the workload's noise inside the window, not what changes from one window to the next on a
real engine (its state, the machine beside it). Two kinds of evidence measure that change:

* a capacity level measured in two or more windows (an undecided level is measured again, fresh
  requests): the windows' own values, from the requests table;
* one configuration measured once per seed at one fixed rate (``benchmarks/repeatability.py
  --rate``): each run's trials row.

For each group of windows at one rate, the spread of ``log(value)`` between them is the total;
the windows' own intervals say how much of it their requests explain (a 90% interval spans
2 x 1.645 standard deviations in log space). The window noise is what is left:
``sqrt(max(0, between variance - mean within variance))``, pooled over the groups (weighted by
their degrees of freedom). Pure functions of result folders; ``windows_frame`` is the one step
that reads requests, and its output (``windows.parquet`` beside a dataset) is what the table is
regenerated from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from orchestrator.apps.interchange import records_from_request_rows
from orchestrator.failures import TrialStatus
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, metric_intervals, z_of
from orchestrator.measure.metrics import summarise
from orchestrator.results.query import load_requests, load_trials, study_dirs
from orchestrator.results.repeatability import series_of

__all__ = ["NOISE_METRICS", "docs_window_noise_table", "estimate_window_noise", "fixed_rate_windows", "window_noise_table",
           "windows_frame"]

NOISE_METRICS = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms",
                 "e2el_p50_ms", "e2el_p99_ms")


def windows_frame(root: str | Path, *, source: str) -> pd.DataFrame:
    """One row per measured window of every capacity level measured in two windows or more, under
    ``root`` (a study folder or a folder of them): its rate, requests, and each of
    :data:`NOISE_METRICS` with its interval (no window noise: the requests' own). Needs the
    requests table."""
    rows = []
    for study_dir in study_dirs(Path(root)):
        trials = load_trials(study_dir)
        for trial_id in trials["trial_id"]:
            requests = load_requests(study_dir, trial_ids=[trial_id])
            if requests.empty:
                continue
            for level, lv in requests.groupby("level"):
                if lv["window"].nunique() < 2:
                    continue
                for window, w in lv.groupby("window"):
                    records = records_from_request_rows(w)
                    metrics = summarise(records).as_dict()
                    intervals = metric_intervals(records, NOISE_METRICS)
                    row = {"source": source, "group": f"{study_dir.name}/{trial_id}/level {level}",
                           "window": int(window), "requests": len(records),
                           "rate": len(records) / max(float(w["scheduled_s"].max() - w["scheduled_s"].min()), 1e-9)}
                    for m in NOISE_METRICS:
                        iv = intervals.get(m)
                        row.update({m: metrics.get(m), f"{m}_low": iv.low if iv else None,
                                    f"{m}_high": iv.high if iv else None})
                    rows.append(row)
    return pd.DataFrame(rows)


def fixed_rate_windows(*dirs: str | Path, source: str) -> pd.DataFrame:
    """One row per fixed-rate run (``<series>-r<rate>-s<seed>``) under ``dirs``: its trials row's
    values and intervals, grouped by series and rate."""
    rows = []
    for d in dirs:
        for study_dir in study_dirs(Path(d)):
            series, rate, seed = series_of(study_dir.name)
            if rate is None:
                continue
            trials = load_trials(study_dir)
            for _, t in trials[trials["status"] == TrialStatus.COMPLETED].iterrows():
                row = {"source": source, "group": f"{series} at {rate:g}/s", "window": seed,
                       "requests": t.get("num_requests"), "rate": rate}
                for m in NOISE_METRICS:
                    row.update({m: t.get(m), f"{m}_low": t.get(f"{m}_low"), f"{m}_high": t.get(f"{m}_high")})
                rows.append(row)
    return pd.DataFrame(rows)


def estimate_window_noise(windows: pd.DataFrame, metric: str, confidence: float = DEFAULT_CONFIDENCE) -> dict:
    """For one metric over ``windows`` (rows of :func:`windows_frame` / :func:`fixed_rate_windows`):
    groups, windows, the between-window and within-window log standard deviations, and the noise."""
    z = z_of(confidence)
    between_ss, dof, within = 0.0, 0, []
    groups = 0
    for _, g in windows.groupby("group"):
        ok = g[[metric, f"{metric}_low", f"{metric}_high"]].apply(pd.to_numeric, errors="coerce").dropna()
        ok = ok[(ok > 0).all(axis=1)]
        if len(ok) < 2:
            continue
        logs = np.log(ok[metric].to_numpy(dtype=float))
        between_ss += float(np.sum((logs - logs.mean()) ** 2))
        dof += len(logs) - 1
        within += list(np.log(ok[f"{metric}_high"] / ok[f"{metric}_low"]) / (2 * z))
        groups += 1
    if dof == 0:
        return {"metric": metric, "groups": 0, "windows": 0, "between": math.nan, "within": math.nan,
                "noise": math.nan}
    between = math.sqrt(between_ss / dof)
    within_sd = math.sqrt(float(np.mean(np.square(within))))
    return {"metric": metric, "groups": groups, "windows": len(within), "between": between, "within": within_sd,
            "noise": math.sqrt(max(0.0, between ** 2 - within_sd ** 2))}


def window_noise_table(frames: Sequence[pd.DataFrame], metrics: Iterable[str] = NOISE_METRICS) -> str:
    """Markdown: per source and metric, the groups and windows, the two spreads and the noise."""
    lines = ["| source | metric | groups | windows | between windows (log sd) | within a window (log sd) "
             "| window noise (log sd) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for frame in frames:
        if frame.empty:
            continue
        for source, f in frame.groupby("source", sort=False):
            for m in metrics:
                r = estimate_window_noise(f, m)
                if not r["groups"]:
                    continue
                lines.append(f"| {source} | {m} | {r['groups']} | {r['windows']} | {r['between']:.2f} "
                             f"| {r['within']:.2f} | {r['noise']:.2f} |")
    return "\n".join(lines)


def docs_window_noise_table(h200: Path, h100: Path, cpu: Path, sim: Path) -> str:
    """docs/benchmarks.md's table: the GPUs' windows (``windows.parquet`` beside their repeatability
    runs), and the fixed-rate runs of CPU vLLM and the served simulator."""
    return window_noise_table([pd.read_parquet(Path(h200) / "windows.parquet"),
                               pd.read_parquet(Path(h100) / "windows.parquet"),
                               fixed_rate_windows(cpu, source="CPU vLLM (fixed rate, 5 seeds)"),
                               fixed_rate_windows(sim, source="sim, served (fixed rate, 5 seeds)")])
