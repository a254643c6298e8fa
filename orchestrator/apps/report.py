"""The study report: one self-contained HTML page plus its figures as PNG files.

``write_report(path)`` reads a study's results and writes ``index.html`` and the
PNGs into ``<study>/report/`` (or ``out``). The page inlines everything (CSS and
the images as ``data:`` URIs, no script, nothing fetched from the network), so it
can be mailed, attached to a CI run or opened from an object store.

Sections: the Pareto front (throughput per GPU against p99 TTFT and against TPOT;
SLO-missing, failed, infeasible and pruned trials drawn differently), latency
against load per configuration, parameter importance, the trial timeline, where each
real engine's start went (a stacked bar per trial), failures by kind, the table of the front, the recommended deployment and, when nightly runs
exist, the latest nightly comparison.

Layers: pure functions turn DataFrames into tables (:mod:`.report_tables`), figure
functions turn tables into matplotlib ``Figure`` objects (:mod:`.figures`), this
module turns sections into HTML, and only ``write_report`` touches files. The
tables and figures stay importable from here.
"""

from __future__ import annotations

import base64
import html
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional, Sequence, Union

import numpy as np
import pandas as pd
import pyarrow as pa

from orchestrator.apps.figures import (STATUS_COLOURS, STYLES, curves_figure, failures_figure, figure_png,
                                       importance_figure, level_figure, nightly_figure, pareto_figure, start_figure,
                                       timeline_figure)
from orchestrator.apps.nightly import load_summaries
from orchestrator.apps.recommend import RecommendError, distance_from_defaults, recommend
from orchestrator.apps.report_tables import (LEVEL_X_COLUMNS, LEVEL_Y_COLUMNS, axes_metrics, config_table, curve_trials,
                                             front_of, front_table, importances, leaders_table, level_curves,
                                             load_curves, point_categories, start_table)
from orchestrator.failures import TrialStatus
from orchestrator.measure.harness import harness_bound_mask
from orchestrator.results.decisions import decide_front
from orchestrator.results.definition import read_study_definition
from orchestrator.results.levels import load_levels
from orchestrator.results.outcomes import failure_breakdown
from orchestrator.results.query import cannot_write, load_requests, load_trials, resolve_location
from orchestrator.study.spec import Study

__all__ = [
    "CSS", "HARNESS_COLUMNS", "LEVEL_X_COLUMNS", "LEVEL_Y_COLUMNS", "REPORT_DIR", "STATUS_COLOURS", "STYLES",
    "ReportFiles", "ReportOptions", "Section", "axes_metrics", "build_report", "config_table", "curve_trials",
    "curves_figure", "esc", "failure_breakdown", "failures_figure", "figure_png", "front_of", "front_table",
    "img_tag", "importance_figure", "importances", "level_curves", "level_figure", "load_curves", "nightly_figure",
    "pareto_figure", "point_categories", "render_html", "table_html", "timeline_figure", "write_report",
]

log = logging.getLogger(__name__)

REPORT_DIR = "report"


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


HARNESS_COLUMNS = ("trial_id", "ttft_p50_ms", "engine_ttft_p50_ms", "output_throughput", "engine_output_throughput",
                   "harness_bound_reason")


def _harness_section(trials: pd.DataFrame) -> Optional[Section]:
    """Trials whose client-side numbers describe the serving path, not the engine (none: no section)."""
    flagged = trials[harness_bound_mask(trials)]
    if flagged.empty:
        return None
    completed = int((trials["status"] == TrialStatus.COMPLETED).sum())
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
        ("cost", study.price.describe()),
        ("objectives", objectives), ("SLOs", slos),
        ("trials", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"),
        ("runs", f"{len(runs)}" + (f" (latest {runs[-1]})" if runs else "")),
        ("Pareto front", f"{n_front} trial(s) meet every SLO and are not dominated"),
    ] + ([("harness-bound", f"{int(harness_bound_mask(trials).sum())} completed trial(s): the serving path, "
           "not the engine, limited the measurement")] if harness_bound_mask(trials).any() else []),
        columns=["fact", "value"])
    return Section("summary", "Summary", [table_html(facts, text_columns=["fact", "value"], header=False)])


