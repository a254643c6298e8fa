"""Run-to-run spread of one configuration measured with fresh seeds (``benchmarks/repeatability.py``).

Pure functions of the trials frames of the benchmark's output folders: studies named
``<series>-s<seed>`` (capacity searches) and ``<series>-r<rate>-s<seed>`` (one window at a
fixed rate). For a capacity series: the median ``capacity_rps``, the largest distance of a run
from it (relative), and how many runs' intervals hold it; for a fixed-rate series the same
spread for TTFT p50/p99 and TPOT p50.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from orchestrator.failures import TrialStatus
from orchestrator.results.query import load_trials

__all__ = ["capacity_spread", "repeatability_table", "fixed_rate_table", "series_of"]

_SEED = re.compile(r"^(?P<series>.+?)(?:-k(?P<start>\d+))?(?:-r(?P<rate>[0-9.]+))?-s(?P<seed>\d+)$")
FIXED_METRICS = (("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"), ("tpot_p50_ms", "TPOT p50 ms"))


def series_of(study: str) -> tuple[str, Optional[float], Optional[int]]:
    """``(series, fixed rate or None, seed)`` of a benchmark study name."""
    m = _SEED.match(study)
    if not m:
        return study, None, None
    return m["series"], float(m["rate"]) if m["rate"] else None, int(m["seed"])


def _frame(*dirs: Path) -> pd.DataFrame:
    frames = [load_trials(d) for d in dirs]
    df = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else frames[0]
    parts = df["study"].map(series_of)
    df = df.copy().assign(series=[p[0] for p in parts], fixed_rate=[p[1] for p in parts], seed=[p[2] for p in parts])
    return df[df["status"] == TrialStatus.COMPLETED]


def _spread(values: np.ndarray) -> tuple[float, float]:
    med = float(np.median(values))
    return med, float(np.max(np.abs(values - med)) / med) if med else float("nan")


def capacity_spread(group: pd.DataFrame) -> dict:
    """One capacity series: median, each run's distance from it, and the intervals that hold it."""
    cap = pd.to_numeric(group["capacity_rps"], errors="coerce").to_numpy(dtype=float)
    med, spread = _spread(cap)
    lows = pd.to_numeric(group.get("capacity_rps_low"), errors="coerce").to_numpy(dtype=float)
    highs = pd.to_numeric(group.get("capacity_rps_high"), errors="coerce").fillna(np.inf).to_numpy(dtype=float)
    holds = int(np.sum((lows <= med) & (med <= highs)))
    widths = (highs - lows) / med
    return {"runs": len(cap), "median": med, "min": float(cap.min()), "max": float(cap.max()), "spread": spread,
            "holding": holds, "width": float(np.median(widths)) if len(widths) else float("nan"),
            "wall": float(np.median(pd.to_numeric(group["wall_time_s"], errors="coerce"))),
            "within_3pct": spread <= 0.03, "every_interval_holds": holds == len(cap)}


def _label(group: pd.DataFrame) -> str:
    first = group.iloc[0]
    where = first["gpu"] if first["engine"] != "sim" else f"{first['gpu']} (sim, {first['engine_mode']})"
    return f"{first['series']} ({first['engine']}, {where})"


def repeatability_table(*dirs: Path) -> str:
    """The capacity series of the benchmark's folders, one row each."""
    df = _frame(*dirs)
    df = df[df["fixed_rate"].isna()]
    lines = ["| configuration | runs | capacity_rps median | min – max | largest distance from the median | "
             "intervals holding the median | median interval width | trial wall s (median) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for _, group in sorted(df.groupby("series"), key=lambda kv: kv[0]):
        s = capacity_spread(group)
        lines.append(f"| {_label(group)} | {s['runs']} | {s['median']:.1f} | {s['min']:.1f} – {s['max']:.1f} | "
                     f"±{s['spread']:.1%} | {s['holding']} of {s['runs']} | {s['width']:.0%} | {s['wall']:.0f} |")
    return "\n".join(lines)


def fixed_rate_table(*dirs: Path) -> str:
    """The fixed-rate series of the benchmark's folders: each metric's median and spread."""
    df = _frame(*dirs)
    df = df[df["fixed_rate"].notna()]
    head = "| configuration | rate req/s | runs | " + " | ".join(
        f"{title}: median (min – max, ±)" for _, title in FIXED_METRICS) + " |"
    lines = [head, "| --- | ---: | ---: |" + " ---: |" * len(FIXED_METRICS)]
    for (_, rate), group in sorted(df.groupby(["series", "fixed_rate"]), key=lambda kv: kv[0]):
        cells = []
        for metric, _ in FIXED_METRICS:
            v = pd.to_numeric(group[metric], errors="coerce").dropna().to_numpy(dtype=float)
            med, spread = _spread(v)
            cells.append(f"{med:.1f} ({v.min():.1f} – {v.max():.1f}, ±{spread:.0%})")
        lines.append(f"| {_label(group)} | {rate:g} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
