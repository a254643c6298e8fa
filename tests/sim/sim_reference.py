"""The H200 reference scenarios (docs/simulator.md, "Calibration") as simulator runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.core import SimEngineCore
from orchestrator.sim.virtual import simulate
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request

# Cold runs: a fresh `vllm serve` per configuration, measured without a warm-up.
# (rate req/s, max_num_seqs, N) -> (TTFT p50 ms, TPOT p50 ms, output tok/s)
ONLINE = {
    (16, 16, 320): (149.5, 6.87, 1954),
    (16, 256, 320): (54.4, 7.61, 1977),
    (64, 16, 640): (12525, 6.37, 2356),
    (64, 256, 640): (857, 34.9, 6482),
}
# max_num_seqs -> output tok/s of LLM.generate over 256 prompts
OFFLINE = {16: 2328, 256: 6705}


def workload(n: int, rate: float | None, seed: int = 0, prompt_len: int = 512, output_len: int = 128,
             vocab: int = 128256) -> RequestSet:
    rng = np.random.default_rng(seed)
    arrivals = np.zeros(n)
    if rate is not None:  # as `vllm bench serve`: Poisson delays rescaled so the last is sent at n / rate
        arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
        arrivals *= (n / rate) / arrivals[-1]
    reqs = tuple(Request(i, float(arrivals[i]), tuple(int(x) for x in rng.integers(0, vocab, prompt_len)), output_len)
                 for i in range(n))
    return RequestSet(warmup=(), measured=reqs)


def engine(max_num_seqs: int, server: bool = True, calibration=None, **kw) -> SimEngineCore:
    gpu = get_gpu("H200")
    args = EngineArgs(gpu_memory_utilization=0.9, max_model_len=4096, max_num_seqs=max_num_seqs, **kw).resolved(
        device_memory_gib=gpu.memory_gib, device_name=gpu.name, server=server)
    return SimEngineCore(ModelShape.load("llama-3.1-8b"), gpu, args, calibration)


def summarize(records) -> dict:
    recs = [r for r in records if not r.warmup and r.success]
    ttft = np.array([r.ttft_s for r in recs]) * 1000
    tpot = np.array([r.tpot_s for r in recs if r.tpot_s is not None]) * 1000
    start = 0.0  # the benchmark's clock starts with the load window
    end = max(r.end_s for r in recs)
    out_tokens = sum(r.output_tokens for r in recs)
    return {"ttft_p50_ms": float(np.median(ttft)), "tpot_p50_ms": float(np.median(tpot)),
            "output_tok_s": out_tokens / (end - start), "req_s": len(recs) / (end - start)}


def run_online(rate: int, seqs: int, n: int, seed: int = 0, calibration=None) -> dict:
    return summarize(simulate(engine(seqs, calibration=calibration), workload(n, rate, seed)))


def run_offline(seqs: int, calibration=None) -> dict:
    return summarize(simulate(engine(seqs, server=False, calibration=calibration), workload(256, None)))


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
