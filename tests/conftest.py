"""Shared fixtures: paths, a small valid study document, and environment hygiene."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import pytest

from support import cpu_profile
from support.scheduling import (ENGINE_UNIT, RAY_UNIT, SERVED_UNIT, give_way_to_the_engine_unit, make_scheduler,
                                order_key, ray_workers_of_the_suite, unit_of)

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
ray_workers_of_the_suite()

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


def pytest_configure(config):
    cpu_profile.register(config)  # SUITE_CPU_PROFILE=DIR: CPU seconds per test, Ray and vLLM included


def pytest_collection_modifyitems(session, config, items):
    # Stable sort, the same order on every worker (xdist requires it): see support.scheduling.
    items.sort(key=lambda item: order_key(str(item.path)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    give_way_to_the_engine_unit(str(item.path))  # before the test's fixtures start Ray or servers
    if _shared is not None and unit_of(str(item.path)) != _shared[0]:
        release_shared_cluster()  # this test may start a Ray of its own


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (``./dev test``): a module per worker at a time, the CPU vLLM modules
    one after another on one worker (support.scheduling)."""
    return make_scheduler(config, log) if config.getvalue("dist") == "loadfile" else None


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


def suite_cache(config, tmp_path_factory, name: str) -> Path:
    """A folder shared by the suite's tests and workers: in pytest's cache folder of the
    checkout, or this run's temporary folder without the cache plugin."""
    cache = getattr(config, "cache", None)
    folder = cache.mkdir(name) if cache is not None else tmp_path_factory.getbasetemp().parent / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shared_model_infos(config, tmp_path_factory) -> Path:
    """The folder for vLLM's model inspection results shared by the suite's vLLM tests
    (:func:`support.vllm_processes.own_caches`)."""
    return suite_cache(config, tmp_path_factory, "vllm-modelinfos")


@pytest.fixture
def vllm_caches(monkeypatch, tmp_path, tmp_path_factory, request) -> dict[str, str]:
    """This test's own vLLM caches under ``tmp_path / "cache"`` (its engine processes are found by
    them), the model inspection results shared."""
    from support.vllm_processes import own_caches

    return own_caches(monkeypatch, tmp_path / "cache", shared_model_infos(request.config, tmp_path_factory))


@pytest.fixture
def tiny_trained_model(request, tmp_path_factory) -> Path:
    """``make-model tiny-llama --weights trained`` (the ``tiny`` recipe), trained once per checkout
    in pytest's cache folder and then found by its recipe hash (whichever test asks first trains
    it; one asking meanwhile waits for it)."""
    from orchestrator.models.modelgen import trained_model_dir

    return trained_model_dir("tiny-llama", "tiny", root=suite_cache(request.config, tmp_path_factory, "trained-models"))


