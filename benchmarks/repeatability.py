"""How much does one configuration's measurement move from run to run? Measured, not assumed.

One configuration of a study file, measured again and again with fresh seeds (each seed draws
other arrivals, lengths and prompts), through the product's own path (``run_study``: Ray,
Tune, the engine, the load generator, the Parquet writer), one study run per seed:

* **capacity**: the study's capacity search as the file sets it; what moves is
  ``capacity_rps`` (and whether each run's interval, ``capacity_rps_low`` to
  ``capacity_rps_high``, holds the median of all runs);
* **fixed rate** (``--rate R --duration S``): one load window at R req/s; what moves is
  TTFT p50/p99 and TPOT p50.

The configuration is the study's space with each parameter fixed (``--params`` JSON picks the
values of parameters that are searched). Runs are written under ``--output`` as studies
``<name>-s<seed>`` (capacity) and ``<name>-r<R>-s<seed>`` (fixed rate); the table is built
from those datasets alone (``table``), so it can be regenerated, and docs/benchmarks.md's
repeatability table is (``orchestrator.doc_tables.registry``).

    python benchmarks/repeatability.py run STUDY.yaml --seeds 0-4 --output DIR [--params '{...}'] [--label L]
    python benchmarks/repeatability.py run STUDY.yaml --seeds 0-4 --output DIR --rate 40 --duration 12
    python benchmarks/repeatability.py run STUDY.yaml --seeds 0 --starts 5 --output DIR   # engine starts as replicates
    python benchmarks/repeatability.py table DIR [DIR ...]

What the timer covers: ``trial wall s`` is each trial's own ``wall_time_s`` (engine start,
warm-up, every level, teardown); nothing else is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def seeds_of(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


def study_doc(path: str, seed: int, output: str, params: dict, label: str, rate, duration,
              virtual: bool = False, start: int = 0) -> dict:
    """The study file's document, made into one configuration measured once with ``seed``."""
    from orchestrator.study.file import read_study_document

    doc = read_study_document(path)
    if virtual:
        doc["engine"] = {"kind": "sim", "mode": "virtual"}
    space = {}
    for name, spec in (doc.get("space") or {}).items():
        if name in params:
            space[name] = params[name]
        elif isinstance(spec, (dict, list)):
            raise SystemExit(f"space.{name} is searched; fix it with --params '{{\"{name}\": VALUE}}'")
        else:
            space[name] = spec
    doc.update(space=space, seed=seed, output=output, budget={"trials": 1, "max_concurrent_trials": 1})
    doc.pop("search", None)
    base = label or doc["name"]
    if start:  # the same seed started again: the k-th engine start of this configuration
        base = f"{base}-k{start}"
    if rate is None:
        doc["name"] = f"{base}-s{seed}"
        return doc
    doc.pop("capacity", None)
    doc["name"] = f"{base}-r{rate:g}-s{seed}"
    wl = doc["workload"]
    wl["arrival"] = {**wl.get("arrival", {"kind": "poisson"}), "rate": rate}
    wl["num_requests"] = max(1, int(round(rate * duration)))
    doc["objectives"] = ["minimize ttft_p99_ms"]
    return doc


def run(args) -> int:
    from orchestrator.search.stop_signals import StudyInterrupted, stop_on_signals

    params = json.loads(args.params) if args.params else {}
    # A run cut short (a device call's time limit, Ctrl-C) stops as `orchestrator run` does: its trial
    # recorded interrupted, its engines ended, one line, instead of Ray's abort with a stack trace.
    with stop_on_signals():
        try:
            _run_all(args, params)
        except StudyInterrupted as e:
            print(e.line(args.label or Path(args.study).stem), file=sys.stderr)
            return e.exit_code
    return 0


def _run_all(args, params: dict) -> None:
    from orchestrator.results.definition import write_study_definition
    from orchestrator.search.driver import run_study
    from orchestrator.study.spec import parse_study

    for seed in seeds_of(args.seeds):
        for start in range(1, args.starts + 1) if args.starts else [0]:
            doc = study_doc(args.study, seed, args.output, params, args.label, args.rate, args.duration,
                            args.virtual, start)
            study = parse_study(doc, source_path=args.study)
            t0 = time.monotonic()
            write_study_definition(study)  # study.json beside the data: show, pareto and report read it
            result = run_study(study, quiet=True, resume=False)
            print(f"{study.name}: run {result.run_id} in {time.monotonic() - t0:.0f} s", flush=True)


def table(args) -> int:
    from orchestrator.results.repeatability import repeatability_table

    print(repeatability_table(*[Path(p) for p in args.dirs]))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("study")
    r.add_argument("--seeds", default="0-4")
    r.add_argument("--output", required=True)
    r.add_argument("--params", help="JSON: values for the study's searched parameters")
    r.add_argument("--label", help="the studies' name (default: the study file's)")
    r.add_argument("--rate", type=float, help="fixed rate instead of the capacity search")
    r.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals at --rate")
    r.add_argument("--virtual", action="store_true", help="the simulator in virtual time instead of the file's engine")
    r.add_argument("--starts", type=int, default=0,
                   help="start the engine this many times per seed (studies <label>-k<k>-s<seed>): what moves "
                        "between engine starts of one configuration on the same requests")
    r.set_defaults(func=run)
    t = sub.add_parser("table")
    t.add_argument("dirs", nargs="+")
    t.set_defaults(func=table)
    args = ap.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
