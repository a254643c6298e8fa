"""docs/benchmarks.md's decisions table (``benchmarks/decisions.py``): pairs of configurations compared
seed by seed as the product compares them (:func:`orchestrator.results.paired.compare`), against their
true capacities. Pure functions of the benchmark's Parquet files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.results.paired import BETTER, DEFAULT_EQUIVALENCE_MARGIN, EQUIVALENT, TIED, WORSE, compare

__all__ = ["decision_counts", "decisions_table"]


def decision_counts(trials: pd.DataFrame, pair: str, margin: float = DEFAULT_EQUIVALENCE_MARGIN) -> dict:
    """Per seed, ``b`` against ``a`` on capacity: verdict counts and the median interval half-width."""
    mine = trials[trials["pair"] == pair]
    verdicts, halves = [], []
    for _, seed in mine.groupby("seed"):
        a = seed[seed["side"] == "a"]
        b = seed[seed["side"] == "b"]
        if a.empty or b.empty:
            continue
        c = compare(b.iloc[0].to_dict(), a.iloc[0].to_dict(), "capacity_rps", "maximize", margin=margin)
        if c is None:
            continue
        verdicts.append(c.verdict)
        halves.append((c.high - c.low) / 2)
    return {"seeds": len(verdicts), **{v: verdicts.count(v) for v in (BETTER, WORSE, EQUIVALENT, TIED)},
            "half_width": float(np.median(halves)) if halves else float("nan")}


def decisions_table(folder: Path) -> str:
    folder = Path(folder)
    trials = pd.read_parquet(folder / "trials.parquet")
    truth = pd.read_parquet(folder / "truth.parquet") if (folder / "truth.parquet").exists() else None
    true_cap = truth.groupby("config")["capacity_rps"].median().to_dict() if truth is not None else {}
    lines = ["| pair (b against a) | true capacity a → b req/s | true difference | seeds | ranked b better | "
             "equivalent within ±5% | tied | ranked wrong | median paired half-width | windows a trial (median) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for pair in dict.fromkeys(trials["pair"]):
        mine = trials[trials["pair"] == pair]
        a_cfg = mine[mine["side"] == "a"]["config"].iloc[0]
        b_cfg = mine[mine["side"] == "b"]["config"].iloc[0]
        label = f"{pair}: {a_cfg} → {b_cfg}" if a_cfg != b_cfg else f"{pair}: {a_cfg} twice"
        ta, tb = true_cap.get(a_cfg), true_cap.get(b_cfg)
        truth_cell = f"{ta:.1f} → {tb:.1f}" if ta and tb else "-"
        diff = f"{(tb / ta - 1) * 100:+.1f}%" if ta and tb else "-"
        n = decision_counts(trials, pair)
        windows = mine["extra_json"].map(_windows).median()
        lines.append(f"| {label} | {truth_cell} | {diff} | {n['seeds']} | {n[BETTER]} | {n[EQUIVALENT]} | {n[TIED]} | "
                     f"{n[WORSE]} | ±{n['half_width'] * 100:.1f}% | {windows:.0f} |")
    return "\n".join(lines)


def _windows(extra: object) -> float:
    if not isinstance(extra, str):
        return float("nan")
    cap = json.loads(extra).get("capacity") or {}
    return float(cap.get("windows") or cap.get("levels") or float("nan"))
