"""Connecting to (or starting) the Ray cluster and Serve for a study run.

Without an address a local Ray is started, sized for the study: for the ``sim``
engine on a machine without GPUs it declares the study's GPUs as logical
resources, so trials pack exactly as on the real cluster.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

from orchestrator.cluster.gpu_ledger import units_per_node
from orchestrator.measure.nvml import load_pynvml

log = logging.getLogger(__name__)

NAMESPACE = "orchestrator"


@dataclass(frozen=True)
class ClusterInfo:
    started_locally: bool
    resource: str  # what one engine replica is counted in: GPU or CPU
    units_per_node: dict[str, int]
    serve_port: int

    @property
    def total_units(self) -> int:
        return sum(self.units_per_node.values())

    @property
    def largest_node(self) -> int:
        return max(self.units_per_node.values(), default=0)


def engine_resource(engine_kind: str, on_cpu: bool) -> str:
    """The Ray resource one replica of the engine holds: CPUs for vLLM's CPU build, else GPUs."""
    if engine_kind == "vllm" and on_cpu:  # only vLLM has a CPU build
        return "CPU"
    return "GPU"


def _local_gpu_count() -> int:
    try:
        return load_pynvml().nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001
        return 0


def ensure_ray(engine_kind: str, *, gpus_per_node: int, max_concurrent_trials: int, address: Optional[str] = None,
               num_cpus: Optional[int] = None) -> bool:
    """Connect to ``address``/``RAY_ADDRESS`` or start a local Ray sized for the study (its engine
    kind, ``hardware.gpus_per_node``, ``budget.max_concurrent_trials``); True if started here."""
    # deferred: ray takes ~0.3 s to import; validate/show load this module
    import ray

    if ray.is_initialized():
        return False
    env_vars = {"RAY_DEDUP_LOGS": "1", "PYTHONUNBUFFERED": "1"}
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR",
                "HF_HOME", "ORCHESTRATOR_MODELS", "VLLM_CPU_KVCACHE_SPACE", "VLLM_TARGET_DEVICE"):
        if os.environ.get(key):
            env_vars[key] = os.environ[key]
    runtime_env = {"env_vars": env_vars}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        # Replica and controller logs stay in Ray's log folder (the trial rows carry the engine's own
        # error); ORCHESTRATOR_RAY_LOGS=1 streams them here, as for a local Ray.
        ray.init(address=address, namespace=NAMESPACE, runtime_env=runtime_env, logging_level=logging.WARNING,
                 log_to_driver=os.environ.get("ORCHESTRATOR_RAY_LOGS") == "1")
        return False
    cpus = num_cpus or max(os.cpu_count() or 2, max_concurrent_trials + 2, 4)
    gpus = _local_gpu_count()
    if engine_kind == "sim" and gpus == 0:
        gpus = gpus_per_node  # logical GPUs: the sim holds them like vLLM would
    extra = {}
    if engine_kind == "vllm":
        # vLLM's metrics reach Prometheus through Ray's exporter; the 10 s default is too coarse
        # for a load window of a minute.
        extra["_system_config"] = {"metrics_report_interval_ms": 1000}
    # A study runs a few long-lived actors (trial actors, the results sink, replicas), each in a worker
    # Ray starts for it: the idle workers Ray starts ahead for the first driver (one per CPU) would
    # only import Ray and wait. Read by the raylet started below, so a local Ray only.
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    # address="local": our own Ray, sized for the study, even if `ray start` runs on this machine
    # (plain ray.init() would join that cluster instead).
    ray.init(address="local", num_cpus=cpus, num_gpus=gpus, namespace=NAMESPACE, include_dashboard=False, **extra,
             runtime_env=runtime_env, logging_level=logging.WARNING,
             log_to_driver=os.environ.get("ORCHESTRATOR_RAY_LOGS") == "1")
    return True


def start_serve(port: int = 8000) -> int:
    """Start Serve from the driver (before Tune: a controller started inside a trial
    would be captured by that trial's placement group). Returns the HTTP port in use,
    which is the running controller's if Serve was already up."""
    # deferred: ray takes ~0.3 s to import; validate/show load this module
    import ray
    from ray import serve

    proxy_location = "EveryNode"
    nodes = _alive_nodes()
    if len({n.get("NodeManagerAddress") for n in nodes}) < len(nodes):
        proxy_location = "HeadOnly"  # several nodes share one host: one proxy per port

    for attempt in range(3):
        try:
            serve.start(proxy_location=proxy_location, http_options={"host": "127.0.0.1", "port": port},
                        logging_config={"log_level": "WARNING", "enable_access_log": False})
            break
        except ray.exceptions.RayActorError:
            # On a busy machine the controller's 5 s readiness check can give up on a starting
            # proxy and replace it; serve.start was waiting on the one it killed. Again: the
            # controller is up by now, and the new proxy comes.
            if attempt == 2:
                raise
    try:
        # deferred with ray (above); a private API, guarded
        from ray.serve.context import _get_global_client

        return int(_get_global_client().http_config.port)
    except Exception:  # noqa: BLE001 - private API moved: trust the requested port
        return port


def _alive_nodes() -> list[dict]:
    # deferred: ray takes ~0.3 s to import; validate/show load this module
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def cluster_info(resource: str, *, started_locally: bool, serve_port: int) -> ClusterInfo:
    """The cluster's ``resource`` units node by node (see :func:`engine_resource`)."""
    return ClusterInfo(started_locally, resource, units_per_node(resource), serve_port)


@dataclass(frozen=True)
class LocalRay:
    """The processes of a Ray instance this driver started (to find them again if it is killed)."""

    session_dir: str
    pids: tuple[int, ...]


def local_ray() -> Optional[LocalRay]:
    """This driver's own Ray head processes (GCS, raylet, monitors), if it started them.

    On Linux they die with a killed driver (Ray sets a parent-death signal), and the
    workers die with the raylet; elsewhere they may outlive it, so the run state keeps
    them and the next start stops any that are left (see ``resume.stop_orphans``).
    """
    try:
        # deferred: ray takes ~0.3 s to import; validate/show load this module
        import ray

        node = ray._private.worker._global_node  # noqa: SLF001 - no public API for the head's processes
        if node is None or not node.head:
            return None
        pids = [p.process.pid for procs in node.all_processes.values() for p in procs if p.process is not None]
        return LocalRay(node.get_session_dir_path(), tuple(sorted(pids)))
    except Exception:  # noqa: BLE001 - private API moved: no orphan tracking, nothing else lost
        return None
