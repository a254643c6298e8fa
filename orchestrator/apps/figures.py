"""The report's figures: tables in, matplotlib ``Figure`` objects out (no pyplot, no global state).

Each function draws one table of :mod:`orchestrator.apps.report_tables`;
:func:`figure_png` turns a figure into PNG bytes for the page.
"""

from __future__ import annotations

import io
from typing import Union

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from orchestrator.apps.report_tables import LEVEL_X_COLUMNS, START_PHASE_LABELS, axes_metrics
from orchestrator.failures import TrialStatus
from orchestrator.measure.metrics import default_direction
from orchestrator.results.pareto import pareto_front
from orchestrator.study.spec import Study

# How each kind of point is drawn: (label, marker, face colour, edge colour).
STYLES: dict[str, tuple[str, str, str, str]] = {
    "front": ("on the Pareto front", "*", "#d62728", "#7f0000"),
    "feasible": ("meets the SLOs", "o", "#1f77b4", "#1f77b4"),
    "slo_missed": ("misses an SLO", "o", "none", "#7f7f7f"),
    "degraded": ("too many requests failed", "D", "none", "#bcbd22"),
    "failed": ("failed under load", "X", "#ff7f0e", "#ff7f0e"),
    "infeasible": ("could not start (infeasible)", "x", "#9467bd", "#9467bd"),
    "pruned": ("pruned before start", "v", "#8c564b", "#8c564b"),
    "error": ("orchestrator error", "s", "#e377c2", "#e377c2"),
}
STATUS_COLOURS = {TrialStatus.COMPLETED.value: "#2ca02c", TrialStatus.DEGRADED.value: "#bcbd22",
                  TrialStatus.INFEASIBLE.value: "#9467bd", TrialStatus.FAILED.value: "#ff7f0e",
                  TrialStatus.PRUNED.value: "#8c564b", TrialStatus.ERROR.value: "#e377c2"}


def _figure(width: float, height: float):
    return Figure(figsize=(width, height), layout="constrained")