def _recommendation_section(trials: pd.DataFrame, study: Study) -> Section:
    try:
        rec = recommend(trials, study)
    except RecommendError as e:
        return Section("recommendation", "Recommended deployment",
                       [f'<p class="note">No recommendation:</p><pre>{esc(e)}</pre>',
                        '<p class="note">Pick a trial yourself: '
                        '<code>orchestrator recommend PATH --trial ID</code>.</p>'])
    choice = f'<p class="note">{esc(rec.choice)}.</p>' if rec.choice else ""
    return Section("recommendation", "Recommended deployment", [
        f"<p>Trial <code>{esc(rec.trial_id)}</code>: the best {esc(study.objectives[0].metric)} under "
        f"{esc(', '.join(str(c) for c in rec.slos) or 'no SLO')} ({esc(rec.measured_text())}).</p>" + choice,
        "<p><code>vllm serve</code>:</p>", f"<pre>{esc(rec.vllm_command())}</pre>",
        "<p>Ray Serve LLM config (<code>serve run FILE</code>):</p>", f"<pre>{esc(rec.serve_config_yaml())}</pre>",
    ])


def _nightly_section(study_dir: str, fs) -> Optional[tuple[Section, Optional[bytes]]]:
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
    front_leaders = None
    if front.empty:
        table_body = ['<p class="note">No trial completed: there is no front.</p>']
    elif under_slos:
        tied = int((front["noise"] != "").sum())
        noise = (f' {tied} of them are equivalent to another, or not yet told apart from one (column '
                 '<i>noise</i>). Intervals are [low, high] at the confidence the trials were measured with; '
                 'trials are compared by their paired differences (the same requests).') if tied else ""
        decision = decide_front(trials, study.objectives, study.constraints,
                                margin=study.analysis.equivalence_margin, confidence=study.comparison_confidence,
                                distance=distance_from_defaults)
        table_body = [f'<p class="note">{len(front)} configuration(s): each meets every SLO and no other '
                      f'configuration that does is better by a decided comparison.{noise}</p>',
                      table_html(front, text_columns=["trial_id", "noise"] + [o.metric for o in study.objectives]),
                      '<p class="note">' + "<br>".join(html.escape(line) for line in decision.lines()) + '</p>']
        front_leaders = leaders_table(trials, study, list(decision.front["trial_id"]))
    else:
        table_body = ['<p class="note bad">No completed trial met every SLO. Below is the front of the '
                      'completed trials ignoring the SLOs (diamonds in the figures): the closest candidates.</p>',
                      table_html(front, text_columns=["trial_id", "noise"] + [o.metric for o in study.objectives])]
    sections.append(Section("front-table", "Front table", table_body))
    if front_leaders is not None and len(front_leaders):
        sections.append(Section("leaders", "Leaders against the baseline", [
            '<p class="note">The leaders against the first trial (the baseline: vLLM\'s defaults or the study\'s '
            'first initial point), each objective\'s paired difference [90% interval] and its verdict.</p>',
            table_html(front_leaders, text_columns=list(front_leaders.columns))]))
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

    starts = start_table(trials)
    if len(starts):
        pngs["starts.png"] = figure_png(start_figure(starts), options.dpi)
        sections.append(Section("starts", "Engine starts", [
            img_tag(pngs["starts.png"], "engine start phases per trial"),
            '<p class="note">Where each trial\'s engine start went, read from vLLM\'s own log: process and '
            'imports, weights, torch.compile (compiled, or loaded from the study\'s compile cache), CUDA graphs, '
            'profiling with the KV cache and warm-up, the server answering; the rest of <i>startup_s</i> is '
            'Serve placing the replica and the routes answering. At most 60 trials shown.</p>',
            table_html(starts.tail(60), text_columns=["trial_id", "compile_cached"])]))

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
    """The levels table (a damaged file skipped with a warning, as the trials are), or None without one."""
    levels = load_levels(study_root, filesystem=fs)
    return levels if len(levels) else None


def write_report(path: Union[str, os.PathLike], out: Optional[Union[str, os.PathLike]] = None, *,
                 options: ReportOptions = ReportOptions()) -> ReportFiles:
    """Read the study at ``path`` (``<output>/<study>``, local or URI), write the report, return its files.

    ``out``: the report directory (default ``<path>/report``), local or URI.
    """
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
    files = {}
    try:
        out_fs.create_dir(out_dir, recursive=True)
        for name, data in {**pngs, "index.html": page.encode()}.items():
            with out_fs.open_output_stream(f"{out_dir}/{name}") as f:
                f.write(data)
            files[name] = f"{shown}/{name}"
    except (OSError, pa.ArrowException) as e:  # a read-only study folder, a file in the way
        raise cannot_write(shown, e, "--out DIR") from None
    index = files.pop("index.html")
    return ReportFiles(html=index, images=files)

