"""Do the load windows' confidence intervals cover the truth as often as they promise?

The engine is the simulator in virtual time (no noise but the workload's draw: arrivals,
lengths, prompts), so a configuration's true value at a rate is known to any precision by
measuring it over many seeds. For each rate, ``--seeds`` windows of ``--duration`` seconds
(fresh seeds, the H200 chat study's workload, vLLM's defaults on an H200) give each a point
value and an interval (:func:`orchestrator.measure.confidence.metric_intervals`, one per block
length); the truth is the median point value over the seeds. Coverage is the share of
windows whose interval holds the truth; an honest 90% interval covers about 90%.

What the timer covers: nothing is timed; the figures are coverage shares and interval widths.

    python benchmarks/ci_coverage.py [--seeds 60] [--duration 12] [--rates 40,50,55] [--markdown FILE] [--output DIR]

``--output results/examples/ci-coverage`` stores the dataset docs/benchmarks.md's table and figures are
generated from (:mod:`orchestrator.doc_tables.ci_coverage`): every window's point value and interval
per metric, and the run (``run.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dataset  # noqa: E402
from orchestrator.doc_tables import ci_coverage as tables  # noqa: E402

from orchestrator.measure.blocks import BLOCK_S  # noqa: E402
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, metric_intervals  # noqa: E402
from orchestrator.measure.metrics import summarise  # noqa: E402

METRICS = ("ttft_p99_ms", "ttft_p90_ms", "ttft_p50_ms", "tpot_p50_ms", "tpot_p99_ms", "e2el_p99_ms", "output_throughput")
BLOCKS_S = (BLOCK_S,)  # --blocks 0.5,1,2,4 compares block lengths
DEFAULTS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9}


def h200_study(rate: float, duration: float, seed: int):
    """The H200 chat study's workload at ``rate`` for ``duration`` seconds, on the virtual simulator."""
    import yaml

    from orchestrator.study.spec import parse_study

    root = Path(__file__).resolve().parents[1]
    doc = yaml.safe_load((root / "search_spaces" / "llama3-8b-h200.yaml").read_text())
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["seed"] = seed
    doc["workload"]["arrival"] = {"kind": "poisson", "rate": rate}
    doc["workload"]["num_requests"] = int(round(rate * duration))
    doc.pop("capacity", None)
    doc["objectives"] = ["maximize output_throughput"]
    doc["space"] = {k: v for k, v in doc["space"].items() if k == "max_model_len"} | DEFAULTS
    doc.pop("search", None)
    return parse_study(doc, source_path=root / "search_spaces" / "llama3-8b-h200.yaml")


def window(rate: float, duration: float, seed: int):
    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.search.trial_plan import engine_for, load_plan

    study = h200_study(rate, duration, seed)
    engine = engine_for(study)
    args = engine.resolve(engine_args_from_params(dict(DEFAULTS, max_model_len=4096)))
    records = engine.measure(args, load_plan(study).requests()).records
    return [r for r in records if not r.warmup]


def windows(rate: float, seeds: int, duration: float, blocks=BLOCKS_S) -> list[dict]:
    """One row per window, metric and block length: the window's point value and its interval."""
    rows = []
    for seed in range(seeds):
        recs = window(rate, duration, 1000 + seed)
        m = summarise(recs).as_dict()
        for b in blocks:
            ivs = metric_intervals(recs, METRICS, block_s=b, seed=seed)
            for name in METRICS:
                iv = ivs.get(name)
                rows.append({"rate": rate, "seed": seed, "metric": name, "block_s": b, "point": m[name],
                             "interval": iv is not None, "low": None if iv is None else iv.low,
                             "high": None if iv is None else iv.high})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--rates", default="40,50,55")
    ap.add_argument("--blocks", default=",".join(f"{b:g}" for b in BLOCKS_S), help="block lengths (s) to compare")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--output", type=Path, help="write the dataset here (windows.parquet, run.json)")
    a = ap.parse_args(argv)
    blocks = tuple(float(b) for b in a.blocks.split(","))
    rates = tuple(float(x) for x in a.rates.split(","))
    record = dataset.RunRecord.for_script("ci_coverage.py", sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    frame = pd.DataFrame([r for rate in rates for r in windows(rate, a.seeds, a.duration, blocks)])
    text = "\n".join([f"Coverage of {DEFAULT_CONFIDENCE:.0%} intervals, {a.seeds} seeds x {a.duration:g} s windows "
                      "(virtual simulator, H200 chat workload, vLLM's defaults)", "", tables.table(frame, block_column=True)])
    print(text)
    if a.markdown:
        Path(a.markdown).write_text(text + "\n")
    if a.output:
        run = record.finish(**{"seeds": a.seeds, "duration": a.duration, "rates": list(rates), "blocks": list(blocks),
               "confidence": DEFAULT_CONFIDENCE, "seconds": round(time.monotonic() - t0, 1)})
        print(f"wrote {dataset.write(a.output, {tables.WINDOWS_FILE: frame}, run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
