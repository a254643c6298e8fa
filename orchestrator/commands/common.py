"""Helpers shared by the commands: exit codes, study loading, printing a front."""

from __future__ import annotations

import sys
from typing import Optional

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def err(msg: str) -> None:
    print(msg, file=sys.stderr)


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (``--trials 0`` is a usage error, not "the full budget")."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def load_study_or_report(path: str):
    """The study, or None after printing one line per problem to stderr."""
    from orchestrator.study import StudyFileError, load_study

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
    if args.output:
        updates["output"] = args.output
    if args.trials is not None:
        updates["budget"] = study.budget.model_copy(update={"trials": args.trials})
    return study.model_copy(update=updates) if updates else study


def print_front(study, study_dir: str, run_id: Optional[str] = None) -> None:
    import pandas as pd

    from orchestrator.results import load_trials, pareto_front

    df = load_trials(study_dir)
    if run_id is not None and "run_id" in df:
        df = df[df["run_id"] == run_id]
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    print("trials: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    front = pareto_front(df, study.objectives, study.constraints)
    if front.empty:
        print(explain_empty_front(study, df))
        return
    cols = ["trial_id"] + [n for n in study.space.params if n in front] + [o.metric for o in study.objectives]
    cols += [c.metric for c in study.constraints if c.metric not in cols]
    title = "Pareto front (" + ", ".join(f"{o.resolved_direction} {o.metric}" for o in study.objectives) + ")"
    if study.constraints:
        title += " under " + ", ".join(str(c) for c in study.constraints)
    print(title + ":")
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(front[cols].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))


def explain_empty_front(study, df) -> str:
    if df.empty:
        return "no trials recorded"
    completed = df[df["status"] == "completed"]
    if completed.empty:
        kinds = df["failure_kind"].fillna("?").value_counts().to_dict()
        sample = df["failure_message"].dropna().head(1).tolist()
        return ("no configuration could run: " + ", ".join(f"{v} {k}" for k, v in kinds.items())
                + (f"\n  e.g. {sample[0][:300]}" if sample else ""))
    lines = ["no completed trial met every SLO:"]
    for c in study.constraints:
        vals = completed[c.metric].dropna()
        if len(vals):
            best = vals.min() if c.op in ("<=", "<") else vals.max()
            lines.append(f"  {c}: best seen {best:,.4g}")
    return "\n".join(lines)




def study_from_dataset(path: str):
    """The study definition stored with a result directory, or None after an error line."""
    from orchestrator.results.definition import read_study_definition

    study = read_study_definition(path)
    if study is None:
        err(f"{path}: no study definition found (study.json); is this a study's result directory?")
    return study
