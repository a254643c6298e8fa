"""What every engine offers a trial: resources, a deployment with an endpoint, teardown.

An engine turns one :class:`~orchestrator.engine_args.EngineArgs` into something
that serves the OpenAI streaming API (``sim`` and ``vllm`` as Ray Serve
applications, ``external`` as an endpoint that already runs), or, for the virtual
simulator, measures a request set directly without HTTP.
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from orchestrator.engine_args import EngineArgs

if TYPE_CHECKING:
    from orchestrator.records import RequestRecord
    from orchestrator.study import Study
    from orchestrator.workload.requests import RequestSet


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
    """A started engine; leaving the ``with`` block tears it down and verifies it is gone."""

    endpoint: EngineEndpoint

    def health(self) -> Optional[str]:
        """None if the engine is alive, else why it is not (used after a failed load)."""
        return None

    def teardown_problems(self) -> list[str]:
        """Problems seen while tearing down (leaked processes, memory not released)."""
        return []


class Engine(abc.ABC):
    kind: ClassVar[str]
    #: True: ``deploy`` gives an HTTP endpoint. False: ``measure`` computes records directly.
    serves_http: ClassVar[bool] = True

    def __init__(self, study: "Study"):
        self.study = study

    @abc.abstractmethod
    def resolve(self, args: EngineArgs) -> EngineArgs:
        """Fill the defaults the real engine would choose on the study's hardware."""

    def resources(self, args: EngineArgs) -> ResourceRequest:
        return ResourceRequest("GPU", args.gpus)

    def deploy(self, trial_id: str, args: EngineArgs) -> Deployment:
        """Start the engine and wait until it answers; raise EngineStartError if it cannot."""
        raise NotImplementedError

    def measure(self, args: EngineArgs, requests: "RequestSet") -> tuple[list["RequestRecord"], dict[str, Any]]:
        """Direct measurement without HTTP (virtual engines): records and telemetry."""
        raise NotImplementedError

