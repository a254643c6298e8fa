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
they are left out of both paths. The target is <= 2 s and <= 3% of the trial time.

Stores every trial's phases (``phases.parquet``) and the run (``run.json``: command, date, cores,
load average before and after) in results/examples/orchestration-overhead; the docs' table and
text are computed from them (``orchestrator/doc_tables/overhead.py``).

    python benchmarks/orchestration_overhead.py [--trials 6] [--concurrency 1 2] [--requests 150]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataset import EXAMPLES, RunRecord, write  # noqa: E402

from orchestrator.doc_tables import overhead as tables  # noqa: E402
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
    rows, origin = [], time.monotonic()
    for params in CONFIGS[:trials]:
        t0 = time.monotonic()
        args = engine.resolve(engine_args_from_params({**params, "stream_interval": 4}))
        dep = engine.deploy(f"base-{len(rows)}", args)
        startup = time.monotonic() - t0
        t1 = time.monotonic()
        with dep:
            run_load_sync(Endpoint(dep.endpoint.base_url, dep.endpoint.model), requests,
                          timeout_s=study.workload.timeout_s)
            load = time.monotonic() - t1
        wall = time.monotonic() - t0
        rows.append({"started_s": t0 - origin, "wall_s": wall, "startup_s": startup, "load_s": load,
                     "in_trial_s": wall - startup - load})
    return rows


def orchestrated_rows(df) -> list[dict]:
    """Per trial row of the study: its start (seconds after the first) and its phase columns."""
    first = df["started_at"].min()
    return [{"started_s": (r.started_at - first).total_seconds(), "wall_s": r.wall_time_s, "startup_s": r.startup_s,
             "load_s": r.load_window_s, "in_trial_s": r.overhead_s} for r in df.itertuples()]


def one_run(trials: int, concurrency: int, requests: int) -> list[dict]:
    """A fresh local Ray: the bare loop, then the same configurations through ``run_study``."""
    import ray

    from orchestrator.cluster.connect import start_serve
    from orchestrator.results import load_trials
    from orchestrator.search.driver import run_study

    out = tempfile.mkdtemp(prefix="overhead-")
    study = parse_study(study_doc(out, trials, concurrency, requests))
    ray.init(address="local", num_cpus=4, num_gpus=study.hardware.gpus_per_node, include_dashboard=False,
             namespace="orchestrator", log_to_driver=False)
    try:
        start_serve(SERVE_PORT)
        base = baseline(study, trials, SERVE_PORT)
        run_study(study, quiet=True, serve_port=SERVE_PORT)
    finally:
        ray.shutdown()
    orch = orchestrated_rows(load_trials(f"{out}/overhead"))
    shutil.rmtree(out, ignore_errors=True)
    return ([dict(r, path=tables.BASELINE, concurrency=concurrency, trial=k) for k, r in enumerate(base)]
            + [dict(r, path=tables.ORCHESTRATED, concurrency=concurrency, trial=k) for k, r in enumerate(orch)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2], help="one run (fresh Ray) per value")
    ap.add_argument("--requests", type=int, default=150, help="measured requests per trial (at 10 req/s)")
    ap.add_argument("--out", type=Path, default=EXAMPLES / "orchestration-overhead")
    a = ap.parse_args()
    if a.trials < 2 or a.trials > len(CONFIGS) or min(a.concurrency) < 1 or max(a.concurrency) >= a.trials:
        ap.error(f"--trials must be 2..{len(CONFIGS)} and each --concurrency 1..trials-1")

    import pandas as pd
    import ray

    record = RunRecord.from_argv()
    rows = [r for c in a.concurrency for r in one_run(a.trials, c, a.requests)]
    frame = pd.DataFrame(rows)
    run = record.finish(ray=ray.__version__, trials=a.trials, requests=a.requests, concurrency=a.concurrency)
    print(f"wrote {write(a.out, {tables.PHASES_FILE: frame}, run)}")
    print(tables.overhead_table(a.out) + "\n\n" + tables.overhead_findings(a.out))


if __name__ == "__main__":
    main()
