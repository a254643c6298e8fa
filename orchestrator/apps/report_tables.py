"""The report's tables: pure functions from the trials, requests and levels tables to what is shown.

Which category each trial is drawn in, the axes of the front figures, latency against
load per configuration, failures by kind, parameter importance and the front table.
Nothing here draws or writes; :mod:`orchestrator.apps.figures` draws these tables
and :mod:`orchestrator.apps.report` puts them on the page.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import pandas as pd

from orchestrator.failures import TrialStatus
from orchestrator.hardware.pricing import unit_columns
from orchestrator.measure.metrics import PROBE_METRIC_NAMES
from orchestrator.results.analysis import param_importance
from orchestrator.results.pareto import pareto_front
from orchestrator.results.decisions import front_note
from orchestrator.results.paired import compare
from orchestrator.results.ties import front_with_ties, shown_with_intervals
from orchestrator.study.spec import Study


def point_categories(trials: pd.DataFrame, study: Study) -> pd.Series:
    """The category every trial is drawn in (a key of :data:`orchestrator.apps.figures.STYLES`).

    front / feasible / slo_missed / degraded / failed / infeasible / pruned / error.
    """
    front = pareto_front(trials, study.objectives, study.constraints)
    # a status is its own category, but a completed trial is drawn by whether it met the SLOs
    cats = trials["status"].map({s.value: s.value for s in TrialStatus}
                                | {TrialStatus.COMPLETED.value: "slo_missed"}).fillna(TrialStatus.ERROR.value)
    feasible = (trials["status"] == TrialStatus.COMPLETED) & trials["feasible"].fillna(False).astype(bool)
    cats[feasible] = "feasible"
    cats[trials.index.isin(front.index)] = "front"
    return cats.rename("category")


def axes_metrics(study: Study) -> tuple[str, list[str]]:
    """The throughput (y) and the latencies (x) of the front figures.

    y: the study's first maximised objective (throughput per GPU in practice); x: the
    study's TTFT metric (else ``ttft_p99_ms``) and its TPOT metric (else ``tpot_p50_ms``),
    taken from objectives first, then constraints; and the probe's agreement metric where the
    study names one (quality against speed: the trade-off quantization makes).
    """
    named = [o.metric for o in study.objectives] + [c.metric for c in study.constraints]
    maximised = [o.metric for o in study.objectives if o.resolved_direction == "maximize"]
    y = maximised[0] if maximised else "output_throughput_per_gpu"
    ttft = next((m for m in named if m.startswith("ttft_")), "ttft_p99_ms")
    tpot = next((m for m in named if m.startswith("tpot_")), "tpot_p50_ms")
    agreement = [m for m in dict.fromkeys(named) if m in PROBE_METRIC_NAMES and m != "probe_s" and m != y][:1]
    return y, [ttft, tpot] + agreement


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
    out: dict[str, Union[pd.Series, str]] = {}
    for o in study.objectives:
        try:
            out[f"{o.resolved_direction} {o.metric}"] = param_importance(
                trials, o.metric, o.resolved_direction, space=study.space)
        except (ValueError, RuntimeError) as e:
            out[f"{o.resolved_direction} {o.metric}"] = str(e)
    return out


def config_table(trials: pd.DataFrame, study: Study, trial_ids: Sequence[str]) -> pd.DataFrame:
    """Trial number, id and searched parameters of the given trials, in that order."""
    names = [n for n in study.space.sampled_names() if n in trials.columns]
    rows = trials.set_index("trial_id").loc[list(trial_ids)].reset_index()
    return rows[["trial_number", "trial_id", *names]].rename(columns={"trial_number": "#"})


def front_of(trials: pd.DataFrame, study: Study) -> tuple[pd.DataFrame, bool]:
    """The study's Pareto front under its SLOs, or (when no trial met them) ignoring them; and which it is.
    Decided comparisons (:func:`orchestrator.results.ties.front_with_ties`): rows only an undecided
    comparison keeps off the point values' front are on it, marked (``strict_front`` False, ``tied_with``)."""
    kw = {"margin": study.analysis.equivalence_margin, "confidence": study.comparison_confidence}
    front = front_with_ties(trials, study.objectives, study.constraints, **kw)
    if len(front) or not study.constraints:
        return front, True
    return front_with_ties(trials, study.objectives, **kw), False


