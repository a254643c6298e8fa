"""Fit the simulator's step-time constants to every warm H200 measurement at once.

The points are those of ``benchmarks/sim_vs_h200.py all`` (the ingress runs, the bare
``vllm serve`` capacity reference and the capacity study; aborted levels out, the TTFT of
overloaded ones out) plus the six cold runs of ``results/examples/h200-cold-runs`` at a lower
weight, so the earlier calibration points stay in view. The loss is the weighted sum of
squared log errors of request throughput, TTFT p50 and TPOT p50 (cold runs: output tok/s,
TPOT p50, TTFT p50 where a queue does not dominate it). Constants are searched in log space
within physical bounds (Nelder-Mead from the given start), then printed with the
before/after error tables.

    python benchmarks/fit_sim_h200.py                 # before/after tables at the constants in sim/cost.py
    python benchmarks/fit_sim_h200.py --fit --maxiter 400 --jobs 8

``--set NAME=VALUE`` evaluates other constants without fitting (several allowed);
``--fit`` starts from ``--set`` values when given. The fitted values are written to
sim/cost.py by hand (rounded), and the tables reprinted without ``--fit`` from there.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "sim"))

import sim_vs_h200 as svh  # noqa: E402

import orchestrator.sim.cost as cost  # noqa: E402

# name -> (lower, upper): what the fit may move, in the units of sim/cost.py.
PARAMS = {
    "GEMM_EFFICIENCY": (0.35, 0.85),  # of dense bf16 peak: cuBLAS reaches ~0.7-0.8 on tall GEMMs
    "GEMM_HALF_ROWS": (4.0, 400.0),
    "HBM_EFFICIENCY": (0.6, 0.95),
    "FP8_KV_READ_EFFICIENCY": (0.05, 0.95),
    # At most what the cold 16-sequence runs leave: their decode steps take 6.4-6.9 ms (TPOT p50),
    # of which streaming the weights is ~3.9 ms. Unbounded, the fit trades them for the study's levels.
    "STEP_OVERHEAD_S": (0.1e-3, 2.5e-3),
    "NOGRAPH_LAYER_S": (20e-6, 1000e-6),
    "EAGER_LAYER_S": (20e-6, 1000e-6),
    "FRONTEND_LATENCY_S": (2e-3, 50e-3),
    # Measured, not free: one step's tokens reach the client ~50-55 us apart (the capacity
    # reference's per-token times), and `vllm bench serve` saw at most 12.9-14.0k tokens/s.
    "FRONTEND_TOKEN_S": (20e-6, 80e-6),
}
COLD_WEIGHT = 0.25
COLD_TTFT = {(16, 256, 320), (64, 16, 640)}  # the cold runs whose TTFT the tests hold tight (no swinging queue)


def current() -> dict[str, float]:
    return {k: float(getattr(cost, k)) for k in PARAMS}


def apply(values: dict[str, float]) -> None:
    for k, v in values.items():
        setattr(cost, k, v)


def _cold_specs() -> list[tuple]:
    import sim_reference as ref

    return [("online", key) for key in ref.ONLINE] + [("offline", seqs) for seqs in ref.OFFLINE]


def cold_runs(sims: list[dict]) -> list[dict]:
    """The six cold runs (docs/simulator.md, "Calibration against real vLLM") with their simulations
    (``sims``, in :func:`_cold_specs` order)."""
    import sim_reference as ref

    out = []
    for (kind, key), sim in zip(_cold_specs(), sims):
        if kind == "online":
            (rate, seqs, _n), (ttft, tpot, tok) = key, ref.ONLINE[key]
            real = {"output_tok_s": tok, "tpot_p50_ms": tpot, "ttft_p50_ms": ttft}
            metrics = ["output_tok_s", "tpot_p50_ms"] + (["ttft_p50_ms"] if key in COLD_TTFT else [])
            out.append({"label": f"cold, {rate} req/s, max_num_seqs {seqs}", "real": real, "sim": sim,
                        "scored": metrics})
        else:
            out.append({"label": f"cold, offline, max_num_seqs {key}", "real": {"output_tok_s": ref.OFFLINE[key]},
                        "sim": sim, "scored": ["output_tok_s"]})
    return out


_POINTS: dict = {}  # key -> a point with that simulation; set before the worker pool forks


def _simulate(task) -> dict:
    """One simulation at the task's constants: ("point", a point's key) or a cold run."""
    import sim_reference as ref

    values, kind, key = task
    apply(values)
    if kind == "point":
        return svh.run([_POINTS[key]])[0].sim
    return ref.run_online(*key) if kind == "online" else ref.run_offline(key)


def share_points(points) -> None:
    _POINTS.update({p.key: p for p in points})


def evaluate(points, values: dict[str, float], pool=None) -> tuple[float, list[dict]]:
    """(loss, cold runs) at ``values``; fills every point's ``sim`` (one simulation per distinct
    key, spread over ``pool``'s processes when given: they must have forked after
    :func:`share_points` saw these points)."""
    keys = list(dict.fromkeys(p.key for p in points))
    tasks = [(values, "point", k) for k in keys] + [(values, kind, key) for kind, key in _cold_specs()]
    saved = current()
    try:
        if pool is None:
            share_points(points)
            sims = [_simulate(t) for t in tasks]
        else:
            sims = pool.map(_simulate, tasks, chunksize=1)
    finally:
        apply(saved)
    by_key = dict(zip(keys, sims))
    for p in points:
        p.sim = dict(by_key[p.key])
    cold = cold_runs(sims[len(keys):])
    loss = 0.0
    for p in points:
        for m in svh.METRICS:
            if p.scored(m):
                loss += math.log(p.sim[m] / p.real[m]) ** 2
    for c in cold:
        for m in c["scored"]:
            loss += COLD_WEIGHT * math.log(c["sim"][m] / c["real"][m]) ** 2
    return loss, cold


def print_tables(points, cold, title: str) -> None:
    print(f"\n## {title}")
    svh.report(points)
    print("\nCold runs (sim / real, error):")
    for c in cold:
        cells = ", ".join(f"{m} {c['sim'][m]:.4g} / {c['real'][m]:.4g} ({c['sim'][m] / c['real'][m] - 1:+.0%})"
                          for m in c["real"])
        print(f"  {c['label']}: {cells}")


def fit(points, start: dict[str, float], names: list[str], maxiter: int, pool=None) -> dict[str, float]:
    from scipy.optimize import minimize

    lo = np.log([PARAMS[k][0] for k in names])
    hi = np.log([PARAMS[k][1] for k in names])
    x0 = np.clip(np.log([start[k] for k in names]), lo, hi)
    calls = [0]
    best = [math.inf, None]
    t0 = time.time()

    def f(x):
        x = np.clip(x, lo, hi)
        values = {**start, **dict(zip(names, np.exp(x)))}
        loss, _ = evaluate(points, values, pool)
        calls[0] += 1
        if loss < best[0]:
            best[0], best[1] = loss, values
            shown = " ".join(f"{k}={values[k]:.4g}" for k in names)
            print(f"[{calls[0]} {time.time() - t0:.0f}s] loss {loss:.4f} {shown}", flush=True)
        return loss

    minimize(f, x0, method="Nelder-Mead",
             options={"maxiter": maxiter, "maxfev": maxiter, "xatol": 0.01, "fatol": 1e-4, "adaptive": True})
    return best[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", action="store_true", help="fit the constants (else: evaluate and print)")
    p.add_argument("--maxiter", type=int, default=300)
    p.add_argument("--only", default=",".join(PARAMS), help="comma-separated constants the fit may move")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--jobs", type=int, default=1, help="simulations run in parallel (processes)")
    a = p.parse_args()
    points = svh.load_points(svh.DATASETS)
    share_points(points)
    pool = None
    if a.jobs > 1:
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(a.jobs)  # forks after share_points: workers see the points
    start = current()
    start.update({k: float(v) for k, v in (s.split("=", 1) for s in a.set)})
    loss, cold = evaluate(points, start, pool)
    print("constants: " + ", ".join(f"{k}={v:.4g}" for k, v in start.items()) + f"; loss {loss:.4f}")
    if not a.fit:
        print_tables(points, cold, "Simulator vs warm H200 measurements")
        return
    before = [dict(p.sim) for p in points]
    scored = [pt for pt in points if pt.mark != "aborted"]  # aborted levels carry no weight: skip them
    fitted = fit(scored, start, [k for k in a.only.split(",") if k], a.maxiter, pool)
    for pt, sim in zip(points, before):
        pt.sim = sim
    print_tables(points, cold, "Before (start constants)")
    loss, cold = evaluate(points, fitted, pool)
    print_tables(points, cold, "After (fitted constants)")
    print("\nfitted: " + ", ".join(f"{k}={v:.4g}" for k, v in fitted.items()) + f"; loss {loss:.4f}")


if __name__ == "__main__":
    main()
