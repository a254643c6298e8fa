"""Orchestration overhead per trial: time beyond engine start-up and the load window, seen
from the driver.

Runs the same configurations twice on a local Ray with the served sim engine:

* baseline: a bare loop in one process (deploy, load, delete; no Tune, no Optuna, no
  Parquet, no GPU ledger), timing the same phases;
* orchestrated: ``run_study`` (Tune trial actors, Optuna journal, ledger, results sink,
  Parquet), from each row's start time and phase columns.

A trial's overhead is what it spends outside start-up, load window and GPU queueing
inside its trial process (``overhead_s``: teardown bookkeeping, the ledger), plus the gap
before it: from the moment a slot came free (an earlier trial's end) to its own start.
That gap holds what happens between trials: the result write to Parquet, the report to
Tune, Optuna's tell and ask, Tune scheduling the next trial onto the reused actor. With
``c`` trials at a time, trial ``k`` (in start order) takes the slot of the ``k-c``-th trial
to end. The first ``c`` trials took no freed slot (before them is the study's start-up):
they are left out of both paths. Prints both paths and the ratio of their mean overheads; the target is
<= 2 s and <= 3% of the trial time.

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

from orchestrator.study.spec import parse_study  # noqa: E402

SERVE_PORT = 8150
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


def baseline(study, trials: int, serve_port: int) -> list[dict]:
    """Deploy, load and delete in one process: what a hand-written script would cost."""
    from orchestrator.engines.base import EngineContext
    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.loadgen import Endpoint, run_load_sync
    from orchestrator.search.trial_plan import engine_for, load_plan

    engine = engine_for(study, EngineContext(serve_port=serve_port))
    requests = load_plan(study).requests()
    phases = []
    for params in CONFIGS[:trials]:
        t0 = time.monotonic()
        gap = t0 - phases[-1]["end"] if phases else None
        args = engine.resolve(engine_args_from_params({**params, "stream_interval": 4}))
        dep = engine.deploy(f"base-{len(phases)}", args)
        startup = time.monotonic() - t0
        t1 = time.monotonic()
        with dep:
            run_load_sync(Endpoint(dep.endpoint.base_url, dep.endpoint.model), requests,
                          timeout_s=study.workload.timeout_s)
            load = time.monotonic() - t1
        end = time.monotonic()
        wall = end - t0
        phases.append({"wall": wall, "startup": startup, "load": load, "in_trial": wall - startup - load,
                       "gap": gap, "end": end})
    return with_overhead(phases)


def with_overhead(phases: list[dict]) -> list[dict]:
    """Trials that took a freed slot, with ``overhead`` = in-trial overhead + the gap before them."""
    return [dict(p, overhead=p["in_trial"] + p["gap"], wall=p["wall"] + p["gap"]) for p in phases
            if p["gap"] is not None]


def orchestrated_phases(df, concurrency: int) -> list[dict]:
    """Per trial (start order): its in-trial overhead, and the gap since the slot it took came free."""
    rows = sorted(df.itertuples(), key=lambda r: r.started_at)
    ends = sorted(r.started_at.timestamp() + r.wall_time_s for r in rows)
    phases = []
    for k, r in enumerate(rows):
        start = r.started_at.timestamp()
        gap = start - ends[k - concurrency] if k >= concurrency else None
        phases.append({"wall": r.wall_time_s, "startup": r.startup_s, "load": r.load_window_s,
                       "in_trial": r.overhead_s, "gap": gap})
    return with_overhead(phases)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=150, help="measured requests per trial (at 10 req/s)")
    a = ap.parse_args()

    import ray

    from orchestrator.cluster.connect import start_serve
    from orchestrator.results import load_trials
    from orchestrator.search.driver import run_study

    out = tempfile.mkdtemp(prefix="overhead-")
    study = parse_study(study_doc(out, a.trials, a.concurrency, a.requests))
    ray.init(address="local", num_cpus=4, num_gpus=study.hardware.gpus_per_node, include_dashboard=False, namespace="orchestrator",
             log_to_driver=False)
    try:
        start_serve(SERVE_PORT)
        base = baseline(study, a.trials, SERVE_PORT)
        run_study(study, quiet=True, serve_port=SERVE_PORT)
    finally:
        ray.shutdown()
    df = load_trials(f"{out}/overhead")
    orch = orchestrated_phases(df, a.concurrency)

    def row(name, ph):
        ov = [p["overhead"] for p in ph]
        share = [p["overhead"] / p["wall"] for p in ph]
        return (f"| {name} | {len(ph)} | {statistics.mean(p['wall'] for p in ph):.1f} | "
                f"{statistics.mean(p['startup'] for p in ph):.1f} | {statistics.mean(p['load'] for p in ph):.1f} | "
                f"{statistics.mean(p['in_trial'] for p in ph):.2f} | {statistics.mean(p['gap'] for p in ph):.2f} | "
                f"{statistics.mean(ov):.2f} | {max(ov):.2f} | {100 * statistics.mean(share):.1f}% |")

    print("| path | trials | wall s (gap included) | start-up s | load window s | in-trial overhead s | "
          "gap before s | overhead s (mean) | overhead s (max) | overhead / wall |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(row("bare loop (baseline)", base))
    print(row(f"orchestrated (Tune + Optuna + Parquet, concurrency {a.concurrency})", orch))
    ratio = statistics.mean(p["overhead"] for p in orch) / max(1e-9, statistics.mean(p["overhead"] for p in base))
    print(f"\norchestrated / baseline overhead: {ratio:.2f}x")


if __name__ == "__main__":
    main()
