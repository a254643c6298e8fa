"""The study report: one self-contained HTML page plus its figures as PNG files.

``write_report(path)`` reads a study's results and writes ``index.html`` and the
PNGs into ``<study>/report/`` (or ``out``). The page inlines everything (CSS and
the images as ``data:`` URIs, no script, nothing fetched from the network), so it
can be mailed, attached to a CI run or opened from an object store.

Sections: the Pareto front (throughput per GPU against p99 TTFT and against TPOT;
SLO-missing, failed, infeasible and pruned trials drawn differently), latency
against load per configuration, parameter importance, the trial timeline, failures
by kind, the table of the front, the recommended deployment and, when nightly runs
exist, the latest nightly comparison.

Layers: pure functions turn DataFrames into tables (``point_categories``,
``failure_breakdown``, ``load_curves``...), figure functions turn tables into
matplotlib ``Figure`` objects (no pyplot, no global state), ``render_html`` turns
sections into text, and only ``write_report`` touches files.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional, Sequence, Union

import numpy as np
import pandas as pd

from orchestrator.harness import harness_bound_mask
from orchestrator.results.pareto import pareto_front
from orchestrator.study import Study

log = logging.getLogger(__name__)

REPORT_DIR = "report"

# How each kind of point is drawn: (label, marker, face colour, edge colour).
STYLES: dict[str, tuple[str, str, str, str]] = {
    "front": ("on the Pareto front", "*", "#d62728", "#7f0000"),
    "feasible": ("meets the SLOs", "o", "#1f77b4", "#1f77b4"),
    "slo_missed": ("misses an SLO", "o", "none", "#7f7f7f"),
    "failed": ("failed under load", "X", "#ff7f0e", "#ff7f0e"),
    "infeasible": ("could not start (infeasible)", "x", "#9467bd", "#9467bd"),
    "pruned": ("pruned before start", "v", "#8c564b", "#8c564b"),
    "error": ("orchestrator error", "s", "#e377c2", "#e377c2"),
}
STATUS_COLOURS = {"completed": "#2ca02c", "infeasible": "#9467bd", "failed": "#ff7f0e", "pruned": "#8c564b",
                  "error": "#e377c2"}


@dataclass(frozen=True)
class ReportOptions:
    """Knobs of the report (defaults suit a few hundred trials)."""

    max_curves: int = 6  # configurations drawn in the latency-load figure
    load_bins: int = 6  # in-flight-load bins per configuration, when a trial ran one load level
    dpi: int = 100
    run: Optional[str] = None  # only this run id (default: every run of the study)


@dataclass(frozen=True)
class ReportFiles:
    html: str
    images: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    """One part of the page: a title, an anchor id and HTML fragments (already escaped)."""

    id: str
    title: str
    body: list[str]


# ================================================================== analysis (pure)
def point_categories(trials: pd.DataFrame, study: Study) -> pd.Series:
    """The :data:`STYLES` key of every trial: front / feasible / slo_missed / failed / infeasible / pruned / error."""
    front = pareto_front(trials, study.objectives, study.constraints)
    cats = trials["status"].map({"completed": "slo_missed", "failed": "failed", "infeasible": "infeasible",
                                 "pruned": "pruned", "error": "error"}).fillna("error")
    feasible = (trials["status"] == "completed") & trials["feasible"].fillna(False).astype(bool)
    cats[feasible] = "feasible"
    cats[trials.index.isin(front.index)] = "front"
    return cats.rename("category")


def axes_metrics(study: Study) -> tuple[str, list[str]]:
    """The throughput (y) and the latencies (x) of the front figures.

    y: the study's first maximised objective (throughput per GPU in practice); x: the
    study's TTFT metric (else ``ttft_p99_ms``) and its TPOT metric (else ``tpot_p50_ms``),
    taken from objectives first, then constraints.
    """
    named = [o.metric for o in study.objectives] + [c.metric for c in study.constraints]
    maximised = [o.metric for o in study.objectives if o.resolved_direction == "maximize"]
    y = maximised[0] if maximised else "output_throughput_per_gpu"
    ttft = next((m for m in named if m.startswith("ttft_")), "ttft_p99_ms")
    tpot = next((m for m in named if m.startswith("tpot_")), "tpot_p50_ms")
    return y, [ttft, tpot]


def failure_breakdown(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that did not complete cleanly, by status and failure kind, with a count and an example message."""
    bad = trials[(trials["status"] != "completed") | trials["failure_kind"].notna()]
    if bad.empty:
        return pd.DataFrame(columns=["status", "failure_kind", "trials", "example"])
    rows = []
    for (status, kind), group in bad.groupby([bad["status"], bad["failure_kind"].fillna("-")], sort=True):
        message = next((m for m in group["failure_message"] if isinstance(m, str) and m), "")
        rows.append({"status": status, "failure_kind": kind, "trials": len(group),
                     "example": message.strip().splitlines()[0][:240] if message.strip() else ""})
    return pd.DataFrame(rows).sort_values("trials", ascending=False, kind="stable").reset_index(drop=True)


