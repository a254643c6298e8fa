"""``orchestrator pareto`` and ``orchestrator show``: read a study's results."""

from __future__ import annotations

from orchestrator.apps.report_tables import START_PHASE_LABELS, start_table
from orchestrator.commands.common import EXIT_OK, EXIT_USAGE, print_front, study_from_dataset
from orchestrator.failures import TrialStatus
from orchestrator.hardware.pricing import unit_columns
from orchestrator.measure.harness import harness_bound_mask
from orchestrator.measure.metrics import default_direction
from orchestrator.results import load_trials
from orchestrator.results.outcomes import failure_lines, status_counts
from orchestrator.results.predictions import describe_check, describe_share, prediction_checks, prediction_share
from orchestrator.results.ties import shown_with_intervals, tie_mask, tie_note
from orchestrator.study.judge import feasible_mask


def cmd_pareto(args) -> int:
    study = study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    print_front(study, args.path, run_id=args.run)
    return EXIT_OK


def cmd_show(args) -> int:
    study = study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    df = load_trials(args.path)
    print(f"study {study.name} ({study.engine.kind} engine, {study.model.name} on {study.hardware.gpu})")
    print(study.price.describe())
    if df.empty:
        print("no trials recorded")
        return EXIT_OK
    for run_id, g in df.groupby(df["run_id"].fillna("?"), sort=True):
        print(f"run {run_id}: {len(g)} trials ({status_counts(g)}), {_when(g['started_at'].min(), '%Y-%m-%d %H:%M')}"
              f" .. {_when(g['finished_at'].max(), '%H:%M')} UTC")
    failures = failure_lines(df)
    if failures:
        print("failures, by status and kind:")
        for line in failures:
            print("  " + line)
    completed = df[df["status"] == TrialStatus.COMPLETED]
    bound = harness_bound_mask(completed)
    if len(completed):
        print("best completed trial per objective:")
        _print_best(completed, [(o.metric, o.resolved_direction) for o in study.objectives], bound)
        _print_unit_best(completed, study)
    if bound.any():
        flagged = completed[bound]
        print(f"harness-bound: {len(flagged)} of {len(completed)} completed trials measured the serving path "
              "or the client, not the engine (client vs engine numbers, see docs/metrics.md):")
        for _, r in flagged.head(5).iterrows():
            print(f"  {r['trial_id']}: {r.get('harness_bound_reason') or '?'}")
        if len(flagged) > 5:
            print(f"  ... and {len(flagged) - 5} more")
    if study.search.fidelity == "sim":
        _print_predictions(df)
    _print_starts(start_table(df))
    print_front(study, args.path)
    return EXIT_OK


def _print_predictions(df, limit: int = 12) -> None:
    """A ``search.fidelity: sim`` study: how many real trials the simulator predicted within its stated
    error, and each trial's prediction against its measurement (the last ``limit``)."""
    share = prediction_share(df)
    if share is None:
        if any(c.startswith("predicted_") for c in df.columns):
            print("simulator predictions: the rows hold no stated error (written before it was recorded)")
        return
    print("simulator predictions (search.fidelity: sim), made before each real trial ran:")
    print(f"  {describe_share(share)}")
    done = df[df["status"] == TrialStatus.COMPLETED].sort_values("started_at")
    rows = [(r["trial_id"], checks) for r in done.to_dict("records") if (checks := prediction_checks(r))]
    for trial_id, checks in rows[-limit:]:
        print(f"  {trial_id}: " + "; ".join(describe_check(c) for c in checks))
    if len(rows) > limit:
        print(f"  ... {len(rows) - limit} earlier trial(s) not shown")


def _print_starts(starts, limit: int = 12) -> None:
    """Where the engines' starts went, one line per trial (the last ``limit``) and the medians."""
    if starts.empty:
        return
    names = ["import", "load", "compile", "graphs", "profile", "ready", "other"]
    print("engine starts, seconds (from vLLM's log; torch.compile compiled, or loaded from the compile cache):")
    print("  " + f"{'trial':>6}" + "".join(f"{n:>9}" for n in names) + f"{'startup_s':>11}  torch.compile")

    def line(label, values, startup, cached) -> str:
        cells = "".join(f"{'-' if v != v else f'{v:.1f}':>9}" for v in values)
        return f"  {label:>6}{cells}{'-' if startup != startup else f'{startup:.1f}':>11}  {cached}"

    phases = list(START_PHASE_LABELS)
    for _, r in starts.tail(limit).iterrows():
        cached = {True: "cache", False: "compiled"}.get(r["compile_cached"], "-")
        print(line(str(r["trial_number"]), [float(r[c]) for c in phases], float(r["startup_s"]), cached))
    if len(starts) > limit:
        print(f"  ... {len(starts) - limit} earlier trial(s) not shown")
    if len(starts) > 1:
        med = starts[phases + ["startup_s"]].astype(float).median()
        print(line("median", [med[c] for c in phases], med["startup_s"], ""))




def _when(t, fmt: str) -> str:
    return "?" if t is None or t != t else f"{t:{fmt}}"  # NaT: no time in a damaged row


def _print_best(frame, metrics: list[tuple[str, str]], bound=None) -> None:
    """One line per (metric, direction): its best value in ``frame`` and the trial that has it
    (flagged where ``bound``, a harness-bound mask, says so)."""
    for name, direction in metrics:
        col = frame[name].dropna() if name in frame else ()
        if len(col) == 0:
            continue
        idx = col.idxmax() if direction == "maximize" else col.idxmin()
        flag = ", harness-bound" if bound is not None and bool(bound.get(idx, False)) else ""
        present = frame.loc[col.index]
        tied = int(tie_mask(present, present.index.get_loc(idx), name).sum()) - 1
        note = f"; {tie_note(tied)}" if tied else ""
        value = shown_with_intervals(present.loc[[idx]], [name])[name].iloc[0]
        print(f"  {direction} {name}: {value} ({frame.loc[idx, 'trial_id']}{flag}{note})")


def _print_unit_best(completed, study) -> None:
    """The best trial meeting every SLO by each per-GPU and per-dollar metric that is not an objective
    (docs/metrics.md)."""
    ok = completed[feasible_mask(completed, study.constraints)]
    names = [m for m in unit_columns(ok) if m not in {o.metric for o in study.objectives}]
    if names:
        print("per GPU and per dollar, best trial meeting the SLOs:")
    _print_best(ok, [(m, default_direction(m)) for m in names])


def register(sub) -> None:
    pa = sub.add_parser("pareto", help="print the Pareto front of a study's results")
    pa.add_argument("path", help="the study's result directory (<output>/<study>)")
    pa.add_argument("--run", help="only this run id")
    pa.set_defaults(func=cmd_pareto)

    sh = sub.add_parser("show", help="summarise a study's results")
    sh.add_argument("path", help="the study's result directory (<output>/<study>)")
    sh.set_defaults(func=cmd_show)
