"""``orchestrator report``: an HTML page and PNG figures of a study's results."""

from __future__ import annotations

from orchestrator.commands.common import EXIT_OK, EXIT_USAGE, err


def cmd_report(args) -> int:
    # deferred: apps.report imports matplotlib (~0.4 s); every CLI command loads this module
    from orchestrator.apps.report import ReportOptions, write_report

    try:
        files = write_report(args.path, args.output, options=ReportOptions(run=args.run, max_curves=args.max_curves))
    except FileNotFoundError as e:
        err(f"report: {e}")
        return EXIT_USAGE
    print(f"report: {files.html}")
    for name, path in sorted(files.images.items()):
        print(f"  {name}: {path}")
    return EXIT_OK


def register(sub) -> None:
    r = sub.add_parser("report", help="write an HTML report (Pareto front, curves, importance, failures) and PNGs")
    r.add_argument("path", help="the study's result directory (<output>/<study>), local or s3:// / gs://")
    r.add_argument("--output", "--out", dest="output", metavar="DIR",
                   help="report directory (default: <path>/report); --out is the same option")
    r.add_argument("--run", help="only trials of this run id")
    r.add_argument("--max-curves", type=int, default=6, help="configurations in the latency-vs-load figure")
    r.set_defaults(func=cmd_report)