@contextmanager
def local_ray(env: Optional[Mapping[str, str]] = None, *, num_cpus: int = 3, num_gpus: int = 0,
              ray_metrics: bool = False, dashboard: bool = False) -> Iterator[str]:
    """A Ray cluster of our own (``address="local"``: never one another job on the machine started).
    ``env``: set in this process and in Ray's workers while it runs. ``ray_metrics``: metrics reported
    every second, as ``orchestrator run`` starts Ray for vLLM (the ``serve_llm`` ingress reads vLLM's
    metrics from Ray's exporter); Ray's 10 s default otherwise, which costs an idle cluster
    ~15 % less CPU. ``dashboard``: the whole dashboard (``ray job submit`` and ``ray job stop`` reach
    the cluster through it; about 1 CPU-s a minute more when idle), on Ray's port or the next free
    one (``ray._private.worker.get_dashboard_url()``), and a temp folder of its own that names it as
    the machine's current cluster (:func:`_jobs_come_here`). Yields the session folder (Ray's logs)."""
    import ray

    release_shared_cluster()  # one Ray per process
    env = dict(env or {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp") if dashboard else None  # short: socket paths
    with _job_agent_of_its_own() if dashboard else nullcontext():
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=dashboard,
                 namespace="orchestrator", runtime_env={"env_vars": env} if env else None,
                 **({"_temp_dir": temp_dir} if temp_dir else {}),
                 **({"_system_config": {"metrics_report_interval_ms": 1000}} if ray_metrics else {}))
    if temp_dir:
        _jobs_come_here(temp_dir)
    try:
        yield ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001 - no public API
    finally:
        ray.shutdown()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _jobs_come_here(temp_dir: str) -> None:
    """A job submitted to this Ray runs its driver here. Ray's job supervisor gives the driver the
    address it resolves as ``"auto"``: the ``ray_current_cluster`` file of the cluster's temp folder,
    which in Ray's shared default (``/tmp/ray``) names the cluster started last on the machine by
    ``ray start`` or ``ray.cluster_utils.Cluster`` (tests/cluster's three-node cluster), and without
    that file any Ray found running on the machine (another unit's, a benchmark's). Either way a job
    submitted here could run its driver elsewhere: its engine never started in this unit, and its
    actors showed up in another unit's listing. A temp folder of its own, naming this cluster, makes
    the resolution land here."""
    import ray

    ray._private.utils.write_ray_address(ray.get_runtime_context().gcs_address, temp_dir)  # noqa: SLF001


@contextmanager
def _job_agent_of_its_own() -> Iterator[None]:
    """``ray.init`` with its dashboard agent (what ``ray job submit`` talks to) on a free port of its own.
    Every Ray's agent listens on 52365 unless told otherwise, and ``ray.init`` has no argument to tell
    it: with the suite's other Rays up, one of them took the port and this one had no job agent ("No
    available agent to submit job"). Port 0 is Ray's own "bind any" (the agent registers the port it got)."""
    from ray._private.parameter import RayParams

    original = RayParams.__init__

    def init(self, *args, **kwargs):
        kwargs.setdefault("dashboard_agent_listen_port", 0)
        original(self, *args, **kwargs)

    RayParams.__init__ = init
    try:
        yield
    finally:
        RayParams.__init__ = original


def ray_unit() -> str:
    """:func:`local_ray` (3 CPUs, 2 logical GPUs) for the Ray unit's studies (support.scheduling's
    ``RAY_MODULES``): each ``run_study`` joins it, and each ``orchestrator run`` with ``--address``,
    as on a cluster, instead of starting a Ray of its own per module. Returns the session folder."""
    return _shared_cluster(RAY_UNIT, lambda stack: stack.enter_context(local_ray(num_gpus=2)))


@pytest.fixture
def unit_ray() -> str:
    """:func:`ray_unit` for a test."""
    return ray_unit()


@contextmanager
def local_serve(port: int, env: Optional[Mapping[str, str]] = None, *, num_gpus: int = 1) -> Iterator[int]:
    """:func:`local_ray` with ``num_gpus`` logical GPUs and Serve's proxy on ``port``. Yields the proxy's port."""
    from orchestrator.cluster.connect import start_serve

    with local_ray(env, num_gpus=num_gpus):
        yield start_serve(port)


SHARED_SERVE_PORT = 8201
ENGINE_SERVE_PORT = 8202
# The unit whose Ray this worker keeps up, how to stop it, and what its tests are given.
_shared: Optional[tuple[str, ExitStack, Any]] = None


def _shared_cluster(unit: str, start: Callable[[ExitStack], Any]) -> Any:
    """A Ray kept up for one unit's modules (``support.scheduling``: they run one after another on
    one worker) instead of a cluster each: the first test outside the unit, or one that starts a
    Ray of its own (:func:`local_ray`), shuts it down."""
    global _shared
    if _shared is not None and _shared[0] != unit:
        release_shared_cluster()
    if _shared is None:
        stack = ExitStack()
        try:
            value = start(stack)
        except BaseException:
            stack.close()
            raise
        _shared = unit, stack, value
    return _shared[2]


def release_shared_cluster() -> None:
    global _shared
    if _shared is not None:
        (_, stack, _), _shared = _shared, None
        stack.close()


def shared_serve() -> int:
    """:func:`local_serve` for the served unit's modules, one Ray for all (2 logical GPUs: a study of
    two concurrent trials runs on it). Returns the proxy's port."""
    return _shared_cluster(SERVED_UNIT, lambda stack: stack.enter_context(local_serve(SHARED_SERVE_PORT, num_gpus=2)))


@dataclass(frozen=True)
class EngineCluster:
    """The engine unit's Ray with Serve (3 CPUs, 4 logical GPUs for the simulated engines of the
    engine contract): its vLLM processes are found by ``cache_root``, the caches the unit's engines
    share (``VLLM_CACHE_ROOT`` under it, set in every worker); ``session_dir`` holds Ray's logs;
    ``dashboard_url``: where ``ray job`` commands reach it (test_vllm_cpu_stop's ``ray job stop``)."""

    cache_root: Path
    serve_port: int
    session_dir: Path
    dashboard_url: str


@pytest.fixture
def engine_cluster(request, tmp_path_factory) -> EngineCluster:
    """The engine unit's modules share one Ray (one start instead of five), which reports metrics every
    second as ``orchestrator run`` starts Ray for vLLM (test_vllm_cpu_serve_llm reads vLLM's metrics
    from Ray's exporter). Every worker sees ``ENGINE_UNIT_ENV``: test_vllm_cpu names it as the
    engine's Hugging Face token variable."""
    from support.vllm_processes import ENGINE_UNIT_ENV, own_caches

    def start(stack: ExitStack) -> EngineCluster:
        from orchestrator.cluster.connect import start_serve

        cache_root = tmp_path_factory.mktemp("engine-unit-cache")
        env = own_caches(stack.enter_context(pytest.MonkeyPatch.context()), cache_root,
                         shared_model_infos(request.config, tmp_path_factory))
        session_dir = stack.enter_context(local_ray({**env, **ENGINE_UNIT_ENV}, num_gpus=4, ray_metrics=True,
                                                    dashboard=True))
        import ray

        dashboard_url = "http://" + ray._private.worker.get_dashboard_url()  # noqa: SLF001 - no public API
        return EngineCluster(cache_root, start_serve(ENGINE_SERVE_PORT), Path(session_dir), dashboard_url)

    return _shared_cluster(ENGINE_UNIT, start)


# Native libraries loaded by the Ray and vLLM tests (torch, grpc, vLLM's extensions) can abort
# in their own destructors at interpreter exit ("double free or corruption") after every test
# has passed and been reported, turning a green run into exit code 134. Once pytest has
# written its summary, leave with pytest's own exit status and skip that teardown.
_exit_status: int | None = None


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    release_shared_cluster()
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _exit_status is not None and not hasattr(config, "workerinput"):
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
