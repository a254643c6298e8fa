"""Search efficiency: trials each sampler needs to reach 95% of the grid optimum.

Each landscape is a study (model x GPU x workload x space) scored with the virtual-time
simulator through the trial path itself (``execute_trial`` with ``engine.mode: virtual``).
Every grid point is measured once (cached: the simulator is deterministic for a given
configuration, which is checked); the optimum is the highest ``goodput`` among grid
points that meet every SLO. Each sampler then drives Optuna directly, exactly as the
study driver does (``make_sampler``, ``propose`` through ``ask_distinct``, ``tell_report``),
and the benchmark counts the measured trials until one meets the SLOs with goodput
>= 95% of the optimum (a proposal that repeats a measured configuration is answered
from it, as in a real study, and does not count). Median over seeds, for every sampler,
with the random and grid samplers of the same run as baselines.

    python benchmarks/search_efficiency.py [--seeds 10] [--samplers tpe,nsga2,gp,random,grid]
        [--landscapes NAME,...] [--jobs 2] [--cache DIR] [--markdown FILE] [--output DIR]

Target: the default sampler (tpe) needs <= 15% of the grid's trials.

``--output results/examples/search-efficiency`` stores the dataset docs/benchmarks.md's table and
figures are generated from (:mod:`orchestrator.doc_tables.search_efficiency`): every grid point
measured, every search's trial count, and the run (``run.json``).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas as pd  # noqa: E402

import dataset  # noqa: E402

TARGET = 0.95
DEFAULT_SAMPLER = "tpe"
BUDGET = 64  # the budget.trials the studies declare (sets the samplers' start-up defaults)

def closed_loop(clients: int, n: int, input_len: dict, output_len: dict, **extra) -> dict:
    """``clients`` users each sending the next request when the last one finished: how much a
    configuration serves, and how fast, both show (an open-loop rate caps goodput at the rate)."""
    return {"arrival": {"kind": "concurrency", "concurrency": clients}, "num_requests": n, "warmup_requests": 0,
            "input_len": input_len, "output_len": output_len, **extra}


CHAT_IN = {"kind": "lognormal", "mean": 900, "sigma": 0.8, "min": 32, "max": 6000}
CHAT_OUT = {"kind": "uniform", "min": 64, "max": 320}

LANDSCAPES: dict[str, dict[str, Any]] = {
    "llama8b-h100-chat": {
        "model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 1},
        "workload": closed_loop(96, 160, CHAT_IN, CHAT_OUT),
        "space": {"max_num_seqs": [4, 8, 16, 32, 64, 128, 256],
                  "max_num_batched_tokens": [256, 512, 1024, 2048, 4096, 8192],
                  "gpu_memory_utilization": {"type": "float", "low": 0.2, "high": 0.9, "step": 0.1},
                  "kv_cache_dtype": ["auto", "fp8"]},
        "constraints": ["ttft_p99_ms <= 3000", "tpot_p50_ms <= 30"],
    },
    "llama8b-l4-rag": {
        "model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "L4", "gpus_per_node": 1},
        "workload": closed_loop(12, 100, {"kind": "lognormal", "mean": 2500, "sigma": 0.5, "min": 256, "max": 12000},
                                {"kind": "uniform", "min": 32, "max": 192},
                                shared_prefix={"groups": 4, "length": 1024, "fraction": 0.7}),
        "space": {"max_num_seqs": [2, 4, 8, 16, 32, 64], "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192],
                  "gpu_memory_utilization": {"type": "float", "low": 0.75, "high": 0.95, "step": 0.05},
                  "max_model_len": [16384, 32768], "enable_prefix_caching": [True, False]},
        "constraints": ["ttft_p99_ms <= 20000", "tpot_p50_ms <= 250"],
    },
    "qwen7b-a100-batch": {
        "model": {"name": "qwen2.5-7b"}, "hardware": {"gpu": "A100-40GB", "gpus_per_node": 1},
        "workload": closed_loop(128, 160, {"kind": "uniform", "min": 200, "max": 1200},
                                {"kind": "uniform", "min": 128, "max": 384}),
        "space": {"max_num_seqs": [8, 16, 32, 64, 128, 256, 512],
                  "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192],
                  "gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 0.9, "step": 0.1},
                  "kv_cache_dtype": ["auto", "fp8"]},
        "constraints": ["tpot_p50_ms <= 60", "ttft_p99_ms <= 15000"],
    },
    "llama70b-h100x8-chat": {
        "model": {"name": "llama-3.1-70b"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8},
        "workload": closed_loop(64, 120, CHAT_IN, CHAT_OUT),
        "space": {"tensor_parallel_size": [1, 2, 4, 8], "max_num_seqs": [8, 16, 32, 64, 128, 256],
                  "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192],
                  "gpu_memory_utilization": {"type": "float", "low": 0.75, "high": 0.95, "step": 0.05}},
        "constraints": ["ttft_p99_ms <= 5000", "tpot_p50_ms <= 40"],
    },
}


def landscape_study(name: str, *, sampler: str = DEFAULT_SAMPLER, seed: int = 0):
    from orchestrator.study.spec import parse_study

    spec = copy.deepcopy(LANDSCAPES[name])
    doc = {"name": name, "seed": 0, "engine": {"kind": "sim", "mode": "virtual"},
           "objectives": ["maximize goodput"], "search": {"sampler": sampler, "seed": seed},
           "budget": {"trials": BUDGET}, **spec}
    return parse_study(doc)


def key(params: dict[str, Any]) -> tuple:
    """Grid points and sampled points compare equal (Optuna's stepped floats carry noise)."""
    return tuple(sorted((k, round(v, 6) if isinstance(v, float) else v) for k, v in params.items()))


# ------------------------------------------------------------------ measuring the grid
@dataclass(frozen=True)
class Point:
    values: tuple[float, ...]
    constraints: dict[str, float]
    status: str
    goodput: float

    @property
    def feasible(self) -> bool:
        return self.status == "completed" and all(v <= 0 for v in self.constraints.values())


def measure(name: str, params: dict[str, Any]) -> Point:
    from orchestrator.search.trial_plan import judge_result, run_trial
    from orchestrator.trial.run import TrialContext

    study = landscape_study(name)
    result = run_trial(study, params, trial_id="bench", trial_number=0, ctx=TrialContext(run_id="bench"))
    verdict = judge_result(study, result)
    goodput = result.metrics.goodput if result.metrics is not None else 0.0
    return Point(tuple(verdict.optuna_values()), verdict.optuna_constraints(), result.status.value,
                 float(goodput or 0.0))


def _measure_many(args) -> list[tuple[tuple, Point]]:
    name, chunk = args
    return [(key(p), measure(name, p)) for p in chunk]


def code_version() -> str:
    """Hash of the package's source: any change to what a measurement runs invalidates the cache."""
    package = Path(__file__).resolve().parents[1] / "orchestrator"
    h = hashlib.sha256()
    for f in sorted(package.rglob("*.py")):
        h.update(str(f.relative_to(package)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def measure_grid(name: str, jobs: int, cache: Optional[Path]) -> tuple[dict[tuple, Point], Optional[float]]:
    """Every grid point measured, and the seconds that took (None: read from the cache)."""
    study = landscape_study(name)
    grid = study.space.grid()
    # Keyed by the study and the code that measures it: a changed simulator is a new landscape.
    tag = hashlib.sha256(json.dumps([study.fingerprint(), len(grid), code_version()]).encode()).hexdigest()[:12]
    path = cache / f"{name}-{tag}.json" if cache else None
    if path is not None and path.is_file():
        return {key(params): Point(tuple(v), c, st, g) for params, v, c, st, g in json.loads(path.read_text())}, None
    chunks = [grid[i::jobs * 8] for i in range(jobs * 8)]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        points = dict(kv for part in pool.map(_measure_many, [(name, c) for c in chunks]) for kv in part)
    seconds = time.monotonic() - t0
    print(f"  {name}: measured {len(points)} grid points in {seconds:.0f} s", file=sys.stderr)
    # The cache is only sound if a configuration always measures the same: check a few.
    for p in grid[:: max(1, len(grid) // 3)][:3]:
        assert measure(name, p) == points[key(p)], f"{name}: the virtual simulator is not deterministic at {p}"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([[dict(k), list(p.values), p.constraints, p.status, p.goodput]
                                    for k, p in points.items()]))
    return points, seconds


# ------------------------------------------------------------------ one search
def trials_to_target(name: str, sampler: str, seed: int, points: dict[tuple, Point], goal: float,
                     cap: int) -> int:
    """Measured trials until a point meets the SLOs with goodput >= goal; ``cap + 1`` if never."""
    import optuna

    from orchestrator.search.optuna_search import SamplerReport, ask_distinct, tell_report
    from orchestrator.search.samplers import make_sampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = landscape_study(name, sampler=sampler, seed=seed)
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study, concurrent=False))
    measured = 0
    while measured < cap:
        trial, params = ask_distinct(ostudy, study.space)
        if "duplicate_of" in trial.user_attrs:  # the space ran out: every new proposal repeats
            break
        p = points[key(params)]
        tell_report(ostudy, trial, SamplerReport(tuple(p.values), dict(p.constraints)))
        measured += 1
        if p.feasible and p.goodput >= goal:
            return measured
    return cap + 1


def _search(args) -> tuple[str, str, int, int]:
    name, sampler, seed, points, goal, cap = args
    return name, sampler, seed, trials_to_target(name, sampler, seed, points, goal, cap)


# ------------------------------------------------------------------ report
def grid_frame(landscapes: dict[str, dict[tuple, Point]]) -> pd.DataFrame:
    """One row per measured grid point: what the optimum and the points near it are computed from."""
    return pd.DataFrame([{"landscape": name, "config": json.dumps(dict(k), sort_keys=True), "status": p.status,
                          "feasible": p.feasible, "goodput": p.goodput}
                         for name, points in landscapes.items() for k, p in points.items()])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--samplers", default="tpe,nsga2,gp,random,grid")
    ap.add_argument("--landscapes", default=",".join(LANDSCAPES))
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    ap.add_argument("--cache", default=os.environ.get("SEARCH_BENCH_CACHE",
                                                      str(Path.home() / ".cache" / "orchestrator-bench")),
                    help="where measured grids are kept between runs ('' for none)")
    ap.add_argument("--gp-cap", type=float, default=0.25,
                    help="GP runs stop at this share of the grid (about a second per proposal)")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--output", type=Path, help="write the dataset here (grid.parquet, searches.parquet, run.json)")
    args = ap.parse_args(argv)
    samplers = args.samplers.split(",")
    names = args.landscapes.split(",")
    unknown = sorted(set(names) - set(LANDSCAPES))
    if unknown:
        ap.error(f"no landscape {', '.join(unknown)} (known: {', '.join(LANDSCAPES)})")
    cache = Path(args.cache) if args.cache else None

    from orchestrator.doc_tables import search_efficiency as tables

    record = dataset.RunRecord.for_script("search_efficiency.py", sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    grids: dict[str, dict[tuple, Point]] = {}
    grid_seconds: dict[str, Optional[float]] = {}
    caps: dict[str, int] = {}
    goals: dict[str, float] = {}
    for name in names:
        points, seconds = measure_grid(name, args.jobs, cache)
        grids[name], grid_seconds[name] = points, None if seconds is None else round(seconds, 1)
        best = max((p.goodput for p in points.values() if p.feasible), default=0.0)
        goals[name] = TARGET * best
        caps[name] = len(points)
        print(f"  {name}: {len(points)} points, {sum(p.status == 'completed' for p in points.values())} start, "
              f"{sum(p.feasible for p in points.values())} meet the SLOs, best goodput {best:.2f} req/s, "
              f"{sum(p.feasible and p.goodput >= goals[name] for p in points.values())} within {TARGET:.0%} of it",
              file=sys.stderr)

    def cap_of(name: str, sampler: str) -> int:
        return caps[name] if sampler != "gp" else max(10, int(args.gp_cap * caps[name]))

    tasks = [(name, sampler, seed, grids[name], goals[name], cap_of(name, sampler))
             for name in names for sampler in samplers for seed in range(args.seeds)]
    t1 = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        found = list(pool.map(_search, tasks, chunksize=1))
    sampling = time.monotonic() - t1
    searches = pd.DataFrame([{"landscape": name, "sampler": sampler, "seed": seed, "trials": n,
                              "cap": cap_of(name, sampler)} for name, sampler, seed, n in found])
    grid = grid_frame(grids)
    run = record.finish(**{"seeds": args.seeds, "samplers": samplers, "target": TARGET, "default_sampler": DEFAULT_SAMPLER,
           "gp_cap": args.gp_cap, "jobs": args.jobs, "grid_seconds": grid_seconds,
           "sampling_seconds": round(sampling, 1), "seconds": round(time.monotonic() - t0, 1)})
    text = tables.table(grid, searches, run)
    print(text)
    print(f"{args.seeds} seeds per sampler; {time.monotonic() - t0:.0f} s")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.output:
        print(f"wrote {dataset.write(args.output, {tables.GRID_FILE: grid, tables.SEARCHES_FILE: searches}, run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
