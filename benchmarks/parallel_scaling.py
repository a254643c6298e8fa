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
the CPU seconds per trial and the share of the machine's cores they kept busy, counted in a
cpuacct cgroup holding this process and all it starts (else the whole machine's counters).

Stores every trial's row (``trials.parquet``) and the run record (``run.json``: command, date,
cores, load average before and after, each N's wall time, CPU and GPU peaks) in
results/examples/parallel-scaling; the docs' table and text are computed from them
(``orchestrator/doc_tables/scaling.py``).

    python benchmarks/parallel_scaling.py [--gpus 1,2,4,8] [--trials 8] [--tp 1] [--load-s 30]
        [--startup-s 10] [--port 8390] [--out DIR]

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

from dataset import EXAMPLES, RunRecord, write  # noqa: E402

from orchestrator.doc_tables import scaling as tables  # noqa: E402

GPUS_PER_NODE = 4
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")


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


class CpuCounter:
    """CPU seconds of this process and everything it starts (a cpuacct cgroup it joins; Linux, root),
    else of the whole machine (which counts other work too): the machine may be shared."""

    def __init__(self) -> None:
        self.group = CGROUP_ROOT / f"parallel-scaling-{os.getpid()}"
        self.own = os.access(CGROUP_ROOT, os.W_OK)
        if self.own:
            self.group.mkdir(exist_ok=True)
            (self.group / "cgroup.procs").write_text(str(os.getpid()))  # children (Ray's processes) inherit it

    def seconds(self) -> float:
        if self.own:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        import psutil

        t = psutil.cpu_times()
        return t.user + t.system + t.nice

    def close(self) -> None:
        if self.own:  # back to the root group, so the empty one can go
            (CGROUP_ROOT / "cgroup.procs").write_text(str(os.getpid()))
            time.sleep(1.0)  # Ray's processes are gone by now; a straggler keeps the group (harmless)
            try:
                self.group.rmdir()
            except OSError:
                pass


def run_one(gpus: int, args, out: str, cpu: CpuCounter) -> tuple[dict, list[dict]]:
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
        cpu0, t0 = cpu.seconds(), time.monotonic()
        run = run_study(study, quiet=True, serve_port=args.port)
        wall = time.monotonic() - t0
        cpu1 = cpu.seconds()
    finally:
        ray.shutdown()
        c.shutdown()
    trials = load_trials(run.study_dir)
    rows = [{"gpus": gpus, "trial_id": r.trial_id, "status": str(r.status), "wall_time_s": float(r.wall_time_s),
             "startup_s": float(r.startup_s), "load_window_s": float(r.load_window_s),
             "queue_s": 0.0 if r.queue_s != r.queue_s or r.queue_s is None else float(r.queue_s)}
            for r in trials.itertuples()]
    return {"gpus": gpus, "wall_s": wall, "cpu_s": cpu1 - cpu0,
            "peaks": [[int(u), int(t)] for u, t in run.gpu_peaks.values()]}, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="1,2,4,8")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--tp", default="1")
    ap.add_argument("--load-s", type=float, default=30.0, help="simulated load window per trial")
    ap.add_argument("--startup-s", type=float, default=10.0, help="simulated engine start per trial")
    ap.add_argument("--port", type=int, default=8390)
    ap.add_argument("--out", type=Path, default=EXAMPLES / "parallel-scaling",
                    help="the dataset's folder (TP 1 only: the docs' table)")
    args = ap.parse_args(argv)
    gpus = [int(x) for x in args.gpus.split(",")]
    if 1 not in gpus:
        ap.error("--gpus must include 1 (the speed-up's baseline)")

    import pandas as pd

    record, cpu = RunRecord.from_argv(), CpuCounter()
    runs, trials = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in gpus:
            r, rows = run_one(n, args, f"{tmp}/out-{n}", cpu)
            runs.append(r)
            trials += rows
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}),
                  file=sys.stderr, flush=True)
    cpu.close()
    frame = pd.DataFrame(trials)
    run = record.finish(runs=runs, trials=args.trials, tp=args.tp, load_s=args.load_s, startup_s=args.startup_s,
                        gpus_per_node=GPUS_PER_NODE, cpu_counted="cgroup" if cpu.own else "machine")
    print(f"wrote {write(args.out, {tables.TRIALS_FILE: frame}, run)}")
    print(tables.scaling_table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
