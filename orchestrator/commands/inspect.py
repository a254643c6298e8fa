"""``orchestrator pareto`` and ``orchestrator show``: read a study's results."""

from __future__ import annotations

from orchestrator.commands.common import EXIT_OK, EXIT_USAGE, print_front, study_from_dataset


def cmd_pareto(args) -> int:
    study = study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    print_front(study, args.path, run_id=args.run)
    return EXIT_OK


def cmd_show(args) -> int:

    from orchestrator.harness import harness_bound_mask
    from orchestrator.pricing import study_price
    from orchestrator.results import load_trials

    study = study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    df = load_trials(args.path)
    print(f"study {study.name} ({study.engine.kind} engine, {study.model.name} on {study.hardware.gpu})")
    print(study_price(study).describe())
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
    bound = harness_bound_mask(completed)
    if len(completed):
        print("best completed trial per objective:")
        for o in study.objectives:
            col = completed[o.metric].dropna()
            if col.empty:
                continue
            idx = col.idxmax() if o.resolved_direction == "maximize" else col.idxmin()
            flag = ", harness-bound" if bool(bound.get(idx, False)) else ""
            print(f"  {o.resolved_direction} {o.metric}: {col[idx]:,.4g} ({completed.loc[idx, 'trial_id']}{flag})")
        _print_unit_best(completed, study)
    if bound.any():
        flagged = completed[bound]
        print(f"harness-bound: {len(flagged)} of {len(completed)} completed trials measured the serving path "
              "or the client, not the engine (client vs engine numbers, see docs/metrics.md):")
        for _, r in flagged.head(5).iterrows():
            print(f"  {r['trial_id']}: {r.get('harness_bound_reason') or '?'}")
        if len(flagged) > 5:
            print(f"  ... and {len(flagged) - 5} more")
    print_front(study, args.path)
    return EXIT_OK




def _print_unit_best(completed, study) -> None:
    """The best trial meeting every SLO by each per-GPU and per-dollar metric that is not an objective
    (docs/metrics.md)."""
    from orchestrator.judge import feasible_mask
    from orchestrator.metrics import default_direction
    from orchestrator.pricing import unit_columns

    ok = completed[feasible_mask(completed, study.constraints)]
    names = [m for m in unit_columns(ok) if m not in {o.metric for o in study.objectives}]
    if names:
        print("per GPU and per dollar, best trial meeting the SLOs:")
    for name in names:
        col = ok[name].dropna()
        direction = default_direction(name)
        idx = col.idxmax() if direction == "maximize" else col.idxmin()
        print(f"  {direction} {name}: {col[idx]:,.4g} ({ok.loc[idx, 'trial_id']})")


def register(sub) -> None:
    pa = sub.add_parser("pareto", help="print the Pareto front of a study's results")
    pa.add_argument("path", help="the study's result directory (<output>/<study>)")
    pa.add_argument("--run", help="only this run id")
    pa.set_defaults(func=cmd_pareto)

    sh = sub.add_parser("show", help="summarise a study's results")
    sh.add_argument("path", help="the study's result directory (<output>/<study>)")
    sh.set_defaults(func=cmd_show)
