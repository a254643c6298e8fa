"""Orchestration overhead per trial: time beyond engine start-up and the load window.

Runs the same configurations twice on a local Ray with the served sim engine:

* baseline: a bare loop in one process (deploy, load, delete; no Tune, no Optuna, no
  Parquet, no GPU ledger), timing the same phases;
* orchestrated: ``run_study`` (Tune trial actors, Optuna journal, ledger, results sink,
  Parquet), reading each row's phase columns.

Overhead = trial wall time - start-up - load window - GPU queueing. Prints both and their
ratio; the target is <= 2 s and <= 3% of the trial time.

    python benchmarks/orchestration_overhead.py [--trials 6] [--concurrency 1] [--requests 150]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.study import parse_study  # noqa: E402

CONFIGS = [
    {"max_num_seqs": s, "max_num_batched_tokens": b}
    for s, b in ((32, 2048), (64, 4096), (128, 8192), (256, 2048), (48, 8192), (96, 4096), (192, 2048), (16, 8192))
]


def study_doc(out: str, trials: int, concurrency: int, requests: int) -> dict:
    return {
        "name": "overhead",
        "engine": {"kind": "sim"},
        "model": {"name": "llama-3.1-8b"},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": max(2, concurrency)},
        "workload": {"arrival": {"kind": "poisson", "rate": 10}, "num_requests": requests, "warmup_requests": 2,
                     "input_len": {"kind": "uniform", "min": 200, "max": 800}, "output_len": 64},
        "space": {"max_num_seqs": sorted({c["max_num_seqs"] for c in CONFIGS[:trials]}),
                  "max_num_batched_tokens": sorted({c["max_num_batched_tokens"] for c in CONFIGS[:trials]}),
                  "stream_interval": 4},
        "objectives": ["maximize output_throughput_per_gpu"],
        "search": {"sampler": "random", "initial_points": CONFIGS[:trials]},
        "budget": {"trials": trials, "max_concurrent_trials": concurrency},
        "output": out,
    }


def baseline(study, trials: int) -> list[dict]:
    """Deploy, load and delete in one process: what a hand-written script would cost."""
    from orchestrator.engine_args import engine_args_from_params
    from orchestrator.engines import create_engine
    from orchestrator.loadgen import Endpoint, run_load_sync
    from orchestrator.load_phase import study_requests

    engine = create_engine(study)
    requests = study_requests(study)
    phases = []
    for params in CONFIGS[:trials]:
        t0 = time.monotonic()
        args = engine.resolve(engine_args_from_params({**params, "stream_interval": 4}))
        dep = engine.deploy(f"base-{len(phases)}", args)
        startup = time.monotonic() - t0
        t1 = time.monotonic()
        with dep:
            run_load_sync(Endpoint(dep.endpoint.base_url, dep.endpoint.model), requests,
                          timeout_s=study.workload.timeout_s)
            load = time.monotonic() - t1
        wall = time.monotonic() - t0
        phases.append({"wall": wall, "startup": startup, "load": load, "overhead": wall - startup - load})
    return phases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=150, help="measured requests per trial (at 10 req/s)")
    a = ap.parse_args()

    import ray

    from orchestrator.cluster import start_serve
    from orchestrator.results import load_trials
    from orchestrator.search import run_study

    out = tempfile.mkdtemp(prefix="overhead-")
    study = parse_study(study_doc(out, a.trials, a.concurrency, a.requests))
    ray.init(address="local", num_cpus=4, num_gpus=study.hardware.gpus_per_node, include_dashboard=False, namespace="orchestrator",
             log_to_driver=False)
    try:
        start_serve(8150)
        import os

        os.environ["ORCHESTRATOR_SERVE_PORT"] = "8150"
        base = baseline(study, a.trials)
        run_study(study, quiet=True, serve_port=8150)
    finally:
        ray.shutdown()
    df = load_trials(f"{out}/overhead")
    orch = [{"wall": r.wall_time_s, "startup": r.startup_s, "load": r.load_window_s, "overhead": r.overhead_s}
            for r in df.itertuples()]

    def row(name, ph):
        ov = [p["overhead"] for p in ph]
        share = [p["overhead"] / p["wall"] for p in ph]
        return (f"| {name} | {len(ph)} | {statistics.mean(p['wall'] for p in ph):.1f} | "
                f"{statistics.mean(p['startup'] for p in ph):.1f} | {statistics.mean(p['load'] for p in ph):.1f} | "
                f"{statistics.mean(ov):.2f} | {max(ov):.2f} | {100 * statistics.mean(share):.1f}% |")

    print("| path | trials | wall s | start-up s | load window s | overhead s (mean) | overhead s (max) | "
          "overhead / wall |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(row("bare loop (baseline)", base))
    print(row(f"orchestrated (Tune + Optuna + Parquet, concurrency {a.concurrency})", orch))
    ratio = statistics.mean(p["overhead"] for p in orch) / max(1e-9, statistics.mean(p["overhead"] for p in base))
    print(f"\norchestrated / baseline overhead: {ratio:.2f}x")


if __name__ == "__main__":
    main()