def leaders_table(trials: pd.DataFrame, study: Study, leaders: Sequence[str], top: int = 5) -> pd.DataFrame:
    """The leaders (front trial ids, best first) against the baseline (the first trial: vLLM's defaults or
    the study's first initial point), one paired comparison per objective: ``+x% [low, high] (verdict)``."""
    done = trials[trials["status"] == "completed"] if "status" in trials else trials
    if done.empty:
        return pd.DataFrame()
    base = done.sort_values("trial_number").iloc[0]
    rows = []
    for tid in [t for t in leaders if t != base["trial_id"]][:top]:
        row = done[done["trial_id"] == tid].iloc[-1]
        out = {"trial_id": tid, "against": base["trial_id"]}
        for o in study.objectives:
            c = compare(row.to_dict(), base.to_dict(), o.metric, o.resolved_direction,
                        margin=study.analysis.equivalence_margin, confidence=study.comparison_confidence)
            out[o.metric] = "-" if c is None else f"{c.describe()} ({c.verdict})"
        rows.append(out)
    return pd.DataFrame(rows)


def front_table(trials: pd.DataFrame, study: Study) -> tuple[pd.DataFrame, bool]:
    """The rows of :func:`front_of` with the columns people compare: parameters, objectives, SLO metrics,
    and the per-GPU and cost metrics (:func:`orchestrator.hardware.pricing.unit_columns`)."""
    front, under_slos = front_of(trials, study)
    y, _ = axes_metrics(study)
    cols = ["trial_id"] + [n for n in study.space.sampled_names() if n in trials.columns]
    cols += [m for m in dict.fromkeys([o.metric for o in study.objectives] + [c.metric for c in study.constraints]
                                      + [y] + unit_columns(front)) if m in trials.columns]
    if "harness_bound" in front.columns and front["harness_bound"].notna().any():
        cols.append("harness_bound")
    objectives = [o.metric for o in study.objectives]
    shown = shown_with_intervals(front, objectives)
    shown["noise"] = [front_note(strict, tied, equivalent) for strict, tied, equivalent
                      in zip(front["strict_front"], front["tied_with"], front["equivalent_with"])]
    order = front[y].to_numpy(dtype=float).argsort(kind="stable")[::-1] if y in front else slice(None)
    return shown.iloc[order][cols + ["noise"]], under_slos


# How each start phase is named where it is shown (orchestrator.engines.vllm.start_log), and the rest of a
# trial's ``startup_s``: Serve placing the replica, the replica's own start, the routes answering.
START_PHASE_LABELS: dict[str, str] = {
    "start_import_s": "process and imports", "start_load_s": "weights", "start_compile_s": "torch.compile",
    "start_graphs_s": "CUDA graphs", "start_profile_s": "profile, KV cache, warm-up",
    "start_ready_s": "server up", "start_other_s": "Serve and the rest"}


def start_table(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per trial whose engine start was read from the engine's log (real vLLM), in the order the
    trials started: its number and id, each phase's seconds (NaN: did not happen or not read),
    ``start_other_s`` (what ``startup_s`` holds beyond the phases), ``startup_s`` and
    ``compile_cached``. Empty for studies without such trials (the simulator, older results)."""
    phases = [c for c in START_PHASE_LABELS if c != "start_other_s"]
    present = [c for c in phases if c in trials.columns]
    if not present or "startup_s" not in trials.columns:
        return pd.DataFrame(columns=["trial_number", "trial_id", *START_PHASE_LABELS, "startup_s", "compile_cached"])
    read = trials[trials[present].notna().any(axis=1)]
    read = read.sort_values(["started_at", "trial_number"] if "started_at" in read else ["trial_number"])
    out = read[["trial_number", "trial_id"]].copy()
    for c in phases:
        out[c] = pd.to_numeric(read[c], errors="coerce") if c in read else np.nan
    out["start_other_s"] = (pd.to_numeric(read["startup_s"], errors="coerce")
                            - out[phases].fillna(0.0).sum(axis=1)).clip(lower=0.0)
    out["startup_s"] = read["startup_s"]
    cached = read["start_compile_cached"] if "start_compile_cached" in read else pd.Series(None, index=read.index)
    out["compile_cached"] = cached.map(lambda v: None if pd.isna(v) else bool(v)).astype(object)
    return out.reset_index(drop=True)
