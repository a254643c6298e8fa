"""The ``sim`` engine in served mode: one Ray Serve application per trial.

Its replica (:mod:`~orchestrator.engines.sim.ingress`) is :mod:`~orchestrator.engines.sim.http_server`'s
OpenAI server over :mod:`~orchestrator.engines.sim.loop`'s engine loop.

The replica asks Ray for the GPUs a real vLLM replica would hold (TP x PP on one
node), so a CPU-only cluster started with fake ``num_gpus`` packs trials exactly
as a GPU cluster would.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Optional
from urllib.parse import urlsplit

from orchestrator.cluster.gpu_ledger import leased_node
from orchestrator.engines.base import Deployment, Engine, EngineEndpoint, EngineTarget
from orchestrator.engines.serve_app import (AppDeployment, app_messages, app_name_for, delete_app, knows_label_selector,
                                            start_app)
from orchestrator.engines.sim.faults import faults_for_trial
from orchestrator.engines.sim.ingress import SimLLMServer
from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.models.shapes import ModelShape, find_model_config


def sim_resolve(target: EngineTarget, args: EngineArgs) -> EngineArgs:
    return target.with_device_defaults(args)  # a GPU's: validate refuses the simulator on CPU


class _SimDeployment(AppDeployment):
    def __init__(self, name: str, endpoint: EngineEndpoint, teardown_timeout_s: float, direct: bool):
        super().__init__(name, endpoint, teardown_timeout_s)
        self.direct = direct  # the endpoint is the replica's own server, not Serve's proxy

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        # Serve stops listing an application before its replica's process has exited: the
        # replica's own server may still answer then. Gone means its port no longer accepts.
        if self.direct and not _port_closed(self.endpoint.base_url, self.teardown_timeout_s):
            self._problems.append(f"the replica's server {self.endpoint.base_url} still answers "
                                  f"{self.teardown_timeout_s:.0f} s after delete")

    def health(self) -> Optional[str]:
        try:
            with urllib.request.urlopen(self.endpoint.base_url + "/health", timeout=5) as r:
                return None if r.status == 200 else f"/health answered {r.status}"
        except urllib.error.HTTPError as e:  # the engine's own account of its death is in the body
            return f"/health answered {e.code}: {e.read()[:2000].decode(errors='replace')}"
        except Exception as e:  # noqa: BLE001 - the replica is gone: Serve may know why
            why = app_messages(self.name)
            return f"/health failed: {e}" + (f"; Serve: {why}" if why else "")


class ServedSimEngine(Engine):
    kind = "sim"

    def __init__(self, target: EngineTarget, context=None):
        super().__init__(target, context)
        with open(find_model_config(target.model.name, target.base_dir)) as f:
            self.model_config = json.load(f)
        self.model_name = ModelShape.from_config(self.model_config).name

    def resolve(self, args: EngineArgs) -> EngineArgs:
        return sim_resolve(self.target, args)

    def deploy(self, trial_id: str, args: EngineArgs) -> Deployment:
        from ray import serve

        target = self.target
        served = target.model.served_name or target.model.name
        name = app_name_for(trial_id)
        route = f"/{name}"
        actor_options: dict = {"num_cpus": 0, "num_gpus": args.gpus}
        node = leased_node(trial_id, self.context.ledger_name, self.context.namespace)
        if node is not None and knows_label_selector():
            # Exactly where the run's GPU ledger counted this replica (no fragmentation surprises).
            actor_options["label_selector"] = {"ray.io/node-id": node}
        dep = serve.deployment(
            SimLLMServer,
            name="SimLLMServer",
            num_replicas=1,
            max_ongoing_requests=100_000,  # the engine queues; Serve must not
            ray_actor_options=actor_options,
            health_check_period_s=2,
            health_check_timeout_s=10,
            # Nothing to drain after the load window: stop at once.
            graceful_shutdown_wait_loop_s=0.1,
            graceful_shutdown_timeout_s=5,
            # A configuration that cannot start fails the same way every time.
            max_constructor_retry_count=1,
        )
        args_dict = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name != "extra"}
        faults = faults_for_trial(target.engine.faults, args_dict, seed=target.seed, trial_id=trial_id)
        bound = dep.bind(
            model_config=self.model_config, model_name=target.model.name, gpu=target.hardware.gpu,
            engine_args=args_dict, calibration=target.engine.calibration.model_dump(),
            served_model_name=served, startup_s=target.engine.startup_s, dtype=target.model.dtype,
            direct=target.engine.transport == "direct", faults=tuple(f.to_dict() for f in faults),
        )
        t0 = time.monotonic()
        try:
            timeout = target.engine.start_timeout_s or max(60.0, target.engine.startup_s * 3 + 60)
            start_app(bound, name=name, route_prefix=route, timeout_s=timeout)
        except EngineStartError:
            delete_app(name, timeout_s=60)
            raise
        serve_url = self.context.serve_url(route)
        facts = _get_json(serve_url + "/engine_facts")
        base = serve_url
        direct = bool(facts.get("direct_url")) and facts.get("node_ip") == _node_ip()
        if direct:
            base = facts["direct_url"]  # same host: talk to the replica's own server
        endpoint = EngineEndpoint(base_url=base, model=served, metrics_url=base + "/metrics",
                                  startup_s=time.monotonic() - t0, facts=facts, node_ip=facts.get("node_ip"))
        return _SimDeployment(name, endpoint, teardown_timeout_s=60, direct=direct)


def _port_closed(url: str, timeout_s: float) -> bool:
    """True once nothing accepts connections on ``url``'s host and port (within ``timeout_s``)."""

    parts = urlsplit(url)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((parts.hostname, parts.port), timeout=2):
                pass
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _get_json(url: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except Exception as e:  # noqa: BLE001 - the proxy may need a moment to route a new app
            last = e
            time.sleep(0.2)
    raise EngineStartError(FailureKind.START_TIMEOUT, f"{url} did not answer: {last}")
