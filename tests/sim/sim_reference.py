"""The H200 reference scenarios (docs/simulator.md, "Calibration") as simulator runs.

The cold runs' measured numbers are read from their dataset (``results/examples/h200-cold-runs``,
through :mod:`orchestrator.apps.cold_runs`, which also replays them); the warm runs' from the
``vllm bench serve`` files of ``results/examples/h200-ingress``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from orchestrator.apps.cold_runs import engine, load_cold_runs, simulate_offline, simulate_online, summarize, workload
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.core import SimEngineCore
from orchestrator.sim.virtual import simulate

__all__ = ["COLD", "ONLINE", "OFFLINE", "WARM_RUNS", "engine", "workload", "summarize", "run_online", "run_offline",
           "warm_point", "run_warm"]

COLD = load_cold_runs()
# Cold runs: a fresh `vllm serve` per configuration, measured without a warm-up.
# (rate req/s, max_num_seqs, N) -> (TTFT p50 ms, TPOT p50 ms, output tok/s)
ONLINE = {r.key: (r.ttft_p50_ms, r.tpot_p50_ms, r.output_tok_s) for r in COLD.online}
# max_num_seqs -> output tok/s of LLM.generate over the run's prompts
OFFLINE = {r.max_num_seqs: r.output_tok_s for r in COLD.offline}
_ONLINE_RUNS = {r.key: r for r in COLD.online}
_OFFLINE_RUNS = {r.max_num_seqs: r for r in COLD.offline}


def run_online(rate: int, seqs: int, n: int, seed: int = 0, calibration=None) -> dict:
    return simulate_online(COLD.setup, _ONLINE_RUNS[(rate, seqs, n)], seed, calibration)


def run_offline(seqs: int, calibration=None) -> dict:
    return simulate_offline(COLD.setup, _OFFLINE_RUNS[seqs], calibration)


# Warm runs on fresh prompts (docs/simulator.md, "Against warm engine-side measurements"):
# `vllm bench serve` result files, read where they live. `bare` (plain `vllm serve`) and `engine`
# (the product's ingress) reach the same engine: two samples of each load.
WARM_DIR = Path(__file__).resolve().parents[2] / "results" / "examples" / "h200-ingress"
WARM_RUNS = ("bare_r40_s1001", "bare_rinf_s1002", "engine_r40_s1001", "engine_rinf_s1002")


def warm_point(name: str) -> tuple[dict, dict]:
    """(the bench result, the engine config of its ingress summary) of one warm run."""
    res = json.loads((WARM_DIR / f"{name}.json").read_text())
    res["seed"] = int(name.rsplit("_s", 1)[1])  # the file name holds the bench's --seed
    label = name.split("_")[0]
    config = json.loads((WARM_DIR / f"ingress_{label}.json").read_text())["config"]
    return res, config


def run_warm(name: str) -> dict:
    """Replay one warm run in virtual time: same request count, lengths, rate and seed."""
    res, config = warm_point(name)
    n = int(res["num_prompts"])
    rate = None if str(res["request_rate"]) == "inf" else float(res["request_rate"])
    gpu = get_gpu("H200")
    args = EngineArgs(**config).resolved(device_memory_gib=gpu.memory_gib, device_name=gpu.name)
    core = SimEngineCore(ModelShape.load("llama-3.1-8b"), gpu, args)
    reqs = workload(n, rate, seed=res["seed"], prompt_len=res["total_input_tokens"] // n,
                    output_len=res["total_output_tokens"] // int(res["completed"]))
    recs = [r for r in simulate(core, reqs) if r.success]
    start = min(r.sent_s for r in recs)  # `vllm bench serve`: completed / (last end - start)
    return {"req_s": len(recs) / (max(r.end_s for r in recs) - start),
            "ttft_p50_ms": float(np.median([r.ttft_s for r in recs])) * 1000,
            "tpot_p50_ms": float(np.median([r.tpot_s for r in recs if r.tpot_s is not None])) * 1000,
            "tpot_mean_ms": float(np.mean([r.tpot_s for r in recs if r.tpot_s is not None])) * 1000}
