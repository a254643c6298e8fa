"""Measured loads replayed in virtual time: the simulator against real engine numbers.

Each :class:`Point` is one measured load (a ``vllm bench serve`` run, or one level of a
capacity study's dataset) with the requests, engine arguments and real summary needed to
replay it; :func:`run` simulates every point and :func:`error_summary` says how far the
simulator is off. ``benchmarks/sim_vs_h200.py`` prints the comparison (its docstring says
how points are chosen and marked), ``benchmarks/fit_sim_h200.py`` fits the cost constants on
it and ``tests/sim/test_virtual.py`` guards the calibration with it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from orchestrator.apps.recommend import engine_args_of
from orchestrator.failures import TrialStatus
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.results import load_trials
from orchestrator.results.definition import read_study_definition
from orchestrator.results.levels import is_set, level_mark, load_levels
from orchestrator.search.trial_plan import engine_for, load_plan
from orchestrator.sim.core import SimEngineCore
from orchestrator.sim.virtual import simulate
from orchestrator.study.spec import SimEngineSpec
from orchestrator.trial.capacity import level_workload
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request

METRICS = ("req_s", "ttft_p50_ms", "tpot_p50_ms")

RECORDED_MODEL = "llama-3.1-8b"


@dataclass
class Point:
    dataset: str  # the results folder's name
    label: str
    real: dict  # METRICS (+ whatever else the source has: itl_mean_ms, tpot_mean_ms, ...)
    args: EngineArgs
    requests: RequestSet
    dtype: str = "auto"
    mark: Optional[str] = None  # None, "aborted", "overloaded" or "harness-bound"
    why: str = ""
    key: tuple = ()  # equal keys: the same simulation (two real samples of one load)
    sim: dict = field(default_factory=dict)

    def scored(self, metric: str) -> bool:
        if self.mark == "aborted":
            return False
        return not (self.mark in ("overloaded", "harness-bound") and metric == "ttft_p50_ms")

    def err(self, metric: str) -> float:
        return (self.sim[metric] - self.real[metric]) / self.real[metric]


# ---------------------------------------------------------------- sources
def _bench_requests(n: int, rate: str, seed: int, input_len: int, output_len: int, vocab: int) -> RequestSet:
    rng = np.random.default_rng(seed)
    arrivals = np.zeros(n)
    if rate != "inf":
        r = float(rate)
        arrivals = np.cumsum(rng.exponential(1.0 / r, n))
        arrivals *= (n / r) / arrivals[-1]
    reqs = tuple(Request(i, float(arrivals[i]), tuple(int(x) for x in rng.integers(10, vocab - 10, input_len)),
                         output_len) for i in range(n))
    return RequestSet(warmup=(), measured=reqs)


@functools.lru_cache(maxsize=1)
def recorded_model() -> ModelShape:
    """The model the recorded H200 trials served."""
    return ModelShape.load(RECORDED_MODEL)


def ingress_points(folder: str, gpu_name: str = "H200") -> list[Point]:
    gpu = get_gpu(gpu_name)
    model = recorded_model()
    points = []
    for path in sorted(Path(folder).glob("ingress_*.json")):
        res = json.loads(path.read_text())
        if res["mode"] == "serve_llm":
            continue  # the simulator models the engine, not ray.serve.llm's ingress
        args = EngineArgs(**res["config"]).resolved(device_memory_gib=gpu.memory_gib, device_name=gpu.name)
        for run in res["runs"]:
            n, rate, seed = int(run["completed"]), str(run["rate"]), int(run["seed"])
            real = {"req_s": run["request_throughput"], "ttft_p50_ms": run["median_ttft_ms"],
                    "tpot_p50_ms": run["median_tpot_ms"]}
            full = Path(folder) / f"{res['label']}_r{rate}_s{seed}.json"  # the bench's own file: more fields
            if full.exists():
                bench = json.loads(full.read_text())
                real.update(tpot_mean_ms=bench["mean_tpot_ms"], itl_mean_ms=bench["mean_itl_ms"],
                            itl_p50_ms=bench["median_itl_ms"], ttft_p90_ms=bench["p90_ttft_ms"])
            points.append(Point(Path(folder).name, f"{res['label']}, rate {rate}", real, args,
                                _bench_requests(n, rate, seed, 512, 128, model.vocab_size),
                                key=("ingress", json.dumps(res["config"], sort_keys=True), n, rate, seed)))
    return points


def _at_recorded_rate(rs: RequestSet, level) -> RequestSet:
    """The level's requests due at the rate the real trial sent them (its ``achieved_rate``).

    Workloads now realise their nominal rate exactly; the recorded trials drew the same gaps
    unscaled (seed 0 ran 2.5-4% fast). One factor on every due time gives those arrivals back."""
    achieved, nominal = level.get("achieved_rate"), rs.requested_rate
    if not is_set(achieved) or not nominal or len(rs.measured) < 2:
        return rs
    span = rs.measured[-1].arrival_s - rs.measured[0].arrival_s
    factor = (len(rs.measured) - 1) / float(achieved) / span if span > 0 else 1.0
    measured = tuple(dataclasses.replace(r, arrival_s=r.arrival_s * factor) for r in rs.measured)
    return dataclasses.replace(rs, measured=measured, requested_rate=float(achieved))


def study_points(path: str) -> list[Point]:
    real_study = read_study_definition(path)
    sim_study = real_study.model_copy(update={"engine": SimEngineSpec(mode="virtual")})
    engine = engine_for(sim_study)
    trials = load_trials(path, status=TrialStatus.COMPLETED.value)
    levels = load_levels(path)
    base_rate = load_plan(sim_study).requests().requested_rate
    points = []
    for _, t in trials.sort_values("trial_number").iterrows():
        args = engine.resolve(dataclasses.replace(engine_args_of(t), extra={}))
        mine = levels[levels["trial_id"] == t["trial_id"]].sort_values("level")
        ran = mine[[not is_set(v) for v in mine["stopped_early"]]]
        low_ttft = float(ran["ttft_p50_ms"].min()) if len(ran) else float("nan")
        for _, lv in mine.iterrows():
            # The level's requests as the real trial drew them. These trials ran before levels drew
            # arrivals and lengths of their own: every level replayed level 0's draw at its own rate
            # (with prompts of its own, which a fresh simulation cannot tell from level 0's).
            level_wl = level_workload(sim_study.workload, float(lv["rate"]), sim_study.capacity, base_rate)
            rs = _at_recorded_rate(load_plan(sim_study).requests(level_wl, level=0), lv)
            real = {"req_s": lv["request_throughput"], "ttft_p50_ms": lv["ttft_p50_ms"],
                    "tpot_p50_ms": lv["tpot_p50_ms"], "tpot_mean_ms": lv["tpot_mean_ms"],
                    "itl_mean_ms": lv["itl_mean_ms"], "itl_p50_ms": lv["itl_p50_ms"],
                    "ttft_p90_ms": lv["ttft_p90_ms"]}
            chunked = "" if args.enable_chunked_prefill else " nochunk"
            label = (f"S={args.max_num_seqs} B={args.max_num_batched_tokens}"
                     f"{' kv=fp8' if args.kv_cache_dtype == 'fp8' else ''}{' eager' if args.enforce_eager else ''}"
                     f"{chunked}, {lv['rate']:.1f} req/s")
            mark, why = level_mark(lv, low_ttft)
            points.append(Point(Path(path).name, label, real, args, rs, dtype=sim_study.model.dtype, mark=mark,
                                why=why, key=("study", path, str(t["trial_id"]), int(lv["level"]))))
    return points


def load_points(datasets) -> list[Point]:
    """Points of ``(kind, folder)`` datasets, ``kind`` ``ingress`` or ``study``."""
    points = []
    for kind, path in datasets:
        points += ingress_points(path) if kind == "ingress" else study_points(path)
    return points


# ---------------------------------------------------------------- simulation
def summary(records) -> dict:
    ok = [r for r in records if not r.warmup and r.success]
    start = min(r.sent_s for r in ok)
    end = max(r.end_s for r in ok)
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    itl = [x for r in ok for x in r.itl_s]
    return {"req_s": len(ok) / (end - start), "ttft_p50_ms": float(np.median([r.ttft_s for r in ok])) * 1000,
            "ttft_p90_ms": float(np.percentile([r.ttft_s for r in ok], 90)) * 1000,
            "tpot_p50_ms": float(np.median(tpot)) * 1000, "tpot_mean_ms": float(np.mean(tpot)) * 1000,
            "itl_mean_ms": float(np.mean(itl)) * 1000, "itl_p50_ms": float(np.median(itl)) * 1000}


def run(points: list[Point], gpu_name: str = "H200") -> list[Point]:
    """Simulate every point (one run per distinct key); fills ``point.sim``."""
    gpu = get_gpu(gpu_name)
    model = recorded_model()
    done: dict[tuple, dict] = {}
    for p in points:
        if p.key not in done:
            done[p.key] = summary(simulate(SimEngineCore(model, gpu, p.args, dtype=p.dtype), p.requests))
        p.sim = done[p.key]
    return points


def error_summary(points: list[Point]) -> dict[str, tuple[float, float, int]]:
    """metric -> (max |err|, median |err|, points scored)."""
    out = {}
    for m in METRICS:
        errs = [abs(p.err(m)) for p in points if p.scored(m)]
        out[m] = (max(errs), float(np.median(errs)), len(errs)) if errs else (float("nan"), float("nan"), 0)
    return out


def summary_lines(points: list[Point]) -> list[str]:
    names = {"req_s": "req/s", "ttft_p50_ms": "TTFT p50", "tpot_p50_ms": "TPOT p50"}
    lines = []
    for m, (mx, med, n) in error_summary(points).items():
        within = sum(1 for p in points if p.scored(m) and abs(p.err(m)) <= 0.10)
        lines.append(f"{names[m]}: max |err| {mx:.0%}, median {med:.0%}, within 10%: {within} of {n}")
    return lines


# ---------------------------------------------------------------- reporting
TABLE_HEADER = ("| point | req/s real / sim (err) | TTFT p50 ms real / sim (err) | TPOT p50 ms real / sim (err) |\n"
                "| --- | --- | --- | --- |")


def table_row(p: Point) -> str:
    """One markdown row of :data:`TABLE_HEADER`: real / simulated (error); cells not scored in italics."""
    def cell(m, fmt):
        text = f"{p.real[m]:{fmt}} / {p.sim[m]:{fmt}} ({p.err(m):+.0%})"
        return text if p.scored(m) else f"_{text}_"
    mark = f" [{p.mark}]" if p.mark else ""
    return f"| {p.label}{mark} | {cell('req_s', '.1f')} | {cell('ttft_p50_ms', '.0f')} | {cell('tpot_p50_ms', '.1f')} |"
