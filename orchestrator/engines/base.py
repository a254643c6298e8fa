"""What every engine offers a trial, and in which order a trial calls it.

An engine turns one :class:`~orchestrator.hardware.engine_args.EngineArgs` into something
that serves the OpenAI streaming API (``sim`` and ``vllm`` as Ray Serve
applications, ``external`` as an endpoint that already runs), or, for the virtual
simulator, measures a request set directly without HTTP.
:mod:`orchestrator.engines.registry` says which class runs which ``engine.kind``.

Call order (``orchestrator.trial.run.execute_trial``), one engine object per trial:

1. ``create_engine(target, context)``: reads the :class:`EngineTarget` (what the study asks of the engine,
   read once by :func:`orchestrator.search.trial_plan.engine_target`); starts nothing.
2. :meth:`Engine.resolve`: the trial's arguments with the defaults the engine would
   choose on the study's hardware filled in. These are the arguments recorded in the
   row and checked by the pre-flight (:mod:`orchestrator.search.feasibility`).
3. Engines with ``serves_http``:

   a. :meth:`Engine.resources`: what one replica holds (``resource`` x ``amount`` on
      one node, ``amount`` = TP x PP for engines that deploy); the trial leases it
      from the run's ledger before deploying, and returns it after teardown.
   b. :meth:`Engine.deploy`: start the engine and return once its endpoint answers.
      A configuration that cannot start raises
      :class:`~orchestrator.failures.EngineStartError` with nothing left running.
   c. Inside ``with deployment:`` the trial reads :attr:`Deployment.endpoint`, warms
      the engine up and runs the load (every load level of a capacity search) against
      ``endpoint.base_url``, sampling ``endpoint.metrics_url``; the engine object is
      not called meanwhile.
   d. :meth:`Deployment.health` once after the load (None: alive).
   e. Leaving the ``with`` block tears the engine down and waits until it is gone
      (application deleted, processes exited, resources released); it never raises.
      :meth:`Deployment.teardown_problems` then says what was not released.

4. Engines without ``serves_http`` (virtual time): :meth:`Engine.measure` once per
   load level instead of 3; it raises ``EngineStartError`` where the real engine
   would not start.

``tests/engines/test_engine_conformance.py`` holds every engine to this contract.
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from orchestrator.hardware.accelerator import DeviceDefaults
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.measure.measurement import LevelMeasurement
from orchestrator.models.shapes import ModelShape
from orchestrator.study.engine import EngineSpec
from orchestrator.study.spec import HardwareSpec, ModelSpec

if TYPE_CHECKING:
    from orchestrator.workload.request_set import RequestSet


@dataclass(frozen=True)
class EngineTarget:
    """What an engine serves and on what: the study's ``engine``, ``model`` and ``hardware``
    sections and what follows from them, read once. Engines read this, never the study."""

    engine: EngineSpec
    model: ModelSpec
    hardware: HardwareSpec
    model_shape: ModelShape
    device_defaults: DeviceDefaults
    state_dir: Path  # the study's local state (a generated model directory lives there)
    base_dir: Optional[Path] = None  # the study file's folder: relative model paths
    seed: int = 0  # the study's seed (injected faults draw from it)
    request_timeout_s: float = 120.0  # a request's timeout (the virtual simulator's too)

    @property
    def on_cpu(self) -> bool:
        return self.device_defaults.on_cpu

    def with_device_defaults(self, args: EngineArgs) -> EngineArgs:
        """``args`` resolved for the model on the device (:meth:`DeviceDefaults.resolve`)."""
        return self.device_defaults.resolve(args)


@dataclass(frozen=True)
class ResourceRequest:
    """What one replica holds while a trial runs (``resource`` is a Ray resource name)."""

    resource: str  # "GPU" or "CPU"
    amount: int


@dataclass
class EngineEndpoint:
    """A running engine as the load generator and the telemetry see it."""

    base_url: str  # the /v1 routes live under it
    model: str
    metrics_url: Optional[str] = None  # Prometheus text; vLLM metric names
    metric_prefix: str = "vllm:"
    # Only metric samples with these labels (several engines may share one metrics endpoint).
    metric_labels: dict[str, str] = field(default_factory=dict)
    # NVML sampling on the trial's node: off, or these GPU indices (None with sample_nvml: all).
    sample_nvml: bool = False
    gpu_indices: Optional[list[int]] = None
    startup_s: Optional[float] = None
    facts: dict[str, Any] = field(default_factory=dict)  # kv_cache_tokens, kv_cache_gib, ...
    api_key: Optional[str] = None
    node_ip: Optional[str] = None  # where the replica runs (for NVML sampling)
    pids: list[int] = field(default_factory=list)  # engine processes (to check they are gone)


class Deployment(AbstractContextManager):
    """A started engine; leaving the ``with`` block tears it down and verifies it is gone.

    ``__exit__`` must not raise: what it could not release goes to :meth:`teardown_problems`.
    """

    endpoint: EngineEndpoint

    def health(self) -> Optional[str]:
        """None if the engine is alive, else why it is not (used after a failed load)."""
        return None

    def teardown_problems(self) -> list[str]:
        """Problems seen while tearing down (leaked processes, memory not released)."""
        return []


@dataclass(frozen=True)
class EngineContext:
    """What a study run tells its engines (picklable; built from the trial context): where Serve's
    proxy listens, and the run's GPU ledger a replica is pinned by. Passed in, never read from
    the environment."""

    serve_host: str = "127.0.0.1"
    serve_port: int = 8000
    ledger_name: Optional[str] = None  # the run's GPU ledger actor (None: no pinning)
    namespace: str = "orchestrator"

    def serve_url(self, route_prefix: str) -> str:
        return f"http://{self.serve_host}:{self.serve_port}{route_prefix}"


class Engine(abc.ABC):
    """One study's engine; the module docstring gives the order a trial calls it in."""

    kind: ClassVar[str]  # the study file's engine.kind
    #: True: ``deploy`` gives an HTTP endpoint. False: ``measure`` computes records directly.
    serves_http: ClassVar[bool] = True
    #: True: ``deploy`` runs a Ray Serve application (the run starts Serve first and deletes its
    #: applications at the end). False: the endpoint is not ours (``external``): no Serve at all.
    deploys_on_serve: ClassVar[bool] = True

    def __init__(self, target: EngineTarget, context: Optional[EngineContext] = None):
        self.target = target
        self.context = context or EngineContext()

    @abc.abstractmethod
    def resolve(self, args: EngineArgs) -> EngineArgs:
        """Fill the defaults the real engine would choose on the study's hardware."""

    def resources(self, args: EngineArgs) -> ResourceRequest:
        """What one replica holds while the trial runs (``amount`` 0: nothing to lease)."""
        return ResourceRequest("GPU", args.gpus)

    def deploy(self, trial_id: str, args: EngineArgs) -> Deployment:
        """Start the engine and wait until it answers; raise EngineStartError if it cannot.

        ``trial_id`` names what is deployed (one Serve application per trial), so that
        concurrent trials never share an engine.
        """
        raise NotImplementedError

    def measure(self, args: EngineArgs, requests: "RequestSet") -> LevelMeasurement:
        """Direct measurement without HTTP (virtual engines): the records, the engine's side, the warm-up."""
        raise NotImplementedError