def _maybe_log(ax, values: pd.Series, axis: str) -> None:
    """Log scale when the values span more than 20x, labelled 200, 500, 1,000... (no 10^x notation)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    v = v[v > 0]
    if len(v) >= 2 and v.max() / v.min() > 20:
        target = ax.xaxis if axis == "x" else ax.yaxis
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.10g}"))
        target.set_minor_formatter(NullFormatter())


def pareto_figure(trials: pd.DataFrame, categories: pd.Series, study: Study):
    """Throughput per GPU against each latency of :func:`axes_metrics`, plus a strip of unmeasured trials."""
    y, xs = axes_metrics(study)
    fig = _figure(11, 6.2)
    grid = fig.add_gridspec(2, len(xs), height_ratios=[5, 1.3])
    measured = trials[trials[y].notna()]
    feasible_any = (categories == "front").any()
    for i, x in enumerate(xs):
        ax = fig.add_subplot(grid[0, i])
        pts = measured[measured[x].notna()] if x in measured else measured.iloc[0:0]
        for cat in ("slo_missed", "degraded", "failed", "feasible", "front"):
            sel = pts[categories.loc[pts.index] == cat]
            if sel.empty:
                continue
            label, marker, face, edge = STYLES[cat]
            ax.scatter(sel[x], sel[y], marker=marker, s=130 if cat == "front" else 45, facecolors=face,
                       edgecolors=edge, linewidths=1.2, label=f"{label} ({len(sel)})", zorder=3)
        # The front on these two axes: a staircase through the non-dominated points
        # (among the trials meeting the SLOs; among all measured ones when none does).
        constraints = study.constraints if feasible_any else []
        x_dir = default_direction(x)  # latencies: lower is better; the probe's agreement: higher
        front2 = pareto_front(pts, [(y, "maximize"), (x, x_dir)], constraints) if len(pts) else pts
        if len(front2):
            f = front2.sort_values(x)
            colour = "#d62728" if feasible_any else "#555555"
            ax.step(f[x], f[y], where="post", color=colour, linestyle="-" if feasible_any else "--",
                    linewidth=1.2, zorder=2)
            ax.scatter(f[x], f[y], marker="D", s=70, facecolors="none", edgecolors=colour, linewidths=1.0, zorder=4,
                       label="front on these axes" + ("" if feasible_any else " ignoring SLOs") + f" ({len(f)})")
        for c in study.constraints:
            if c.metric == x:
                ax.axvline(c.value, color="#2ca02c", linestyle=":", linewidth=1.5, label=f"SLO {c}")
            elif c.metric == y:
                ax.axhline(c.value, color="#2ca02c", linestyle=":", linewidth=1.5, label=f"SLO {c}")
        if x_dir == "minimize":
            _maybe_log(ax, pts[x] if x in pts else pd.Series(dtype=float), "x")
        ax.set_xlabel(f"{x} ({'higher' if x_dir == 'maximize' else 'lower'} is better)")
        ax.set_ylabel(f"{y} (higher is better)")
        ax.set_title(f"{y} vs {x}")
        ax.grid(True, alpha=0.3)
        if len(pts):
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no trial measured", ha="center", va="center", transform=ax.transAxes)
    strip = fig.add_subplot(grid[1, :])
    unmeasured = trials[~trials.index.isin(measured.index)]
    kinds = [k.value for k in (TrialStatus.DEGRADED, TrialStatus.FAILED, TrialStatus.INFEASIBLE, TrialStatus.PRUNED,
                               TrialStatus.ERROR)
             if (categories.loc[unmeasured.index] == k).any()]
    for row, cat in enumerate(kinds):
        sel = unmeasured[categories.loc[unmeasured.index] == cat]
        label, marker, face, edge = STYLES[cat]
        strip.scatter(sel["trial_number"], [row] * len(sel), marker=marker, s=50, c=edge,
                      label=f"{label} ({len(sel)})")
    strip.set_yticks(range(len(kinds)), [STYLES[k][0] for k in kinds], fontsize=8)
    strip.set_ylim(-0.7, max(len(kinds), 1) - 0.3)
    numbers = pd.to_numeric(trials["trial_number"], errors="coerce")
    strip.set_xlim(numbers.min() - 0.5, numbers.max() + 0.5)
    strip.xaxis.set_major_locator(MaxNLocator(integer=True))
    strip.set_xlabel("trial number")
    strip.set_title("not measured (no latency or throughput to plot)", fontsize=9)
    if not kinds:
        strip.text(0.5, 0.5, "every trial was measured", ha="center", va="center", transform=strip.transAxes)
    strip.grid(True, axis="x", alpha=0.3)
    return fig


def curves_figure(curves: pd.DataFrame, labels: dict[str, str]):
    """TTFT p99 and TPOT p50 against load, one line per configuration."""
    fig = _figure(11, 5.0)
    axes = fig.subplots(1, 2)
    if curves.empty:
        for ax in axes:
            ax.text(0.5, 0.5, "no request measurements", ha="center", va="center", transform=ax.transAxes)
        return fig
    by_level = (curves["source"] == "level").any()
    xlabel = ("output tokens/s per GPU at each load level" if by_level
              else "requests in flight when a request was sent (binned)")
    for ax, metric in zip(axes, ("ttft_p99_ms", "tpot_p50_ms")):
        for trial_id, c in curves.groupby("trial_id", sort=False):
            c = c.sort_values("x")
            ax.plot(c["x"], c[metric], marker="o", markersize=4, label=labels.get(trial_id, trial_id))
        _maybe_log(ax, curves[metric], "y")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs load")
        ax.grid(True, alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 8), fontsize=8, frameon=False)
    return fig


def level_figure(levels: pd.DataFrame, labels: dict[str, str]):
    """Latency against each load column of a :func:`level_curves` table; hollow markers: SLO missed at that level."""
    xs = [c for c in LEVEL_X_COLUMNS if c in levels.columns]
    fig = _figure(11, 4.8)
    axes = np.atleast_1d(fig.subplots(1, len(xs)))
    metric = str(levels["latency_metric"].iloc[0])
    for ax, x in zip(axes, xs):
        for trial_id, c in levels.groupby("trial_id", sort=False):
            line, = ax.plot(c[x], c["latency"], linewidth=1.2, label=labels.get(trial_id, trial_id))
            met = c["slo_met"].fillna(False).astype(bool) if "slo_met" in c else pd.Series(True, index=c.index)
            ax.scatter(c[x][met], c["latency"][met], color=line.get_color(), s=25, zorder=3)
            ax.scatter(c[x][~met], c["latency"][~met], facecolors="none", edgecolors=line.get_color(), s=25, zorder=3)
        _maybe_log(ax, levels["latency"], "y")
        ax.set_xlabel({"rate": "requested rate of the level (req/s)"}.get(x, f"{x} achieved at the level"))
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs {x} (capacity-search levels)")
        ax.grid(True, alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 8), fontsize=8, frameon=False)
    return fig


def importance_figure(scores: dict[str, Union[pd.Series, str]]):
    fig = _figure(11, 3.6)
    axes = np.atleast_1d(fig.subplots(1, max(1, len(scores))))
    for ax, (title, s) in zip(axes, scores.items()):
        ax.set_title(f"importance for {title}", fontsize=10)
        if isinstance(s, str):
            ax.text(0.5, 0.5, s, ha="center", va="center", wrap=True, fontsize=8, transform=ax.transAxes)
            ax.set_axis_off()
            continue
        s = s.sort_values()
        ax.barh(s.index, s.to_numpy(), color="#1f77b4")
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of importance (PED-ANOVA)")
        ax.grid(True, axis="x", alpha=0.3)
    return fig


def timeline_figure(trials: pd.DataFrame):
    """One bar per trial of the latest run, from start to finish, coloured by status."""
    fig = _figure(11, 0.9 + 0.22 * min(len(trials), 60))
    ax = fig.subplots()
    t = trials.sort_values("started_at").tail(60)
    start = pd.to_datetime(t["started_at"], utc=True)
    end = pd.to_datetime(t["finished_at"], utc=True).fillna(start)
    t0 = start.min()
    left = (start - t0).dt.total_seconds().to_numpy()
    width = np.maximum((end - start).dt.total_seconds().to_numpy(), 0.5)
    colours = [STATUS_COLOURS.get(s, "#7f7f7f") for s in t["status"]]
    ax.barh(range(len(t)), width, left=left, color=colours, edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(t)), [str(n) for n in t["trial_number"]], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds since {t0:%Y-%m-%d %H:%M:%S} UTC")
    ax.set_ylabel("trial number")
    present = [s for s in STATUS_COLOURS if s in set(t["status"])]
    ax.legend(handles=[Patch(color=STATUS_COLOURS[s], label=s) for s in present], fontsize=7, ncol=len(present),
              loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def failures_figure(breakdown: pd.DataFrame):
    fig = _figure(7, 0.8 + 0.35 * max(len(breakdown), 1))
    ax = fig.subplots()
    if breakdown.empty:
        ax.text(0.5, 0.5, "every trial completed cleanly", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    labels = [f"{s}: {k}" for s, k in zip(breakdown["status"], breakdown["failure_kind"])]
    ax.barh(labels, breakdown["trials"], color=[STATUS_COLOURS.get(s, "#7f7f7f") for s in breakdown["status"]])
    ax.invert_yaxis()
    ax.set_xlabel("trials")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def nightly_figure(history: pd.DataFrame, metric: str):
    fig = _figure(7, 3.4)
    ax = fig.subplots()
    colours = ["#d62728" if r else "#1f77b4" for r in history["regression"]]
    ax.plot(history["night"], history["best"], color="#1f77b4", linewidth=1)
    ax.scatter(history["night"], history["best"], c=colours, zorder=3)
    ax.set_ylabel(f"best {metric}")
    ax.set_title("best capacity per nightly run (red: regression flagged)")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.grid(True, alpha=0.3)
    return fig


# One colour per start phase, in START_PHASE_LABELS' order (the rest of startup_s last, in grey).
START_COLOURS = ("#9467bd", "#8c564b", "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#c7c7c7")


def start_figure(starts: pd.DataFrame):
    """A stacked bar per trial of a :func:`start_table`: where its engine start's seconds went."""
    t = starts.tail(60)
    fig = _figure(11, 1.3 + 0.25 * len(t))
    ax = fig.subplots()
    left = np.zeros(len(t))
    for (column, label), colour in zip(START_PHASE_LABELS.items(), START_COLOURS):
        width = t[column].fillna(0.0).to_numpy(dtype=float)
        ax.barh(range(len(t)), width, left=left, color=colour, edgecolor="white", linewidth=0.3, label=label)
        left += width
    cached = t["compile_cached"].tolist()
    ax.set_yticks(range(len(t)), [f"{n}" + {True: " (cache)", False: " (compiled)"}.get(c, "")
                                  for n, c in zip(t["trial_number"], cached)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds of the engine's start (startup_s)")
    ax.set_ylabel("trial number")
    ax.legend(fontsize=7, ncol=4, loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def figure_png(fig, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
