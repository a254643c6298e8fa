"""Parallel scaling: study wall time against the number of (fake) GPUs, on a multi-node local Ray.

For each N, a fresh ``ray.cluster_utils.Cluster`` (a head without GPUs, then worker nodes
of up to 4 logical GPUs: N=8 is two nodes) runs the same study of the served simulator:
T trials, N at a time. Speed-up(N) = wall(1) / wall(N); the target is >= 0.9 N.

A served trial is real processes and real HTTP; on a small machine the CPU, not the
(simulated) GPUs, is what runs out. So each trial's work is made of simulated time: a
simulated engine start (``engine.startup_s``), a low request rate and slow simulated
steps (``engine.calibration.slowdown``), so the trial mostly sleeps, as a real trial
mostly waits on its GPU. What is left on the CPU (a replica process start per trial, the
trial process, Serve's controller, the load generator) is reported next to the result:
the machine's busy share during each run and the CPU seconds per trial.

    python benchmarks/parallel_scaling.py [--gpus 1,2,4,8] [--trials 8] [--tp 1] [--load-s 30]
        [--startup-s 10] [--port 8390] [--markdown FILE]

``--tp 1,2,4`` mixes tensor-parallel sizes (packing); the scaling table uses TP 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GPUS_PER_NODE = 4


def study_for(out: str, *, gpus: int, trials: int, tps: list[int], load_s: float, startup_s: float):
    from orchestrator.study.spec import parse_study

    rate = 1.0
    n = max(2, int(load_s * rate))
    seqs = [8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384]
    space = {"max_num_seqs": seqs[: max(1, math.ceil(trials / len(tps)))]}
    if len(tps) > 1:
        space["tensor_parallel_size"] = tps
    return parse_study({
        "name": f"scaling-{gpus}",
        "seed": 0,
        # slowdown 40: ~0.3 s per simulated decode step at low load; 16 output tokens ~ 5 s per request.
        "engine": {"kind": "sim", "startup_s": startup_s, "start_timeout_s": 600,
                   "calibration": {"slowdown": 40}},
        "model": {"name": "llama-3.1-8b"},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": min(GPUS_PER_NODE, gpus),
                     "nodes": math.ceil(gpus / GPUS_PER_NODE)},
        "workload": {"arrival": {"kind": "constant", "rate": rate}, "num_requests": n, "warmup_requests": 0,
                     "input_len": 128, "output_len": 16, "timeout_s": 600},
        "space": space,
        "objectives": ["maximize output_throughput_per_gpu"],
        "search": {"sampler": "grid"},
        "budget": {"trials": trials, "max_concurrent_trials": gpus},
        "output": out,
    })


def run_one(gpus: int, args, out: str) -> dict:
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.results import load_trials
    from orchestrator.search.driver import run_study

    tps = [int(x) for x in args.tp.split(",")]
    study = study_for(out, gpus=gpus, trials=args.trials, tps=tps, load_s=args.load_s, startup_s=args.startup_s)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 0, "include_dashboard": False})
    left = gpus
    while left > 0:
        c.add_node(num_cpus=4, num_gpus=min(GPUS_PER_NODE, left))
        left -= GPUS_PER_NODE
    ray.init(address=c.address, namespace="orchestrator", logging_level="ERROR")
    try:
        cpu0, t0 = psutil.cpu_times(), time.monotonic()
        run = run_study(study, quiet=True, serve_port=args.port)
        wall = time.monotonic() - t0
        cpu1 = psutil.cpu_times()
    finally:
        ray.shutdown()
        c.shutdown()
    busy = (cpu1.user + cpu1.system + cpu1.nice - cpu0.user - cpu0.system - cpu0.nice)
    trials = load_trials(run.study_dir)
    ok = trials[trials["status"] == "completed"]
    return {
        "gpus": gpus, "wall_s": wall, "trials": len(trials), "completed": len(ok),
        "trial_s": float(trials["wall_time_s"].mean()), "startup_s": float(ok["startup_s"].mean()),
        "load_s": float(ok["load_window_s"].mean()), "queue_s": float(trials["queue_s"].fillna(0).mean()),
        "cpu_s_per_trial": busy / max(1, len(trials)), "busy": busy / (wall * (os.cpu_count() or 1)),
        "peaks": run.gpu_peaks,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="1,2,4,8")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--tp", default="1")
    ap.add_argument("--load-s", type=float, default=30.0, help="simulated load window per trial")
    ap.add_argument("--startup-s", type=float, default=10.0, help="simulated engine start per trial")
    ap.add_argument("--port", type=int, default=8390)
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.gpus.split(",")]:
            r = run_one(n, args, f"{tmp}/out-{n}")
            rows.append(r)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}),
                  file=sys.stderr, flush=True)
    base = next((r for r in rows if r["gpus"] == 1), rows[0])
    lines = ["| GPUs | trials | wall s | speed-up | target 0.9 N | efficiency | trial s (start + load) | "
             "CPU s / trial | machine busy | most GPUs leased per node |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        speed = base["wall_s"] * (base["gpus"] / base["gpus"]) / r["wall_s"]
        peaks = ", ".join(f"{u}/{t}" for u, t in r["peaks"].values())
        lines.append(f"| {r['gpus']} | {r['completed']}/{r['trials']} | {r['wall_s']:.0f} | {speed:.2f} | "
                     f"{0.9 * r['gpus']:.1f} | {speed / r['gpus']:.0%} | {r['trial_s']:.0f} ({r['startup_s']:.0f} + "
                     f"{r['load_s']:.0f}) | {r['cpu_s_per_trial']:.1f} | {r['busy']:.0%} | {peaks} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
