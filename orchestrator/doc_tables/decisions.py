"""docs/benchmarks.md's decision tables: pairs of configurations compared seed by seed as the product
compares them (:func:`orchestrator.results.paired.compare`) against their true capacities
(``benchmarks/decisions.py``), and one configuration started again and again on the same requests
(``benchmarks/starts_gpu.sh``, ``benchmarks/repeatability.py --starts``). Pure functions of the
benchmarks' Parquet files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from orchestrator.results.paired import (BETTER, DEFAULT_EQUIVALENCE_MARGIN, EQUIVALENT, MEASUREMENTS, TIED, WORSE,
                                         compare)
from orchestrator.results.query import load_trials
from orchestrator.results.repeatability import series_of

__all__ = ["decision_counts", "decisions_table", "interval_coverage_table", "paired_starts_table", "starts_table"]


def decision_counts(trials: pd.DataFrame, pair: str, margin: float = DEFAULT_EQUIVALENCE_MARGIN,
                    true_difference: Optional[float] = None) -> dict:
    """Per seed, ``b`` against ``a`` on capacity: verdict counts, the median interval half-width, and how
    many intervals hold ``true_difference`` (b / a - 1)."""
    mine = trials[trials["pair"] == pair]
    verdicts, halves, holding = [], [], 0
    for _, seed in mine.groupby("seed"):
        a = seed[(seed["side"] == "a") & (seed["status"] == "completed")]
        b = seed[(seed["side"] == "b") & (seed["status"] == "completed")]
        if a.empty or b.empty:
            continue
        c = compare(b.iloc[0].to_dict(), a.iloc[0].to_dict(), "capacity_rps", "maximize", margin=margin)
        if c is None:
            continue
        verdicts.append(c.verdict)
        halves.append((c.high - c.low) / 2)
        holding += true_difference is not None and c.low <= true_difference <= c.high
    return {"seeds": len(verdicts), **{v: verdicts.count(v) for v in (BETTER, WORSE, EQUIVALENT, TIED)},
            "half_width": float(np.median(halves)) if halves else float("nan"), "holding": holding}


def decisions_table(folder: Path) -> str:
    folder = Path(folder)
    trials = pd.read_parquet(folder / "trials.parquet")
    truth = pd.read_parquet(folder / "truth.parquet")
    truth = truth[truth["status"] == "completed"]
    true_cap = truth.groupby("config")["capacity_rps"].median().to_dict()
    lines = ["| pair (b against a) | true capacity a → b req/s | true difference | seeds | ranked b better | "
             "equivalent within ±5% | tied | ranked b worse | paired intervals holding the true difference | "
             "median paired half-width | windows a trial (median) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for pair in dict.fromkeys(trials["pair"]):
        mine = trials[trials["pair"] == pair]
        a_cfg = mine[mine["side"] == "a"]["config"].iloc[0]
        b_cfg = mine[mine["side"] == "b"]["config"].iloc[0]
        label = f"{pair}: {a_cfg} → {b_cfg}" if a_cfg != b_cfg else f"{pair}: {a_cfg} twice"
        ta, tb = true_cap[a_cfg], true_cap[b_cfg]
        n = decision_counts(trials, pair, true_difference=tb / ta - 1)
        windows = mine["extra_json"].map(_windows).median()
        lines.append(f"| {label} | {ta:.1f} → {tb:.1f} | {(tb / ta - 1) * 100:+.1f}% | {n['seeds']} | {n[BETTER]} | "
                     f"{n[EQUIVALENT]} | {n[TIED]} | {n[WORSE]} | {n['holding']} of {n['seeds']} | "
                     f"±{n['half_width'] * 100:.1f}% | {windows:.0f} |")
    return "\n".join(lines)


def interval_coverage_table(folder: Path) -> str:
    """Each configuration of the decisions benchmark: how many of its trials' capacity intervals hold its
    true capacity (the median over the truth seeds), and their median half-width."""
    folder = Path(folder)
    trials = pd.read_parquet(folder / "trials.parquet").drop_duplicates(["seed", "config"])
    truth = pd.read_parquet(folder / "truth.parquet")
    true_cap = truth[truth["status"] == "completed"].groupby("config")["capacity_rps"].median()
    lines = ["| configuration | true capacity req/s | trials | intervals holding it | median half-width | "
             "ill-conditioned |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for cfg, g in trials[trials["status"] == "completed"].groupby("config", sort=False):
        high = g["capacity_rps_high"].fillna(np.inf)
        holds = int(((g["capacity_rps_low"] <= true_cap[cfg]) & (true_cap[cfg] <= high)).sum())
        half = float(np.median((high - g["capacity_rps_low"]) / 2 / g["capacity_rps"]))
        ill = int((g["capacity_conditioned"].astype("boolean") == False).sum())  # noqa: E712
        lines.append(f"| {cfg} ({json.loads(g['params_json'].iloc[0])}) | {true_cap[cfg]:.1f} | {len(g)} | "
                     f"{holds} of {len(g)} | ±{half * 100:.1f}% | {ill} |")
    return "\n".join(lines)


def _windows(extra: object) -> float:
    if not isinstance(extra, str):
        return float("nan")
    cap = json.loads(extra).get("capacity") or {}
    return float(cap.get("windows") or cap.get("levels") or float("nan"))


def _starts(folder: Path) -> pd.DataFrame:
    """The completed trials of a starts benchmark's folder (``benchmarks/starts_gpu.sh``,
    ``benchmarks/repeatability.py --starts``), with their configuration (``series``) and start number."""
    frames = [load_trials(d) for d in sorted(Path(folder).iterdir()) if (d / "trials").is_dir()]
    df = pd.concat([f for f in frames if len(f)], ignore_index=True)
    df = df[df["status"] == "completed"].copy()
    df["series"] = [series_of(s)[0] for s in df["study"]]
    df["start"] = df["study"].str.extract(r"-k(\d+)-")[0].astype(int)
    return df.sort_values(["series", "start"])


def starts_table(*folders: Path) -> str:
    """One configuration per row: its capacity on every engine start (the same requests each time), the
    median, how many intervals hold it, and how many starts were marked ill-conditioned."""
    lines = ["| configuration | starts | capacity_rps, start by start [interval] | median | intervals holding the "
             "median | ill-conditioned | median half-width | search wall s (median) |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for folder in folders:
        df = _starts(folder)
        for series, g in df.groupby("series", sort=True):
            cap = g["capacity_rps"].to_numpy(dtype=float)
            low = g["capacity_rps_low"].to_numpy(dtype=float)
            high = g["capacity_rps_high"].fillna(np.inf).to_numpy(dtype=float)
            med = float(np.median(cap))
            holds = int(np.sum((low <= med) & (med <= high)))
            ill = int((g["capacity_conditioned"].astype("boolean") == False).sum())  # noqa: E712
            halves = [(h - lo) / 2 / c for c, lo, h in zip(cap, low, high) if c > 0 and np.isfinite(h)]
            cells = ", ".join(f"{c:.1f} [{lo:.1f}, {'inf' if np.isinf(h) else f'{h:.1f}'}]"
                              for c, lo, h in zip(cap, low, high))
            wall = float(np.median(g["wall_time_s"]))
            lines.append(f"| {series} | {len(g)} | {cells} | {med:.1f} | {holds} of {len(g)} | {ill} of {len(g)} | "
                         f"{'±' + format(np.median(halves) * 100, '.0f') + '%' if halves else '-'} | {wall:.0f} |")
    return "\n".join(lines)


def paired_starts_table(folder: Path, better: str, baseline: str) -> str:
    """``better`` against ``baseline`` on capacity, start by start (the k-th start of each: the same
    requests, two engine starts) and pooled over every start."""
    df = _starts(folder)
    a = df[df["series"].str.endswith(better)]
    b = df[df["series"].str.endswith(baseline)]
    lines = ["| comparison | paired difference of capacity_rps [90% interval] | verdict |", "| --- | --- | --- |"]
    for k in sorted(set(a["start"]) & set(b["start"])):
        ra, rb = a[a["start"] == k].iloc[0].to_dict(), b[b["start"] == k].iloc[0].to_dict()
        c = compare(ra, rb, "capacity_rps", "maximize")
        lines.append(f"| start {k}: {better} against {baseline} | {c.describe()} | {c.verdict} |")
    pa, pb = dict(a.iloc[-1].to_dict()), dict(b.iloc[-1].to_dict())
    pa[MEASUREMENTS], pb[MEASUREMENTS] = a.to_dict("records"), b.to_dict("records")
    pa["capacity_rps"], pb["capacity_rps"] = float(np.median(a["capacity_rps"])), float(np.median(b["capacity_rps"]))
    c = compare(pa, pb, "capacity_rps", "maximize")
    lines.append(f"| every start, pooled (medians {pa['capacity_rps']:.1f} against {pb['capacity_rps']:.1f}) | "
                 f"{c.describe()} | {c.verdict} |")
    return "\n".join(lines)
