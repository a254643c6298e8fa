"""The cold H200 runs the simulator was first fitted on, replayed in virtual time.

``results/examples/h200-cold-runs/cold_runs.json`` holds what real vLLM measured: four online
runs (a fresh ``vllm serve`` per configuration, ``vllm bench serve`` with Poisson arrivals and no
warm-up), two offline ``LLM.generate`` runs, and the memory vLLM logged at their starts.
:func:`simulate_online` and :func:`simulate_offline` replay each in virtual time as the benchmark
ran it (same request count, lengths, rate; seed 0 for the arrivals), and :func:`memory_plan` is
the simulator's start-up memory for one of their configurations. ``tests/sim/`` holds the
simulator to these runs, ``benchmarks/fit_sim_h200.py`` fits on them, and docs/simulator.md's
calibration tables are generated from them (``orchestrator/doc_tables/cold_runs.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.hardware.memory import MemoryPlan
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.core import SimEngineCore
from orchestrator.sim.virtual import simulate
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request

DATASET = Path(__file__).resolve().parents[2] / "results" / "examples" / "h200-cold-runs"
FILE = "cold_runs.json"


@dataclass(frozen=True)
class Setup:
    """What every cold run shares."""

    gpu: str
    model: str
    vllm: str
    gpu_memory_utilization: float
    max_model_len: int
    input_len: int
    output_len: int


@dataclass(frozen=True)
class OnlineRun:
    rate: float  # req/s
    max_num_seqs: int
    num_prompts: int
    ttft_p50_ms: float
    tpot_p50_ms: float
    output_tok_s: float

    @property
    def key(self) -> tuple[int, int, int]:
        """(rate, max_num_seqs, requests): how the tests and the fit name the run."""
        return int(self.rate), self.max_num_seqs, self.num_prompts


@dataclass(frozen=True)
class OfflineRun:
    max_num_seqs: int
    num_prompts: int
    output_tok_s: float


@dataclass(frozen=True)
class Logged:
    """A figure vLLM logged at the starts of ``max_num_seqs`` (low == high when they agreed)."""

    low: float
    high: float
    max_num_seqs: tuple[int, ...]


@dataclass(frozen=True)
class MeasuredMemory:
    kv_serve_gib: Logged
    kv_serve_tokens: Logged
    serve_budget: int  # max_num_batched_tokens of the serve starts
    kv_offline_gib: Logged
    kv_offline_tokens: Logged
    offline_budget: int
    weights_gib: float
    cudagraph_gib: dict[int, float]  # max_num_seqs -> CUDA graph memory


@dataclass(frozen=True)
class ColdRuns:
    description: str
    setup: Setup
    online: tuple[OnlineRun, ...]
    offline: tuple[OfflineRun, ...]
    memory: MeasuredMemory


def _logged(entry: dict, key: str) -> Logged:
    low, high = entry[key]
    return Logged(float(low), float(high), tuple(int(s) for s in entry["max_num_seqs"]))


def load_cold_runs(folder: str | Path = DATASET) -> ColdRuns:
    """The dataset in ``folder``; a missing file or field raises ValueError naming it."""
    path = Path(folder) / FILE
    try:
        raw = json.loads(path.read_text())
        s, mem = raw["setup"], raw["memory"]
        setup = Setup(s["gpu"], s["model"], str(s["vllm"]), float(s["gpu_memory_utilization"]),
                      int(s["max_model_len"]), int(s["input_len"]), int(s["output_len"]))
        online = tuple(OnlineRun(float(r["rate"]), int(r["max_num_seqs"]), int(r["num_prompts"]),
                                 float(r["ttft_p50_ms"]), float(r["tpot_p50_ms"]), float(r["output_tok_s"]))
                       for r in raw["online"])
        offline = tuple(OfflineRun(int(r["max_num_seqs"]), int(r["num_prompts"]), float(r["output_tok_s"]))
                        for r in raw["offline"])
        serve, off = mem["kv_cache_serve"], mem["kv_cache_offline"]
        memory = MeasuredMemory(_logged(serve, "gib"), _logged(serve, "tokens"), int(serve["max_num_batched_tokens"]),
                                _logged(off, "gib"), _logged(off, "tokens"), int(off["max_num_batched_tokens"]),
                                float(mem["weights_gib"]),
                                {int(k): float(v) for k, v in mem["cudagraph_gib"].items()})
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (the cold runs' dataset)") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a cold-runs dataset ({type(e).__name__}: {e})") from None
    return ColdRuns(raw.get("description", ""), setup, online, offline, memory)


# ---------------------------------------------------------------- replay
def workload(n: int, rate: float | None, seed: int = 0, prompt_len: int = 512, output_len: int = 128,
             vocab: int = 128256) -> RequestSet:
    """``n`` random prompts due as ``vllm bench serve`` sends them: Poisson delays rescaled so the last
    is sent at ``n / rate`` (all at once when ``rate`` is None)."""
    rng = np.random.default_rng(seed)
    arrivals = np.zeros(n)
    if rate is not None:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
        arrivals *= (n / rate) / arrivals[-1]
    reqs = tuple(Request(i, float(arrivals[i]), tuple(int(x) for x in rng.integers(0, vocab, prompt_len)), output_len)
                 for i in range(n))
    return RequestSet(warmup=(), measured=reqs)


def engine(max_num_seqs: int, server: bool = True, calibration=None, gpu: str = "H200", model: str = "llama-3.1-8b",
           gpu_memory_utilization: float = 0.9, max_model_len: int = 4096, **kw) -> SimEngineCore:
    """The simulated engine of one cold run (``server``: ``vllm serve``'s defaults, else ``LLM``'s)."""
    spec = get_gpu(gpu)
    args = EngineArgs(gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                      max_num_seqs=max_num_seqs, **kw).resolved(device_memory_gib=spec.memory_gib,
                                                                device_name=spec.name, server=server)
    return SimEngineCore(ModelShape.load(model), spec, args, calibration)


def _engine_of(setup: Setup, max_num_seqs: int, server: bool = True, calibration=None) -> SimEngineCore:
    return engine(max_num_seqs, server, calibration, gpu=setup.gpu, model=setup.model,
                  gpu_memory_utilization=setup.gpu_memory_utilization, max_model_len=setup.max_model_len)


def summarize(records) -> dict:
    """TTFT and TPOT p50 (ms), output tok/s and req/s as the benchmark counts them: its clock starts
    with the load window (at 0), not at the first request."""
    recs = [r for r in records if not r.warmup and r.success]
    ttft = np.array([r.ttft_s for r in recs]) * 1000
    tpot = np.array([r.tpot_s for r in recs if r.tpot_s is not None]) * 1000
    end = max(r.end_s for r in recs)
    return {"ttft_p50_ms": float(np.median(ttft)), "tpot_p50_ms": float(np.median(tpot)),
            "output_tok_s": sum(r.output_tokens for r in recs) / end, "req_s": len(recs) / end}


def simulate_online(setup: Setup, run: OnlineRun, seed: int = 0, calibration=None) -> dict:
    reqs = workload(run.num_prompts, run.rate, seed, setup.input_len, setup.output_len)
    return summarize(simulate(_engine_of(setup, run.max_num_seqs, calibration=calibration), reqs))


def simulate_offline(setup: Setup, run: OfflineRun, calibration=None) -> dict:
    reqs = workload(run.num_prompts, None, 0, setup.input_len, setup.output_len)
    return summarize(simulate(_engine_of(setup, run.max_num_seqs, server=False, calibration=calibration), reqs))


def memory_plan(setup: Setup, max_num_seqs: int, server: bool = True) -> MemoryPlan:
    """The simulator's start-up memory for a cold run's configuration."""
    return _engine_of(setup, max_num_seqs, server).memory

