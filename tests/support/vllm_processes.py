"""vLLM processes of one test: the CPU vLLM test modules run at the same time on two workers,
so each finds its own engines by the cache folder it gave them (``VLLM_CACHE_ROOT`` is set in
the test's Ray runtime environment and inherited by every engine process)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import psutil


def vllm_processes(cache_root: Path, *, kinds: tuple[str, ...] = ("EngineCore", "vllm.entrypoints")) -> list:
    """Live processes whose name or command line has one of ``kinds`` and whose environment
    points ``VLLM_CACHE_ROOT`` under ``cache_root``."""
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            text = (p.info["name"] or "") + " " + " ".join(p.info["cmdline"] or [])
            if not any(k in text for k in kinds) or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("VLLM_CACHE_ROOT", "").startswith(str(cache_root)):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


# In the environment of every process of the engine unit's Ray (conftest's ``engine_cluster``):
# test_vllm_cpu's engine is given this variable by name (``hf_token_env``), and no file may hold its value.
PLANTED_TOKEN_VAR, PLANTED_TOKEN = "ORCH_TEST_HF_TOKEN", "hf_planted_referenced_52d0a8"
ENGINE_UNIT_ENV = {PLANTED_TOKEN_VAR: PLANTED_TOKEN}


def engine_core_binding() -> dict[str, str]:
    """Under pytest-xdist, the core this worker's vLLM engines run their OpenMP threads on.

    vLLM-CPU binds an engine's threads itself (``VLLM_CPU_OMP_THREADS_BIND=auto``): on a 2-core
    machine to core 0 and keeps core 1 for the server, whatever else runs. Two workers' engines then
    share core 0 while core 1 serves only the frontends. Worker ``gwN`` binds to core ``N mod cores``
    instead: the engines of two tests running side by side each get a core. Outside xdist, vLLM's own choice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return {}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[int(worker[2:]) % len(cores)])}


def own_caches(monkeypatch, cache_root: Path, model_infos: Optional[Path] = None) -> dict[str, str]:
    """Give this test's vLLM its own compile and model caches under ``cache_root`` (set here, and
    returned for the Ray runtime environment the engines inherit).

    ``model_infos``: a folder shared by the tests for vLLM's model inspection results (its cache's
    ``modelinfos``, keyed by the hash of the model's source): vLLM inspects an architecture in a
    subprocess of its own the first time it sees it (about 5 s of imports), once per suite then."""
    env = {var: str(cache_root / sub) for var, sub in (("VLLM_CACHE_ROOT", "vllm"),
                                                       ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("HF_HOME", "hf"))}
    env.update(engine_core_binding())
    if model_infos is not None:
        (cache_root / "vllm").mkdir(parents=True, exist_ok=True)
        (cache_root / "vllm" / "modelinfos").symlink_to(model_infos, target_is_directory=True)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return env


def one_process(engine: dict) -> dict:
    """``engine`` (a study's engine section) with vLLM-CPU's model run inside its engine core
    process (vLLM's one-process executor) instead of a worker process of its own (its CPU
    default, for OpenMP's thread setup): a start takes ~12 s instead of ~17 s on two cores, and no
    second process spins a core between steps. For the tests that are not about the engine's
    processes; test_engine_conformance's vLLM-CPU engine keeps vLLM's default (a worker process,
    found and gone after teardown)."""
    return {**engine, "engine_kwargs": {**engine.get("engine_kwargs", {}), "distributed_executor_backend": "uni"},
            "env": {**engine.get("env", {}), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}

