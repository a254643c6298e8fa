"""Helpers shared by the commands: exit codes, study loading, printing a front."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import numpy as np
import pandas as pd

from orchestrator.apps.recommend import distance_from_defaults
from orchestrator.hardware.pricing import unit_columns
from orchestrator.results import load_trials
from orchestrator.results.decisions import decide_front, front_note
from orchestrator.results.definition import read_study_definition
from orchestrator.results.outcomes import status_counts, why_no_trial_qualifies
from orchestrator.results.ties import shown_with_intervals
from orchestrator.study.load import load_study
from orchestrator.study.spec import StudyFileError
from orchestrator.study.state_dir import output_problem

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def err(msg: str) -> None:
    print(msg, file=sys.stderr)


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (``--trials 0`` is a usage error, not "the full budget")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_run_arguments(parser) -> None:
    """The options ``run`` and ``nightly`` share: where Ray and Serve are, and study-file overrides
    (read by :func:`load_study_with_overrides`)."""
    parser.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("ORCHESTRATOR_SERVE_PORT", 8000)),
                        help="Ray Serve HTTP port (default 8000)")
    parser.add_argument("--output", "--out", dest="output", help="override the study's output location")
    parser.add_argument("--trials", type=positive_int, help="override the study's trial budget")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def load_study_or_report(path: str):
    """The study, or None after printing one line per problem to stderr."""
    try:
        return load_study(path)
    except StudyFileError as e:
        for p in e.problems:
            err(f"{e.source}: {p}")
        return None


def load_study_with_overrides(args):
    """The study file of ``args.study`` with the command line's ``--output`` and ``--trials``
    applied, or None after reporting its problems."""
    study = load_study_or_report(args.study)
    if study is None:
        return None
    updates = {}
    if args.output is not None:
        why = output_problem(args.output, study.name)
        if why:
            err(f"--output: {why}")
            return None
        updates["output"] = args.output
    if args.trials is not None:
        updates["budget"] = study.budget.model_copy(update={"trials": args.trials})
    return study.model_copy(update=updates) if updates else study


def print_front(study, study_dir: str, run_id: Optional[str] = None) -> None:
    df = load_trials(study_dir)
    if run_id is not None and "run_id" in df:
        df = df[df["run_id"] == run_id]
    print("trials: " + status_counts(df))
    for line in floor_lines(study, df):
        print(line)
    decision = decide_front(df, study.objectives, study.constraints, margin=study.analysis.equivalence_margin,
                            confidence=study.comparison_confidence, distance=distance_from_defaults)
    front = decision.front
    if front.empty:
        print(why_no_trial_qualifies(df, study.constraints, [o.metric for o in study.objectives]))
        return
    objectives = [o.metric for o in study.objectives]
    cols = ["trial_id"] + [n for n in study.space.params if n in front] + objectives
    cols += [c.metric for c in study.constraints if c.metric not in cols]
    cols += [m for m in unit_columns(front) if m not in cols]
    title = "Pareto front (" + ", ".join(f"{o.resolved_direction} {o.metric}" for o in study.objectives) + ")"
    if study.constraints:
        title += " under " + ", ".join(str(c) for c in study.constraints)
    print(title + ", intervals [low, high] where measured:")
    shown = shown_with_intervals(front, objectives)
    shown["decided"] = [front_note(strict, tied, equivalent)
                        for strict, tied, equivalent in zip(front["strict_front"], front["tied_with"],
                                                            front["equivalent_with"])]
    with pd.option_context("display.width", 250, "display.max_columns", 50, "display.max_colwidth", 80):
        print(shown[cols + ["decided"]].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))
    for line in decision.lines():
        print(line)
    print(gpu_time_line(df, decision))


def gpu_time_line(df, decision) -> str:
    """GPU-seconds the trials spent (wall time x GPUs) and what they bought: the front's comparisons
    decided and the ties left."""
    wall = pd.to_numeric(df.get("wall_time_s"), errors="coerce") if "wall_time_s" in df else pd.Series(dtype=float)
    gpus = pd.to_numeric(df.get("gpus"), errors="coerce").fillna(1) if "gpus" in df else 1
    spent = float(np.nansum(wall * gpus)) if len(wall) else 0.0
    n = len(decision.front)
    pairs = n * (n - 1) // 2
    return (f"GPU time: {spent:,.0f} GPU-s over {len(df)} trials; front comparisons decided: "
            f"{pairs - len(decision.ties)} of {pairs}, ties left: {len(decision.ties)}")


def floor_lines(study, df) -> list[str]:
    """The probe's noise floor as the rows record it (the baseline against itself at another batch
    composition), and each agreement constraint the floor itself would fail: numerics alone, not
    the setting, would make such a configuration infeasible."""
    if study.probe is None or "floor_token_agreement" not in df:
        return []
    floor = pd.to_numeric(df["floor_token_agreement"], errors="coerce").dropna()
    if floor.empty:
        return []
    agreement = float(floor.iloc[0])
    drift = pd.to_numeric(df.get("floor_logprob_diff_mean"), errors="coerce").dropna()
    lines = [f"probe noise floor (the baseline against itself at another batch composition): token_agreement "
             f"{agreement:.3f}" + (f", mean logprob drift {float(drift.iloc[0]):.2g}" if len(drift) else "")]
    for c in study.constraints:
        if c.metric in ("token_agreement", "prefix_agreement") and not c.met(agreement):
            lines.append(f"  {c} asks for more agreement than the baseline has with itself ({agreement:.3f}): "
                         "numerics alone can fail it; set it below the floor")
    return lines


def study_from_dataset(path: str):
    """The study definition stored with a result directory, or None after an error line."""
    study = read_study_definition(path)
    if study is None:
        err(f"{path}: no study definition found (study.json); is this a study's result directory?")
    return study
