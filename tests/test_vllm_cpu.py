"""Real vLLM (the CPU build) under ray.serve.llm, through Tune, Serve and the load generator.

One study of four trials on a tiny random model:
* two configurations that start, with different max_num_seqs / max_num_batched_tokens /
  prefix caching: the engine metrics must show the settings took effect;
* one whose KV cache cannot hold a max_model_len sequence: vLLM refuses to start, the row
  is infeasible with vLLM's own message, and the study goes on;
* one whose engine process is killed mid-load: the row is classified, the study finishes.
Afterwards no Serve application and no vLLM process is left.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KV_BYTES = 8 * 2**20  # 4,096 tokens of tiny-llama in float32 (2 KiB per token)


def _engine_core_pids() -> list[int]:
    pids = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            text = (p.info["name"] or "") + " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "EngineCore" in text:
            pids.append(p.pid)
    return pids


class EngineKiller(threading.Thread):
    """Kills the engine core of the trial that runs after ``after_rows`` trials are recorded,
    once its application is serving (so the kill lands in the load window, not the start)."""

    def __init__(self, trials_dir: Path, after_rows: int, delay_s: float, timeout_s: float = 900):
        super().__init__(daemon=True)
        self.trials_dir, self.after_rows, self.delay_s, self.timeout_s = trials_dir, after_rows, delay_s, timeout_s
        self.killed_pid = None
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            rows = len(list(self.trials_dir.rglob("*.parquet"))) if self.trials_dir.exists() else 0
            if rows >= self.after_rows and self._app_running():
                time.sleep(self.delay_s)  # warm-up done, measured requests in flight
                pids = _engine_core_pids()
                if pids:
                    os.kill(pids[0], 9)
                    self.killed_pid = pids[0]
                    return
            time.sleep(0.5)

    @staticmethod
    def _app_running() -> bool:
        from ray import serve

        try:
            apps = serve.status().applications
        except Exception:  # noqa: BLE001 - Serve not up yet
            return False
        return any(name.startswith("tune-") and str(getattr(a.status, "value", a.status)) == "RUNNING"
                   for name, a in apps.items())


def test_cpu_vllm_study(tmp_path, monkeypatch):
    import ray
    from ray import serve

    from orchestrator.modelgen import make_model_dir
    from orchestrator.results import load_requests, load_trials
    from orchestrator.search import run_study
    from orchestrator.study import parse_study

    for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("HF_HOME", "hf")):
        monkeypatch.setenv(var, str(tmp_path / "cache" / sub))
    model_dir = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights="random", max_position_embeddings=8192)
    ok_a = {"max_num_seqs": 2, "max_num_batched_tokens": 256, "enable_prefix_caching": True, "max_model_len": 1024}
    ok_b = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "enable_prefix_caching": False, "max_model_len": 1024}
    too_long = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "enable_prefix_caching": True,
                "max_model_len": 8192}
    killed = {"max_num_seqs": 4, "max_num_batched_tokens": 256, "enable_prefix_caching": False,
              "max_model_len": 1024}
    study = parse_study({
        "name": "cpu-vllm",
        "engine": {"kind": "vllm", "platform": "cpu", "model_source": str(model_dir), "start_timeout_s": 600,
                   "engine_kwargs": {"kv_cache_memory_bytes": KV_BYTES}},
        "model": {"name": "tiny-llama", "dtype": "float32"},
        "hardware": {"gpu": "CPU"},
        "workload": {"arrival": {"kind": "poisson", "rate": 3}, "num_requests": 24, "warmup_requests": 2,
                     # CPU KV blocks hold 128 tokens and only full blocks are cached: prefixes of 2 blocks.
                     "input_len": {"kind": "uniform", "min": 280, "max": 400}, "output_len": 16,
                     "shared_prefix": {"groups": 2, "length": 256}, "timeout_s": 60},
        "space": {"max_num_seqs": [2, 4, 8], "max_num_batched_tokens": [256, 1024],
                  "enable_prefix_caching": [True, False], "max_model_len": [1024, 8192], "enforce_eager": True},
        "objectives": ["maximize output_throughput", "minimize ttft_p99_ms"],
        "search": {"sampler": "random", "initial_points": [ok_a, ok_b, too_long, killed], "preflight": False},
        "budget": {"trials": 4, "max_concurrent_trials": 1},
        "output": str(tmp_path / "out"),
    })
    ray.init(address="local", num_cpus=3, include_dashboard=False, namespace="orchestrator",
             _system_config={"metrics_report_interval_ms": 1000},
             runtime_env={"env_vars": {k: os.environ[k] for k in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR",
                                                                  "HF_HOME")}})
    killer = EngineKiller(tmp_path / "out" / "cpu-vllm" / "trials", after_rows=3, delay_s=4)
    killer.start()
    try:
        run = run_study(study, quiet=True, serve_port=8131)
        killer.stop.set()
        leftover = [a for a in serve.status().applications if a.startswith("tune-")]
    finally:
        ray.shutdown()
    assert leftover == [], leftover
    time.sleep(2)
    assert _engine_core_pids() == [], "a vLLM engine process outlived its trial"

    trials = load_trials(run.study_dir).set_index("trial_number").sort_index()
    assert len(trials) == 4, trials[["status", "failure_kind"]]

    def row(params):
        (match,) = [r for _, r in trials.iterrows() if all(r[k] == v for k, v in params.items())]
        return match

    for params in (ok_a, ok_b):
        r = row(params)
        assert r["status"] == "completed", (r["failure_kind"], r["failure_message"])
        assert r["completed"] == 24 and r["failed"] == 0
        # The engine's own gauges (Ray-exported vLLM metrics) reached the row ...
        assert r["num_requests_running_peak"] is not None and r["kv_cache_usage_peak"] > 0
        # ... and show the setting took effect.
        assert r["num_requests_running_peak"] <= params["max_num_seqs"]
        cfg = json.loads(r["engine_args_json"])
        assert cfg["max_num_seqs"] == params["max_num_seqs"]
        assert cfg["enable_prefix_caching"] == params["enable_prefix_caching"]
    # Prefix caching on (ok_a) with shared prefixes: the engine reports hits.
    assert row(ok_a)["prefix_cache_hit_rate"] > 0

    bad = row(too_long)
    assert bad["status"] == "infeasible" and bad["failure_kind"] == "kv_cache_too_small"
    assert "max seq len" in bad["failure_message"]

    died = row(killed)
    assert killer.killed_pid is not None
    assert died["status"] == "failed" and died["failure_kind"] == "engine_died", died["failure_message"]

    requests = load_requests(run.study_dir, include_warmup=True)
    done = trials[trials["status"] == "completed"]["trial_id"]
    assert (requests[requests["trial_id"].isin(done)].groupby("trial_id").size() == 26).all()
