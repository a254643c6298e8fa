"""Decisions, not ties: does a study tell two configurations apart, and call two equal ones equivalent?

The interactive study's workload, SLOs and capacity search (``search_spaces/llama3-8b-h200-interactive.yaml``,
its ``capacity:`` section as it is: the same windows) on the simulated engine in virtual time, on an
H100-80GB. For every seed (a study's seed: the requests every configuration of that study replays),
each configuration is one trial, through the product's trial path (``measure_trial``: plan, execute,
judge, the row); the pairs are compared as ``pareto``, ``recommend`` and the report compare them
(:func:`orchestrator.results.paired.compare`, the study's equivalence margin, 5%):

* **10% apart**: ``max_num_seqs`` 72 against 88 (``max_num_batched_tokens`` 512): their true
  capacities differ by about 10%. The truth is the median estimate over 40 other seeds (``truth``): a
  capacity is the rate at which a level of this length meets the SLOs (a p99 over 8 s of requests
  is not a p99 over 40 s: longer levels give lower capacities), so more seeds, not longer levels,
  say what these searches estimate;
* **identical**: ``max_num_seqs`` 88 twice, two trials (each with its own noise seed). On the
  simulator in virtual time the two replay the same requests and get the same numbers: equivalence
  there is what common random numbers buy, not a test of noise (the served simulator's test and the
  real engines' replicate starts are);
* **near-identical**: ``max_num_seqs`` 128 against 256: no level of this workload runs 128 requests at
  once, so the two differ only where the scheduler's batch limits never bind.

    python benchmarks/decisions.py run --seeds 0-19 --output results/examples/decisions-sim
    python benchmarks/decisions.py truth --seeds 100-139 --output results/examples/decisions-sim
    python benchmarks/decisions.py table results/examples/decisions-sim

``run`` and ``truth`` write ``trials.parquet`` / ``truth.parquet`` (one row per trial, the product's own
columns, ``draws_json`` included); ``table`` builds docs/benchmarks.md's table from them
(``orchestrator.doc_tables.decisions``). What the timer covers: ``wall_time_s``, each trial's own (the
simulated levels in virtual time, the fit); nothing else is timed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STUDY = "search_spaces/llama3-8b-h200-interactive.yaml"
CONFIGS = {
    "S72": {"max_num_seqs": 72, "max_num_batched_tokens": 512},
    "S88": {"max_num_seqs": 88, "max_num_batched_tokens": 512},
    "S128": {"max_num_seqs": 128, "max_num_batched_tokens": 512},
    "S256": {"max_num_seqs": 256, "max_num_batched_tokens": 512},
}
# (pair, a, b): each pair's two trials of one seed; "S88" twice is the identical pair.
TRIALS = (("10% apart", "S72", "a"), ("10% apart", "S88", "b"), ("identical", "S88", "a"),
          ("identical", "S88", "b"), ("near-identical", "S128", "a"), ("near-identical", "S256", "b"))


def seeds_of(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    return out


def study_for(seed: int):
    from orchestrator.study.file import read_study_document
    from orchestrator.study.spec import parse_study

    doc = read_study_document(STUDY)
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["hardware"] = {"gpu": "H100-80GB", "gpus_per_node": 1}
    doc["seed"] = seed
    doc["name"] = "decisions-sim"
    doc.pop("search", None)
    doc["space"] = {"max_num_seqs": [72, 88, 128, 256], "max_num_batched_tokens": [512],
                    "gpu_memory_utilization": 0.9, "max_model_len": 4096}
    return parse_study(doc, source_path=STUDY)


def measure(args, truth: bool) -> int:
    import pandas as pd

    from orchestrator.search.tune import measure_trial
    from orchestrator.trial.run import TrialContext

    rows = []
    trials = list(TRIALS)
    if truth:
        trials = [("truth", c, "a") for c in dict.fromkeys(c for _, c, _ in TRIALS)]
    for seed in seeds_of(args.seeds):
        study = study_for(seed)
        for pair, config, side in trials:
            t0 = time.monotonic()
            trial_id = f"s{seed}-{pair.replace(' ', '_').replace('%', 'pct')}-{side}-{config}"
            got = measure_trial(study, CONFIGS[config], trial_id=trial_id, trial_number=len(rows),
                                ctx=TrialContext(f"decisions-{seed}"))
            row = dict(got.row)
            row.update(seed=seed, pair=pair, config=config, side=side)
            rows.append(row)
            print(f"seed {seed} {pair:>14} {config:>5}: capacity {row.get('capacity_rps') or 0:.2f} "
                  f"[{row.get('capacity_rps_low') or 0:.2f}, {row.get('capacity_rps_high') or 0:.2f}] "
                  f"({time.monotonic() - t0:.1f} s)", flush=True)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    keep = [c for c in frame.columns if not frame[c].isna().all()]
    frame[keep].to_parquet(out / ("truth.parquet" if truth else "trials.parquet"), index=False)
    print(f"{len(frame)} trials -> {out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "truth"):
        r = sub.add_parser(name)
        r.add_argument("--seeds", default="0-19" if name == "run" else "100-139")
        r.add_argument("--output", required=True)
    t = sub.add_parser("table")
    t.add_argument("folder")
    args = ap.parse_args(argv)
    if args.cmd == "table":
        from orchestrator.doc_tables.decisions import decisions_table

        print(decisions_table(Path(args.folder)))
        return 0
    return measure(args, truth=args.cmd == "truth")


if __name__ == "__main__":
    sys.exit(main())
