"""Shared fixtures: paths, a small valid study document, and environment hygiene."""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

BASE_STUDY = {
    "name": "unit",
    "engine": {"kind": "sim"},
    "model": {"name": "llama-3.1-8b"},
    "hardware": {"gpu": "H100-80GB", "gpus_per_node": 2},
    "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 20, "output_len": 32},
    "space": {
        "max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True},
        "max_num_batched_tokens": [2048, 8192],
    },
    "objectives": ["maximize output_throughput_per_gpu", "ttft_p99_ms"],
    "constraints": ["ttft_p99_ms <= 2000"],
}


# Rough wall time of the long modules in a two-worker run on a 2-core machine (seconds; a fresh
# clone's `./dev test`). The suite runs on two xdist workers, a module per worker at a time
# (``--dist loadfile --no-loadscope-reorder``): handing out the longest modules first keeps both
# workers busy to the end instead of one finishing alone.
LONG_MODULES = {
    "test_vllm_cpu.py": 225, "test_vllm_cpu_trained.py": 170, "test_faults_cluster.py": 155,
    "test_study_e2e.py": 120, "test_jobs.py": 110, "test_search_fidelity.py": 110,
    "test_engine_conformance.py": 95, "test_vllm_cpu_serve_llm.py": 90,
    "test_ties.py": 90, "test_resume_kill.py": 85, "test_vllm_cpu_sessions.py": 55, "test_unit_metrics.py": 50,
    "test_corrupt_results.py": 45, "test_capacity_served.py": 40, "test_faults_disk.py": 35,
    "test_harness_served.py": 35, "test_warmup_served.py": 35, "test_nightly.py": 35,
    "test_plan.py": 25, "test_study_inputs.py": 25, "test_preflight_default.py": 20, "test_query_docs.py": 20,
}
# The order the long modules are handed out in. xdist gives a worker its next module as soon as it
# has two tests or fewer pending, so a one-test module is followed on its worker by the next in
# line: the CPU vLLM modules alternate with served-simulator ones so that, with the times above,
# two vLLM modules never run at once (an engine starting beside another takes twice as long on
# two cores). Modelled with the durations above: both workers end within seconds of each other.
FIRST = ["test_vllm_cpu.py", "test_study_e2e.py", "test_vllm_cpu_trained.py", "test_faults_cluster.py",
         "test_jobs.py", "test_search_fidelity.py", "test_ties.py", "test_resume_kill.py",
         "test_vllm_cpu_serve_llm.py", "test_engine_conformance.py", "test_vllm_cpu_sessions.py"]
_RANK = {name: i for i, name in enumerate(FIRST)}


def pytest_collection_modifyitems(session, config, items):
    # Stable sort: the same order on every worker (xdist requires it); other modules keep theirs.
    items.sort(key=lambda item: (_RANK.get(item.path.name, len(FIRST)), -LONG_MODULES.get(item.path.name, 0)))


def sim_study(base: Optional[Mapping] = None, *, mode: str = "virtual", **sections):
    """A study of the simulated engine (virtual time unless ``mode``): ``base`` (default
    :data:`BASE_STUDY`) with the given top-level ``sections`` replaced, parsed."""
    from orchestrator.study.spec import parse_study

    doc = copy.deepcopy(dict(base if base is not None else BASE_STUDY))
    doc["engine"] = {"kind": "sim", "mode": mode}
    doc.update(copy.deepcopy(sections))
    return parse_study(doc)


@pytest.fixture
def study_doc():
    """A fresh, valid study document to mutate in a test."""
    return copy.deepcopy(BASE_STUDY)


@pytest.fixture
def repo() -> Path:
    return REPO


@contextmanager
def local_ray(env: Optional[Mapping[str, str]] = None, *, num_cpus: int = 3, num_gpus: int = 0) -> Iterator[str]:
    """A Ray cluster of our own (``address="local"``: never one another job on the machine started),
    engine metrics reported every second. ``env``: set in this process and in Ray's workers while it
    runs. Yields the session folder (Ray's logs)."""
    import ray

    env = dict(env or {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
             namespace="orchestrator", _system_config={"metrics_report_interval_ms": 1000},
             runtime_env={"env_vars": env} if env else None)
    try:
        yield ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001 - no public API
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def local_serve(port: int, env: Optional[Mapping[str, str]] = None) -> Iterator[int]:
    """:func:`local_ray` with 1 logical GPU and Serve's proxy on ``port``. Yields the proxy's port."""
    from orchestrator.cluster.connect import start_serve

    with local_ray(env, num_gpus=1):
        yield start_serve(port)


# Native libraries loaded by the Ray and vLLM tests (torch, grpc, vLLM's extensions) can abort
# in their own destructors at interpreter exit ("double free or corruption") after every test
# has passed and been reported, turning a green run into exit code 134. Once pytest has
# written its summary, leave with pytest's own exit status and skip that teardown.
_exit_status: int | None = None


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _exit_status is not None and not hasattr(config, "workerinput"):
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