def _in_flight_at_send(sent: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each request, how many requests were in flight when it was sent (itself excluded)."""
    starts, ends = np.sort(sent), np.sort(end)
    return np.searchsorted(starts, sent, side="left") - np.searchsorted(ends, sent, side="right")


def load_curves(requests: pd.DataFrame, trials: pd.DataFrame, trial_ids: Sequence[str],
                bins: int = 6) -> pd.DataFrame:
    """Latency against load for each given trial, from the requests table.

    A trial measured at several load levels (the ``level`` column) gets one point per
    level: x = output tokens/s per GPU achieved at that level, ``source="level"``. A
    trial measured at one level gets ``bins`` points from inside its load window: the
    requests are binned by how many requests were in flight when each was sent (x),
    ``source="in_flight"``. y: TTFT p99 and TPOT p50 of the successful requests of the point.
    """
    cols = ["trial_id", "source", "x", "ttft_p99_ms", "tpot_p50_ms", "requests"]
    out: list[dict[str, Any]] = []
    if requests.empty:
        return pd.DataFrame(out, columns=cols)
    gpus = trials.set_index("trial_id")["gpus"] if "gpus" in trials else pd.Series(dtype=float)
    measured = requests[(~requests["warmup"]) & requests["trial_id"].isin(trial_ids)]
    for trial_id, reqs in measured.groupby("trial_id", sort=False):
        ok = reqs[reqs["success"] & reqs["sent_s"].notna() & reqs["end_s"].notna()]
        if len(ok) < 2:
            continue
        n_gpus = float(gpus.get(trial_id, 1) or 1)
        if reqs["level"].nunique() >= 2:
            for _, lv in ok.groupby("level", sort=True):
                span = lv["end_s"].max() - lv["sent_s"].min()
                if span <= 0:
                    continue
                out.append({"trial_id": trial_id, "source": "level",
                            "x": lv["output_tokens"].sum() / span / n_gpus,
                            "ttft_p99_ms": lv["ttft_ms"].quantile(0.99), "tpot_p50_ms": lv["tpot_ms"].median(),
                            "requests": len(lv)})
            continue
        load = _in_flight_at_send(ok["sent_s"].to_numpy(float), ok["end_s"].to_numpy(float))
        distinct = np.unique(load)
        if len(distinct) <= bins:  # few load values: one point each
            which = np.searchsorted(distinct, load)
        else:  # equal-count bins
            edges = np.unique(np.quantile(load, np.linspace(0, 1, bins + 1)))
            which = np.clip(np.searchsorted(edges, load, side="right") - 1, 0, max(len(edges) - 2, 0))
        for b in np.unique(which):
            sel = ok[which == b]
            out.append({"trial_id": trial_id, "source": "in_flight", "x": float(load[which == b].mean()),
                        "ttft_p99_ms": sel["ttft_ms"].quantile(0.99), "tpot_p50_ms": sel["tpot_ms"].median(),
                        "requests": len(sel)})
    return pd.DataFrame(out, columns=cols)


# The levels table (one row per trial and load level of a capacity search): load and latency columns.
LEVEL_X_COLUMNS = ("rate", "output_throughput_per_gpu")
LEVEL_Y_COLUMNS = ("ttft_p99_ms", "ttft_p90_ms", "ttft_p50_ms")


def level_curves(levels: pd.DataFrame, trial_ids: Optional[Sequence[str]] = None) -> Optional[pd.DataFrame]:
    """Latency per load level of each trial from a levels table, or None when it lacks the columns.

    Columns: ``trial_id``, the load columns of :data:`LEVEL_X_COLUMNS` present, ``latency``
    (the first of :data:`LEVEL_Y_COLUMNS` present, named in ``latency_metric``) and
    ``slo_met`` when recorded. Sorted by trial and load.
    """
    xs = [c for c in LEVEL_X_COLUMNS if c in levels.columns]
    y = next((c for c in LEVEL_Y_COLUMNS if c in levels.columns), None)
    if levels.empty or not xs or y is None or "trial_id" not in levels.columns:
        return None
    if trial_ids is not None:
        levels = levels[levels["trial_id"].isin(trial_ids)]
    keep = ["trial_id", *xs, y] + (["slo_met"] if "slo_met" in levels.columns else [])
    out = levels[keep].dropna(subset=[y]).sort_values(["trial_id", xs[0]], kind="stable")
    return out.rename(columns={y: "latency"}).assign(latency_metric=y).reset_index(drop=True)


def curve_trials(trials: pd.DataFrame, categories: pd.Series, study: Study, limit: int) -> list[str]:
    """Which configurations get a latency-load curve: the front first, then the best other completed ones."""
    y, _ = axes_metrics(study)
    order = {"front": 0, "feasible": 1, "slo_missed": 2}
    cand = trials[categories.isin(order.keys())].assign(_rank=categories.map(order))
    cand = cand.sort_values(["_rank", y], ascending=[True, False], kind="stable")
    return list(cand["trial_id"].head(limit))


def importances(trials: pd.DataFrame, study: Study) -> dict[str, Union[pd.Series, str]]:
    """Parameter importance per objective over completed trials, or why it could not be computed."""
    from orchestrator.results.query import param_importance

    out: dict[str, Union[pd.Series, str]] = {}
    for o in study.objectives:
        try:
            out[f"{o.resolved_direction} {o.metric}"] = param_importance(
                trials, o.metric, o.resolved_direction, space=study.space)
        except (ValueError, RuntimeError) as e:
            out[f"{o.resolved_direction} {o.metric}"] = str(e)
    return out


# ================================================================== figures (data -> Figure)
def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _maybe_log(ax, values: pd.Series, axis: str) -> None:
    """Log scale when the values span more than 20x, labelled 200, 500, 1,000... (no 10^x notation)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

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
        for cat in ("slo_missed", "failed", "feasible", "front"):
            sel = pts[categories.loc[pts.index] == cat]
            if sel.empty:
                continue
            label, marker, face, edge = STYLES[cat]
            ax.scatter(sel[x], sel[y], marker=marker, s=130 if cat == "front" else 45, facecolors=face,
                       edgecolors=edge, linewidths=1.2, label=f"{label} ({len(sel)})", zorder=3)
        # The front on these two axes: a staircase through the non-dominated points
        # (among the trials meeting the SLOs; among all measured ones when none does).
        constraints = study.constraints if feasible_any else []
        front2 = pareto_front(pts, [(y, "maximize"), (x, "minimize")], constraints) if len(pts) else pts
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
        _maybe_log(ax, pts[x] if x in pts else pd.Series(dtype=float), "x")
        ax.set_xlabel(f"{x} (lower is better)")
        ax.set_ylabel(f"{y} (higher is better)")
        ax.set_title(f"{y} vs {x}")
        ax.grid(True, alpha=0.3)
        if len(pts):
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no trial measured", ha="center", va="center", transform=ax.transAxes)
    strip = fig.add_subplot(grid[1, :])
    unmeasured = trials[~trials.index.isin(measured.index)]
    kinds = [k for k in ("failed", "infeasible", "pruned", "error") if (categories.loc[unmeasured.index] == k).any()]
    for row, cat in enumerate(kinds):
        sel = unmeasured[categories.loc[unmeasured.index] == cat]
        label, marker, face, edge = STYLES[cat]
        strip.scatter(sel["trial_number"], [row] * len(sel), marker=marker, s=50, c=edge,
                      label=f"{label} ({len(sel)})")
    strip.set_yticks(range(len(kinds)), [STYLES[k][0] for k in kinds], fontsize=8)
    strip.set_ylim(-0.7, max(len(kinds), 1) - 0.3)
    numbers = pd.to_numeric(trials["trial_number"], errors="coerce")
    strip.set_xlim(numbers.min() - 0.5, numbers.max() + 0.5)
    from matplotlib.ticker import MaxNLocator

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
    from matplotlib.patches import Patch

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


def figure_png(fig, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ================================================================== HTML (pure)
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1180px;
  padding:16px 24px;color:#222;background:#fff}
h1{font-size:1.5em;margin-bottom:0.2em}
h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:1.6em}
nav a{margin-right:12px;font-size:0.9em}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:0.8em;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f4f4f4} td.text,th.text{text-align:left}
pre{background:#f6f8fa;padding:10px;overflow-x:auto;font-size:0.82em;border:1px solid #e1e4e8}
.scroll{overflow-x:auto;max-width:100%}
.note{color:#555;font-size:0.9em} .bad{color:#b00020;font-weight:bold} .good{color:#1b7f3b;font-weight:bold}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def img_tag(png: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _cell(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        if np.isnan(v):
            return "-"
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    return str(v)


def table_html(df: pd.DataFrame, text_columns: Sequence[str] = (), header: bool = True) -> str:
    """A plain, escaped HTML table: numbers right-aligned, ``text_columns`` left; scrolls sideways if wide."""
    # Long snake_case headers may break after an underscore.
    head = "".join(f'<th class="{"text" if c in text_columns else ""}">{esc(c).replace("_", "_<wbr>")}</th>'
                   for c in df.columns)
    rows = []
    for _, r in df.iterrows():
        cells = "".join(f'<td class="{"text" if c in text_columns else ""}">{esc(_cell(r[c]))}</td>'
                        for c in df.columns)
        rows.append(f"<tr>{cells}</tr>")
    thead = f"<thead><tr>{head}</tr></thead>" if header else ""
    return f'<div class="scroll"><table>{thead}<tbody>{"".join(rows)}</tbody></table></div>'


def render_html(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    nav = " ".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    body = "\n".join(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>\n' + "\n".join(s.body) + "</section>"
                     for s in sections)
    # The empty data: icon keeps the browser from asking for /favicon.ico.
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>{esc(title)}</title><style>{CSS}</style></head>\n'
            f'<body><h1>{esc(title)}</h1><p class="note">{esc(subtitle)}</p><nav>{nav}</nav>\n{body}\n</body></html>\n')


# ================================================================== assembling sections
def _labels(trials: pd.DataFrame) -> dict[str, str]:
    """Legend labels: the trial number (the configuration table under the figure spells it out)."""
    return {r["trial_id"]: f"#{r['trial_number']}" for _, r in trials.iterrows()}


def config_table(trials: pd.DataFrame, study: Study, trial_ids: Sequence[str]) -> pd.DataFrame:
    """Trial number, id and searched parameters of the given trials, in that order."""
    names = [n for n in study.space.sampled_names() if n in trials.columns]
    rows = trials.set_index("trial_id").loc[list(trial_ids)].reset_index()
    return rows[["trial_number", "trial_id", *names]].rename(columns={"trial_number": "#"})


def front_of(trials: pd.DataFrame, study: Study) -> tuple[pd.DataFrame, bool]:
    """The study's Pareto front under its SLOs, or (when no trial met them) ignoring them; and which it is."""
    front = pareto_front(trials, study.objectives, study.constraints)
    if len(front) or not study.constraints:
        return front, True
    return pareto_front(trials, study.objectives), False


def front_table(trials: pd.DataFrame, study: Study) -> tuple[pd.DataFrame, bool]:
    """The rows of :func:`front_of` with the columns people compare: parameters, objectives, SLO metrics."""
    front, under_slos = front_of(trials, study)
    y, _ = axes_metrics(study)
    cols = ["trial_id"] + [n for n in study.space.sampled_names() if n in trials.columns]
    cols += [m for m in dict.fromkeys([o.metric for o in study.objectives] + [c.metric for c in study.constraints]
                                      + [y]) if m in trials.columns]
    if "harness_bound" in front.columns and front["harness_bound"].notna().any():
        cols.append("harness_bound")
    return front.sort_values(y, ascending=False)[cols], under_slos


HARNESS_COLUMNS = ("trial_id", "ttft_p50_ms", "engine_ttft_p50_ms", "output_throughput", "engine_output_throughput",
                   "harness_bound_reason")


def _harness_section(trials: pd.DataFrame) -> Optional[Section]:
    """Trials whose client-side numbers describe the serving path, not the engine (none: no section)."""
    flagged = trials[harness_bound_mask(trials)]
    if flagged.empty:
        return None
    completed = int((trials["status"] == "completed").sum())
    cols = [c for c in HARNESS_COLUMNS if c in flagged.columns]
    return Section("harness", "Harness-bound trials", [
        f'<p class="bad">{len(flagged)} of {completed} completed trial(s) are harness-bound: the client saw '
        'a slower engine than the engine itself reported, so their latency and throughput describe the serving '
        'path (proxy, HTTP, client), not the configuration.</p>',
        '<p class="note">Rule: client TTFT p50 above the engine\'s by more than 10 % and 20 ms, or client output '
        'throughput below 0.9x the engine\'s (docs/metrics.md).</p>',
        table_html(flagged.sort_values("trial_number")[cols], text_columns=["trial_id", "harness_bound_reason"])])


def _summary_section(trials: pd.DataFrame, study: Study, categories: pd.Series) -> Section:
    counts = trials["status"].value_counts().to_dict()
    objectives = ", ".join(f"{o.resolved_direction} {o.metric}" for o in study.objectives)
    slos = ", ".join(str(c) for c in study.constraints) or "none"
    n_front = int((categories == "front").sum())
    runs = sorted(trials["run_id"].unique()) if len(trials) else []
    facts = pd.DataFrame([
        ("engine", f"{study.engine.kind}" + (f" ({study.engine.mode})" if hasattr(study.engine, "mode") else "")),
        ("model", study.model.name), ("hardware", f"{study.hardware.gpu} x{study.hardware.total_gpus}"),
        ("objectives", objectives), ("SLOs", slos),
        ("trials", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"),
        ("runs", f"{len(runs)}" + (f" (latest {runs[-1]})" if runs else "")),
        ("Pareto front", f"{n_front} trial(s) meet every SLO and are not dominated"),
    ] + ([("harness-bound", f"{int(harness_bound_mask(trials).sum())} completed trial(s): the serving path, "
           "not the engine, limited the measurement")] if harness_bound_mask(trials).any() else []),
        columns=["fact", "value"])
    return Section("summary", "Summary", [table_html(facts, text_columns=["fact", "value"], header=False)])


def _recommendation_section(trials: pd.DataFrame, study: Study) -> Section:
    from orchestrator.recommend import RecommendError, recommend

    try:
        rec = recommend(trials, study)
    except RecommendError as e:
        return Section("recommendation", "Recommended deployment",
                       [f'<p class="note">No recommendation:</p><pre>{esc(e)}</pre>',
                        '<p class="note">Pick a trial yourself: '
                        '<code>orchestrator recommend PATH --trial ID</code>.</p>'])
    measured = ", ".join(f"{k} {v:,.4g}" for k, v in rec.metrics.items() if v is not None)
    return Section("recommendation", "Recommended deployment", [
        f"<p>Trial <code>{esc(rec.trial_id)}</code>: the best {esc(study.objectives[0].metric)} under "
        f"{esc(', '.join(str(c) for c in rec.slos) or 'no SLO')} ({esc(measured)}).</p>",
        "<p><code>vllm serve</code>:</p>", f"<pre>{esc(rec.vllm_command())}</pre>",
        "<p>Ray Serve LLM config (<code>serve run FILE</code>):</p>", f"<pre>{esc(rec.serve_config_yaml())}</pre>",
    ])


def _nightly_section(study_dir: str, fs) -> Optional[tuple[Section, Optional[bytes]]]:
    from orchestrator.nightly import load_summaries

    summaries = load_summaries(study_dir, filesystem=fs)
    if not summaries:
        return None
    latest = summaries[-1]
    verdict = (f'<p class="bad">Regression flagged on {esc(latest.night)} (run {esc(latest.run_id)}).</p>'
               if latest.regression else
               f'<p class="good">No regression on {esc(latest.night)} (run {esc(latest.run_id)}).</p>')
    body = [verdict, f'<p class="note">{esc(latest.headline())}</p>']
    if latest.reasons:
        body.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in latest.reasons) + "</ul>")
    changes = latest.changes_frame()
    if len(changes):
        body.append(table_html(changes, text_columns=["what", "metric", "verdict"]))
    png = None
    history = pd.DataFrame([{"night": f"{s.night} {s.run_id[-4:]}", "best": s.best_capacity,
                             "regression": s.regression} for s in summaries])
    if history["best"].notna().sum() >= 1:
        png = figure_png(nightly_figure(history, latest.capacity_metric))
        body.append(img_tag(png, "best capacity per night"))
    return Section("nightly", "Nightly regression check", body), png


def build_report(trials: pd.DataFrame, requests: pd.DataFrame, study: Study, *,
                 levels: Optional[pd.DataFrame] = None, options: ReportOptions = ReportOptions(),
                 extra_sections: Sequence[tuple[Section, Optional[bytes]]] = ()) -> tuple[str, dict[str, bytes]]:
    """The page and its PNGs (name -> bytes) for these tables: no file is read or written."""
    pngs: dict[str, bytes] = {}
    sections: list[Section] = []
    trials = trials.reset_index(drop=True)
    if trials.empty:
        sections.append(Section("summary", "Summary", ['<p class="note">No trials recorded.</p>']))
        return render_html(f"Study {study.name}", "no trials", sections), pngs
    categories = point_categories(trials, study)
    sections.append(_summary_section(trials, study, categories))
    for section, png in extra_sections:  # e.g. the nightly verdict: right under the summary
        sections.append(section)
        if png is not None:
            pngs[f"{section.id}.png"] = png

    pngs["pareto.png"] = figure_png(pareto_figure(trials, categories, study), options.dpi)
    front, under_slos = front_table(trials, study)
    front_body = [img_tag(pngs["pareto.png"], "Pareto front"),
                  '<p class="note">Stars: the Pareto front of the study\'s objectives among trials meeting every '
                  'SLO. Filled circles meet the SLOs but are dominated; hollow circles miss an SLO. Trials with '
                  'nothing to plot (could not start, pruned, failed) are in the strip below, by trial number.</p>']
    sections.append(Section("front", "Pareto front", front_body))
    if front.empty:
        table_body = ['<p class="note">No trial completed: there is no front.</p>']
    elif under_slos:
        table_body = [f'<p class="note">{len(front)} trial(s): each meets every SLO and no other trial that '
                      'does is better in every objective.</p>', table_html(front, text_columns=["trial_id"])]
    else:
        table_body = ['<p class="note bad">No completed trial met every SLO. Below is the front of the '
                      'completed trials ignoring the SLOs (diamonds in the figures): the closest candidates.</p>',
                      table_html(front, text_columns=["trial_id"])]
    sections.append(Section("front-table", "Front table", table_body))
    harness = _harness_section(trials)
    if harness is not None:
        sections.append(harness)

    sections.append(_recommendation_section(trials, study))

    chosen = curve_trials(trials, categories, study, options.max_curves)
    curves = load_curves(requests, trials, chosen, options.load_bins)
    pngs["latency_load.png"] = figure_png(curves_figure(curves, _labels(trials)), options.dpi)
    curve_body = [img_tag(pngs["latency_load.png"], "latency vs load"),
                  '<p class="note">' + ("One point per load level of each configuration." if (
                      curves["source"] == "level").any() else
                      "Each configuration ran one load level; its requests are binned by how many requests "
                      "were in flight when they were sent, showing how latency grows with load inside the run.")
                  + f" Configurations: the front first, then the best others (at most {options.max_curves}).</p>"]
    drawn = [t for t in chosen if t in set(curves["trial_id"])]
    if drawn:
        curve_body.append(table_html(config_table(trials, study, drawn), text_columns=["trial_id"]))
    if levels is not None:
        lv = level_curves(levels, chosen)
        if lv is not None and len(lv):
            pngs["levels.png"] = figure_png(level_figure(lv, _labels(trials)), options.dpi)
            curve_body += [img_tag(pngs["levels.png"], "latency vs load from the levels table"),
                           '<p class="note">From the levels table of a capacity search: one point per load '
                           'level; hollow markers missed an SLO at that level.</p>']
    sections.append(Section("curves", "Latency vs load", curve_body))

    pngs["importance.png"] = figure_png(importance_figure(importances(trials, study)), options.dpi)
    sections.append(Section("importance", "Parameter importance", [
        img_tag(pngs["importance.png"], "parameter importance"),
        '<p class="note">Optuna\'s PED-ANOVA over the completed trials: how much each parameter matters for '
        'reaching the best trials of each objective.</p>']))

    latest_run = trials.sort_values("started_at")["run_id"].iloc[-1]
    run_trials = trials[trials["run_id"] == latest_run]
    pngs["timeline.png"] = figure_png(timeline_figure(run_trials), options.dpi)
    sections.append(Section("timeline", "Trial timeline", [
        img_tag(pngs["timeline.png"], "trial timeline"),
        f'<p class="note">Run {esc(latest_run)}: {len(run_trials)} trial(s), at most 60 shown.</p>']))

    breakdown = failure_breakdown(trials)
    pngs["failures.png"] = figure_png(failures_figure(breakdown), options.dpi)
    fail_body = [img_tag(pngs["failures.png"], "failures by kind")]
    if len(breakdown):
        fail_body.append(table_html(breakdown, text_columns=["status", "failure_kind", "example"]))
    sections.append(Section("failures", "Failures by kind", fail_body))

    subtitle = (f"{study.model.name} on {study.hardware.gpu}; {len(trials)} trials; generated "
                f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    return render_html(f"Study {study.name}", subtitle, sections), pngs


# ================================================================== I/O edge
def _read_levels(fs, study_root: str) -> Optional[pd.DataFrame]:
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    path = f"{study_root}/levels"
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return None
    try:
        return ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive",
                          exclude_invalid_files=True).to_table().to_pandas()
    except Exception as e:  # noqa: BLE001 - another table's format is not ours to enforce
        log.warning("report: cannot read the levels table at %s: %s", path, e)
        return None


def write_report(path: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None, *,
                 options: ReportOptions = ReportOptions()) -> ReportFiles:
    """Read the study at ``path`` (``<output>/<study>``, local or URI), write the report, return its files.

    ``out``: the report directory (default ``<path>/report``), local or URI.
    """
    from orchestrator.results.definition import read_study_definition
    from orchestrator.results.query import load_requests, load_trials, resolve_location

    study = read_study_definition(os.fspath(path))
    if study is None:
        raise FileNotFoundError(f"{path}: no study definition (study.json); is this a study's result directory?")
    fs, root = resolve_location(path)
    trials = load_trials(path, run=options.run)
    try:
        requests = load_requests(path, trial_ids=list(trials["trial_id"]), run=options.run)
    except FileNotFoundError:
        requests = pd.DataFrame()
    extra = []
    nightly = _nightly_section(root, fs)
    if nightly is not None:
        extra.append(nightly)
    page, pngs = build_report(trials, requests, study, levels=_read_levels(fs, root), options=options,
                              extra_sections=extra)
    if out is None:
        out_fs, out_dir = fs, f"{root}/{REPORT_DIR}"
        shown = f"{os.fspath(path).rstrip('/')}/{REPORT_DIR}"
    else:
        out_fs, out_dir = resolve_location(out)
        shown = os.fspath(out)
    out_fs.create_dir(out_dir, recursive=True)
    files = {}
    for name, data in {**pngs, "index.html": page.encode()}.items():
        with out_fs.open_output_stream(f"{out_dir}/{name}") as f:
            f.write(data)
        files[name] = f"{shown}/{name}"
    index = files.pop("index.html")
    return ReportFiles(html=index, images=files)

