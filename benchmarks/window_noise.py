"""Window noise: how far a latency statistic moves between windows measured apart at one rate, beyond
what one window's own requests show (docs/benchmarks.md, "Window noise";
``orchestrator/doc_tables/window_noise.py`` defines it).

    python benchmarks/window_noise.py windows STUDY_DIR [STUDY_DIR ...] --source H200 --out WINDOWS.parquet
    python benchmarks/window_noise.py table --windows WINDOWS.parquet --fixed-rate "CPU vLLM=DIR" ...
    python benchmarks/window_noise.py rejudge STUDY_DIR [STUDY_DIR ...]   # a capacity run's levels judged again

``windows`` reads the requests of capacity levels measured in two windows or more (an undecided level
is measured again) and writes one row per window: its values and its own intervals. ``table`` pools
them, and fixed-rate repeatability runs (``benchmarks/repeatability.py --rate``, one window per seed),
into the noise per statistic. The constants the product uses (``orchestrator/measure/confidence.py``:
``GPU_WINDOW_NOISE``, ``CPU_WINDOW_NOISE``) come from this table. Nothing is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import pandas as pd

    from orchestrator.doc_tables.window_noise import fixed_rate_windows, window_noise_table, windows_frame

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("windows", help="per-window values and intervals of levels measured more than once")
    w.add_argument("dirs", nargs="+")
    w.add_argument("--source", required=True, help="a label for these windows (the engine and machine)")
    w.add_argument("--out", required=True)
    t = sub.add_parser("table", help="the noise per statistic")
    t.add_argument("--windows", action="append", default=[], help="a parquet file written by `windows`")
    t.add_argument("--fixed-rate", action="append", default=[], metavar="LABEL=DIR",
                   help="fixed-rate repeatability runs (benchmarks/repeatability.py --rate)")
    r = sub.add_parser("rejudge", help="a capacity run's recorded levels judged again with and without the "
                                       "engine's window noise, and the capacity bracket each gives")
    r.add_argument("dirs", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "rejudge":
        for d in args.dirs:
            for line in rejudge(Path(d)):
                print(line)
        return 0
    if args.cmd == "windows":
        frame = pd.concat([windows_frame(d, source=args.source) for d in args.dirs], ignore_index=True)
        if frame.empty:
            print("no level was measured in two windows or more", file=sys.stderr)
            return 1
        frame.to_parquet(args.out, index=False)
        print(f"{len(frame)} windows of {frame['group'].nunique()} levels -> {args.out}")
        return 0
    frames = [pd.read_parquet(f) for f in args.windows]
    for spec in args.fixed_rate:
        label, _, folder = spec.partition("=")
        frames.append(fixed_rate_windows(folder, source=label))
    print(window_noise_table(frames))
    return 0


def rejudge(study_dir: Path) -> list[str]:
    """Each recorded level judged again from its requests (all its windows pooled), without and with
    the window noise the study's engine gets, and the capacity fit over those levels."""
    import dataclasses

    from orchestrator.apps.interchange import records_from_request_rows
    from orchestrator.measure.confidence import metric_intervals
    from orchestrator.measure.engine_noise import NO_WINDOW_NOISE
    from orchestrator.measure.metrics import summarise
    from orchestrator.results.definition import read_study_definition
    from orchestrator.results.levels import load_levels
    from orchestrator.results.query import load_requests
    from orchestrator.measure.confidence import BOOTSTRAP_SAMPLES
    from orchestrator.search.trial_plan import load_plan, window_noise
    from orchestrator.trial.capacity import LevelResult, judge_level
    from orchestrator.trial.capacity_fit import fit_capacity
    from orchestrator.trial.load_phase import level_confidence, level_margins

    study = read_study_definition(str(study_dir))
    slo, confidence = study.capacity_slo(), study.capacity.confidence
    decide_at = level_confidence(confidence)  # as the search decides a level
    requests, levels = load_requests(study_dir), load_levels(study_dir).sort_values("level")
    lines = []
    for label, noise in (("as drawn", NO_WINDOW_NOISE), ("window noise", window_noise(study))):
        plan = dataclasses.replace(load_plan(study), window_noise=noise)
        results = []
        for _, lv in levels.iterrows():
            records = records_from_request_rows(requests[requests["level"] == lv["level"]])
            intervals = metric_intervals(records, [c.metric for c in slo], confidence=decide_at, seed=study.seed,
                                         window_noise=noise)
            metrics = summarise(records)
            verdict = judge_level(metrics, slo, intervals=intervals, confidence=decide_at,
                                  saturated=bool(lv["saturated"]))
            results.append(LevelResult(int(lv["level"]), float(lv["rate"]), len(records), records, metrics, verdict,
                                       saturated_at_s=lv["saturated_at_s"] if lv["saturated"] else None,
                                       windows=int(lv["windows"])))
        points = [r.point for r in results]
        b = fit_capacity([level_margins(plan, r, None) for r in results], confidence=confidence,
                         samples=BOOTSTRAP_SAMPLES, resolution=study.capacity.tolerance)
        high = "none" if b.high is None else f"{b.high:.1f}"
        verdicts = " ".join(f"{p.rate:.1f}:{'met' if p.ok else 'missed'}{'' if p.decided else '?'}" for p in points)
        lines.append(f"{study_dir.name} {label}: {b.estimate:.1f} [{b.low:.1f}, {high}]  {verdicts}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
