"""Command line: ``orchestrator run|validate|pareto|show ...`` (thin: parse, call, print)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _err(msg: str) -> None:
    print(msg, file=sys.stderr)


def _load(path: str):
    from orchestrator.study import StudyFileError, load_study

    try:
        return load_study(path)
    except StudyFileError as e:
        for p in e.problems:
            _err(f"{e.source}: {p}")
        return None


# ------------------------------------------------------------------ commands
def cmd_validate(args) -> int:
    bad = 0
    for path in args.files:
        study = _load(path)
        if study is None:
            bad += 1
        else:
            print(f"{path}: OK ({study.name}: {len(study.space.params)} parameters, "
                  f"{study.budget.trials} trials, engine {study.engine.kind})")
    return EXIT_USAGE if bad else EXIT_OK


def cmd_run(args) -> int:
    study = _load(args.study)
    if study is None:
        return EXIT_USAGE
    updates = {}
    if args.output:
        updates["output"] = args.output
    if args.trials:
        updates["budget"] = study.budget.model_copy(update={"trials": args.trials})
    if updates:
        study = study.model_copy(update=updates)
    from orchestrator.results.definition import write_study_definition
    from orchestrator.search import run_study

    write_study_definition(study)
    run = run_study(study, address=args.address, serve_port=args.port, resume=not args.new_run,
                    quiet=args.quiet)
    print()
    print(f"run {run.run_id}: {run.trials_run} trial(s) in {run.elapsed_s:.0f} s"
          + (" (resumed)" if run.resumed else ""))
    _print_front(study, run.study_dir, run_id=run.run_id)
    print()
    print(f"trials:   {run.trials_dir}")
    print(f"requests: {run.requests_dir}")
    print(f"read them: python -c \"import pandas as pd; print(pd.read_parquet('{run.trials_dir}'))\"")
    return EXIT_OK


def _print_front(study, study_dir: str, run_id: Optional[str] = None) -> None:
    import pandas as pd

    from orchestrator.results import load_trials, pareto_front

    df = load_trials(study_dir)
    if run_id is not None and "run_id" in df:
        df = df[df["run_id"] == run_id]
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    print("trials: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    front = pareto_front(df, study.objectives, study.constraints)
    if front.empty:
        print(_explain_empty_front(study, df))
        return
    cols = ["trial_id"] + [n for n in study.space.params if n in front] + [o.metric for o in study.objectives]
    cols += [c.metric for c in study.constraints if c.metric not in cols]
    title = "Pareto front (" + ", ".join(f"{o.resolved_direction} {o.metric}" for o in study.objectives) + ")"
    if study.constraints:
        title += " under " + ", ".join(str(c) for c in study.constraints)
    print(title + ":")
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        print(front[cols].to_string(index=False, float_format=lambda v: f"{v:,.4g}"))


def _explain_empty_front(study, df) -> str:
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


def _study_from_dataset(path: str):
    from orchestrator.results.definition import read_study_definition

    study = read_study_definition(path)
    if study is None:
        _err(f"{path}: no study definition found (study.json); is this a study's result directory?")
    return study


def cmd_pareto(args) -> int:
    study = _study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    _print_front(study, args.path, run_id=args.run)
    return EXIT_OK


def cmd_show(args) -> int:
    import pandas as pd

    from orchestrator.results import load_trials

    study = _study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    df = load_trials(args.path)
    print(f"study {study.name} ({study.engine.kind} engine, {study.model.name} on {study.hardware.gpu})")
    if df.empty:
        print("no trials recorded")
        return EXIT_OK
    for run_id, g in df.groupby("run_id", sort=True):
        counts = g["status"].value_counts().to_dict()
        print(f"run {run_id}: {len(g)} trials (" + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
              + f"), {g['started_at'].min():%Y-%m-%d %H:%M} .. {g['finished_at'].max():%H:%M} UTC")
    bad = df[df["status"] != "completed"]
    if len(bad):
        print("not completed, by kind:")
        for kind, g in bad.groupby(bad["failure_kind"].fillna("?")):
            print(f"  {kind}: {len(g)}  e.g. {str(g['failure_message'].iloc[0])[:160]}")
    completed = df[df["status"] == "completed"]
    if len(completed):
        print("best completed trial per objective:")
        for o in study.objectives:
            col = completed[o.metric].dropna()
            if col.empty:
                continue
            idx = col.idxmax() if o.resolved_direction == "maximize" else col.idxmin()
            print(f"  {o.resolved_direction} {o.metric}: {col[idx]:,.4g} ({completed.loc[idx, 'trial_id']})")
    _print_front(study, args.path)
    return EXIT_OK


# ------------------------------------------------------------------ entry point
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orchestrator",
                                description="Find the best vLLM serving configuration with Ray Tune + Optuna.")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run (or resume) a study")
    r.add_argument("study", help="study YAML file")
    r.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    r.add_argument("--port", type=int, default=int(os.environ.get("ORCHESTRATOR_SERVE_PORT", 8000)),
                   help="Ray Serve HTTP port (default 8000)")
    r.add_argument("--output", help="override the study's output location")
    r.add_argument("--trials", type=int, help="override the study's trial budget")
    r.add_argument("--new-run", action="store_true", help="start a new run even if an unfinished one exists")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.set_defaults(func=cmd_run)

    v = sub.add_parser("validate", help="check study files; exit 2 on problems")
    v.add_argument("files", nargs="+")
    v.set_defaults(func=cmd_validate)

    pa = sub.add_parser("pareto", help="print the Pareto front of a study's results")
    pa.add_argument("path", help="the study's result directory (<output>/<study>)")
    pa.add_argument("--run", help="only this run id")
    pa.set_defaults(func=cmd_pareto)

    sh = sub.add_parser("show", help="summarise a study's results")
    sh.add_argument("path", help="the study's result directory (<output>/<study>)")
    sh.set_defaults(func=cmd_show)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        _err("interrupted; run the same command again to resume")
        return 130


if __name__ == "__main__":
    sys.exit(main())
