"""The simulator against warm, engine-side H200 measurements (docs/simulator.md, "Against warm
engine-side measurements").

Two sources of real numbers, both measured on prompts the engine had not seen, after a warm-up:

* ``ingress``: ``benchmarks/ingress_overhead.py`` JSON files (``vllm bench serve`` loads of
  512-in / 128-out random prompts, Poisson, against bare ``vllm serve`` and the ``engine``
  ingress). Each load is replayed in virtual time with the same request count, lengths,
  rate and arrival process (vLLM's: exponential gaps rescaled so the last arrival is at
  n / rate; ``inf``: all at once).
* ``study``: a capacity study's dataset (``orchestrator run search_spaces/llama3-8b-h200.yaml``):
  every load level of every completed trial is replayed in virtual time with the product's
  own path (the study's workload at the level's rate, the level's own prompts, the trial's
  engine arguments, ``VirtualSimEngine.measure``) and summarised with the same metrics.

Prints one table row per measured point: request throughput and TTFT p50, real vs
simulated, and the relative error. The timer is not the point here: nothing is timed.

    python benchmarks/sim_vs_h200.py ingress results/ingress
    python benchmarks/sim_vs_h200.py study results/examples/llama3-8b-h200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.engine_args import EngineArgs  # noqa: E402
from orchestrator.sim.core import SimEngineCore  # noqa: E402
from orchestrator.sim.hardware import get_gpu  # noqa: E402
from orchestrator.sim.models import ModelShape  # noqa: E402
from orchestrator.sim.virtual import simulate  # noqa: E402
from orchestrator.workload.requests import Request, RequestSet  # noqa: E402


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


def _summary(records) -> dict:
    ok = [r for r in records if not r.warmup and r.success]
    start = min(r.sent_s for r in ok)
    end = max(r.end_s for r in ok)
    return {"req_s": len(ok) / (end - start), "ttft_p50_ms": float(np.median([r.ttft_s for r in ok])) * 1000,
            "tpot_p50_ms": float(np.median([r.tpot_s for r in ok if r.tpot_s is not None])) * 1000}


def _row(label: str, real: dict, sim: dict) -> str:
    def err(k):
        return f"{(sim[k] - real[k]) / real[k]:+.0%}"
    return (f"| {label} | {real['req_s']:.1f} / {sim['req_s']:.1f} ({err('req_s')}) | "
            f"{real['ttft_p50_ms']:.0f} / {sim['ttft_p50_ms']:.0f} ({err('ttft_p50_ms')}) | "
            f"{real['tpot_p50_ms']:.1f} / {sim['tpot_p50_ms']:.1f} ({err('tpot_p50_ms')}) |")


HEADER = ("| point | req/s real / sim (err) | TTFT p50 ms real / sim (err) | TPOT p50 ms real / sim (err) |\n"
          "| --- | --- | --- | --- |")


def ingress(folder: str, gpu_name: str = "H200") -> None:
    gpu = get_gpu(gpu_name)
    model = ModelShape.load("llama-3.1-8b")
    print(HEADER)
    for path in sorted(Path(folder).glob("ingress_*.json")):
        res = json.loads(path.read_text())
        if res["mode"] == "serve_llm":
            continue  # the simulator models the engine, not ray.serve.llm's ingress
        args = EngineArgs(**res["config"]).resolved(device_memory_gib=gpu.memory_gib, device_name=gpu.name)
        for run in res["runs"]:
            n = int(run["completed"])
            reqs = _bench_requests(n, str(run["rate"]), int(run["seed"]), 512, 128, model.vocab_size)
            sim = _summary(simulate(SimEngineCore(model, gpu, args), reqs))
            real = {"req_s": run["request_throughput"], "ttft_p50_ms": run["median_ttft_ms"],
                    "tpot_p50_ms": run["median_tpot_ms"]}
            print(_row(f"{res['label']}, rate {run['rate']}", real, sim))


def study(path: str) -> None:
    import dataclasses

    from orchestrator.capacity import level_workload
    from orchestrator.engines import create_engine
    from orchestrator.recommend import engine_args_of
    from orchestrator.results import load_trials
    from orchestrator.results.definition import read_study_definition
    from orchestrator.results.levels import load_levels
    from orchestrator.load_phase import study_requests

    real_study = read_study_definition(path)
    from orchestrator.study import SimEngineSpec

    sim_study = real_study.model_copy(update={"engine": SimEngineSpec(mode="virtual")})
    engine = create_engine(sim_study)
    trials = load_trials(path, status="completed")
    levels = load_levels(path)
    base_rate = study_requests(sim_study).requested_rate
    print(HEADER)
    for _, t in trials.sort_values("trial_number").iterrows():
        args = engine.resolve(dataclasses.replace(engine_args_of(t), extra={}))
        mine = levels[levels["trial_id"] == t["trial_id"]].sort_values("level")
        for _, lv in mine.iterrows():
            # The level's own request set, exactly as the real trial drew it (prompts of its own).
            level_wl = level_workload(sim_study.workload, float(lv["rate"]), sim_study.capacity, base_rate)
            rs = study_requests(sim_study, level_wl, level=int(lv["level"]))
            records, _ = engine.measure(args, rs)
            sim = _summary(records)
            real = {"req_s": lv["request_throughput"], "ttft_p50_ms": lv["ttft_p50_ms"],
                    "tpot_p50_ms": lv["tpot_p50_ms"]}
            label = (f"S={args.max_num_seqs} B={args.max_num_batched_tokens} kv={args.kv_cache_dtype} "
                     f"eager={args.enforce_eager}, {lv['rate']:.1f} req/s")
            print(_row(label, real, sim))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", choices=("ingress", "study"))
    p.add_argument("path")
    a = p.parse_args()
    ingress(a.path) if a.source == "ingress" else study(a.path)


if __name__ == "__main__":
    main()
