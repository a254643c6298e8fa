"""``orchestrator run`` and ``orchestrator validate``."""

from __future__ import annotations

from orchestrator.commands.common import (EXIT_FAILURE, EXIT_OK, EXIT_USAGE, add_run_arguments, err,
                                          load_study_or_report, load_study_with_overrides, positive_int, print_front)
from orchestrator.failures import TrialStatus
from orchestrator.results import load_trials
from orchestrator.results.definition import write_study_definition
from orchestrator.search.driver import StudyStopped, run_study
from orchestrator.search.stop_signals import StudyInterrupted, stop_on_signals


def cmd_validate(args) -> int:
    bad = 0
    for path in args.files:
        study = load_study_or_report(path)
        if study is None:
            bad += 1
        else:
            print(f"{path}: OK ({study.name}: {len(study.space.params)} parameters, "
                  f"{study.budget.trials} trials, engine {study.engine.kind})")
    return EXIT_USAGE if bad else EXIT_OK


def cmd_run(args) -> int:
    study = load_study_with_overrides(args)
    if study is None:
        return EXIT_USAGE

    write_study_definition(study)
    with stop_on_signals():  # SIGTERM / SIGINT: stop gracefully, a second one at once; no engine left behind
        try:
            run = run_study(study, address=args.address, serve_port=args.port, resume=not args.new_run,
                            quiet=args.quiet, max_trials=args.max_trials)
        except StudyStopped as e:  # a clear reason (infeasible space, full disk, run in use): no traceback
            err(str(e))
            return e.exit_code
        except StudyInterrupted as e:
            err(e.line(study.name))
            return e.exit_code
    print()
    print(f"run {run.run_id}: {run.trials_run} trial(s) in {run.elapsed_s:.0f} s"
          + (" (resumed)" if run.resumed else ""))
    print_front(study, run.study_dir, run_id=run.run_id)
    print()
    print(f"trials:   {run.trials_dir}")
    print(f"requests: {run.requests_dir}")
    print(f"read them: python -c \"import pandas as pd; print(pd.read_parquet('{run.trials_dir}'))\"")
    return _exit_code(run, study)


def _exit_code(run, study=None) -> int:
    """Non-zero when this run set out to run trials and measured none (none ran, or none completed): a
    study that measured nothing has failed, whatever the reason (``ray job submit`` and cron see it)."""
    if run.trials_run == 0:
        if not run.planned:
            return EXIT_OK  # the budget was spent before: nothing to do
        wall = study.budget.wall_time_s if study is not None else None
        why = (f"budget.wall_time_s ({wall:g} s) ended the run before a trial started" if wall is not None else
               "no trial started: every configuration proposed was pruned before it started, or the search "
               "ended first (see the lines above)")
        err(f"run {run.run_id}: no trial recorded: {why}")
        return EXIT_FAILURE
    rows = load_trials(run.study_dir)
    rows = rows[rows["run_id"] == run.run_id] if len(rows) else rows
    if len(rows) and not (rows["status"] == TrialStatus.COMPLETED).any():
        err(f"run {run.run_id}: no trial completed; see the reasons above (trials: {run.trials_dir})")
        return EXIT_FAILURE
    return EXIT_OK



def register(sub) -> None:
    r = sub.add_parser("run", help="run (or resume) a study")
    r.add_argument("study", help="study YAML file")
    add_run_arguments(r)
    r.add_argument("--new-run", action="store_true", help="start a new run even if an unfinished one exists")
    r.add_argument("--max-trials", type=positive_int,
                   help="stop after this many trials in this invocation; the same command resumes the run")
    r.set_defaults(func=cmd_run)

    v = sub.add_parser("validate", help="check study files; exit 2 on problems")
    v.add_argument("files", nargs="+")
    v.set_defaults(func=cmd_validate)
