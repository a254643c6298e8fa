"""``orchestrator nightly``: tonight's run of a study, compared with the previous night."""

from __future__ import annotations

from pathlib import Path

from orchestrator.apps.nightly import NightlyPolicy
from orchestrator.apps.nightly_run import run_nightly
from orchestrator.commands.common import EXIT_OK, EXIT_USAGE, add_run_arguments, err, load_study_with_overrides

# Distinct from 1 (the command failed) and 2 (bad usage): the run worked and found a slowdown.
EXIT_REGRESSION = 3


def cmd_nightly(args) -> int:
    study = load_study_with_overrides(args)
    if study is None:
        return EXIT_USAGE
    try:
        policy = NightlyPolicy(threshold=args.threshold, remeasure=args.remeasure,
                               capacity_metric=args.capacity_metric,
                               latency_metrics=tuple(args.latency_metric or NightlyPolicy.latency_metrics))
    except ValueError as e:
        err(f"nightly: {e}")
        return EXIT_USAGE
    night = run_nightly(study, policy=policy, address=args.address, serve_port=args.port, quiet=args.quiet)
    summary = night.summary
    text = summary.to_json()
    if args.summary:
        Path(args.summary).write_text(text)
    print()
    print(f"nightly {summary.night}, run {summary.run_id}: " + ", ".join(f"{v} {k}" for k, v in sorted(
        summary.trials.items())) + f"; {summary.remeasured} front point(s) of the previous night re-measured first")
    print(summary.headline())
    if summary.regression:
        print("REGRESSION:")
        for reason in summary.reasons:
            print(f"  {reason}")
    elif summary.previous_run_id:
        print("no regression")
    print(f"summary: {night.summary_path}")
    if args.report:
        # deferred: apps.report imports matplotlib (~0.4 s); every CLI command loads this module
        from orchestrator.apps.report import write_report

        files = write_report(night.study_dir)
        print(f"report:  {files.html}")
    return EXIT_REGRESSION if summary.regression else EXIT_OK


def register(sub) -> None:
    n = sub.add_parser("nightly", help="run a study tonight and flag regressions against the previous night",
                       description="Run the study with its budget in a run of its own, re-measuring the previous "
                                   "night's front first; compare best capacity and p99 latencies with the previous "
                                   f"night. Exit {EXIT_REGRESSION} on a regression, 0 otherwise.")
    n.add_argument("study", help="study YAML file")
    n.add_argument("--threshold", type=float, default=0.03,
                   help="smallest relative change for the worse that is a regression, when it is also beyond "
                        "both nights' measurement intervals (default 0.03 = 3%%)")
    n.add_argument("--remeasure", type=int,
                   help="how many of the previous night's front points to re-measure first (default: half the budget)")
    n.add_argument("--capacity-metric", help="metric compared as capacity (default: capacity_rps when measured, "
                                             "else the study's first maximised objective)")
    n.add_argument("--latency-metric", action="append",
                   help="latency compared per configuration (repeatable; default ttft_p99_ms and tpot_p99_ms)")
    n.add_argument("--summary", metavar="FILE", help="also write the JSON summary here")
    n.add_argument("--no-report", dest="report", action="store_false", help="do not write the HTML report")
    add_run_arguments(n)
    n.set_defaults(func=cmd_nightly)
