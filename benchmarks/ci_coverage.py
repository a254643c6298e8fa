"""Do the load windows' confidence intervals cover the truth as often as they promise?

The engine is the simulator in virtual time (no noise but the workload's draw: arrivals,
lengths, prompts), so a configuration's true value at a rate is known to any precision by
measuring it over many seeds. For each rate, ``--seeds`` windows of ``--duration`` seconds
(fresh seeds, the H200 chat study's workload, vLLM's defaults on an H200) give each a point
value and an interval (:func:`orchestrator.measure.confidence.metric_intervals`, one per block
length); the truth is the median point value over the seeds. Coverage is the share of
windows whose interval holds the truth; an honest 90% interval covers about 90%.

What the timer covers: nothing is timed; the figures are coverage shares and interval widths.

    python benchmarks/ci_coverage.py [--seeds 60] [--duration 12] [--rates 40,50,55] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def coverage(rate: float, seeds: int, duration: float, blocks=BLOCKS_S) -> list[dict]:
    points: dict[str, list[float]] = {m: [] for m in METRICS}
    bands: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for seed in range(seeds):
        recs = window(rate, duration, 1000 + seed)
        m = summarise(recs).as_dict()
        for name in METRICS:
            points[name].append(m[name])
        for b in blocks:
            for name, iv in metric_intervals(recs, METRICS, block_s=b, seed=seed).items():
                bands.setdefault((name, b), []).append((iv.low, iv.high))
    rows = []
    for name in METRICS:
        truth = statistics.median(points[name])
        spread = (np.percentile(points[name], 95) - np.percentile(points[name], 5)) / truth
        for b in blocks:
            ivs = bands.get((name, b), [])
            covered = sum(lo <= truth <= hi for lo, hi in ivs) / max(len(ivs), 1)
            width = statistics.median((hi - lo) / truth for lo, hi in ivs) if ivs else float("nan")
            rows.append({"rate": rate, "metric": name, "block_s": b, "truth": truth, "spread_90": spread,
                         "coverage": covered, "median_width": width})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--rates", default="40,50,55")
    ap.add_argument("--blocks", default=",".join(f"{b:g}" for b in BLOCKS_S), help="block lengths (s) to compare")
    ap.add_argument("--markdown", help="also write the table here")
    a = ap.parse_args()
    blocks = tuple(float(b) for b in a.blocks.split(","))
    rows = [r for rate in (float(x) for x in a.rates.split(",")) for r in coverage(rate, a.seeds, a.duration, blocks)]
    lines = [f"Coverage of {DEFAULT_CONFIDENCE:.0%} intervals, {a.seeds} seeds x {a.duration:g} s windows "
             "(virtual simulator, H200 chat workload, vLLM's defaults)", "",
             "| rate req/s | metric | truth (median) | seeds' 5-95% spread | block s | coverage | median interval width |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['rate']:g} | {r['metric']} | {r['truth']:.4g} | {r['spread_90']:.1%} | {r['block_s']:g} | "
                     f"{r['coverage']:.0%} | {r['median_width']:.1%} |")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        Path(a.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
