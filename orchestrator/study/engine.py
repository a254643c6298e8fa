"""The study file's ``engine`` section: which engine serves the trials, and its settings.

One model per ``engine.kind`` (the simulator, vLLM, an external endpoint), told apart by
that key; :data:`ENGINE_SPECS` maps each kind to its model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from orchestrator.hardware.engine_args import SERVING_ARGS, unknown_engine_arg
from orchestrator.redaction import url_credential_problem
from orchestrator.strict_model import StrictModel
from orchestrator.study.errors import Problem, models_by_tag
from orchestrator.study.space import Scalar


class SimCalibration(StrictModel):
    """Multipliers fitted against real vLLM runs (1.0 = the catalog roofline as is)."""

    compute_efficiency: float = Field(default=1.0, gt=0, le=10)
    bandwidth_efficiency: float = Field(default=1.0, gt=0, le=10)
    step_overhead: float = Field(default=1.0, gt=0, le=100)
    slowdown: float = Field(default=1.0, gt=0, le=100, description="multiplies every step time")
    frontend_latency: float = Field(default=1.0, ge=0, le=100,
                                    description="multiplies the latency outside the engine core (the TTFT offset)")


class SimFault(StrictModel):
    """One failure injected into the simulated engine (chaos testing; see docs/search.md)."""

    kind: Literal["start_crash", "never_ready", "crash", "oom", "ingress_delay"] = Field(
        description="start_crash: the engine dies while starting; never_ready: it never becomes ready (start "
                    "timeout); crash: the engine process exits under load; oom: the engine runs out of memory "
                    "under load; ingress_delay: a slow serving path (streamed chunks pass one at a time)")
    after_s: float = Field(default=0.0, ge=0, le=86_400,
                           description="start_crash: seconds into the start; crash, oom: seconds after the "
                                       "first request; ingress_delay: seconds per streamed chunk")
    after_requests: Optional[int] = Field(default=None, ge=0, le=100_000_000,
                                          description="crash, oom: after this many accepted requests instead")
    probability: float = Field(default=1.0, ge=0, le=1,
                               description="chance a trial gets the fault (drawn from the study seed and trial id)")
    when: Optional[dict[str, Union[Scalar, list[Scalar]]]] = Field(
        default=None, description="only trials whose engine arguments have (one of) these values")

    @field_validator("after_requests")
    @classmethod
    def _requests_for_load_faults(cls, v, info):
        if v is not None and info.data.get("kind") not in ("crash", "oom"):
            raise ValueError(f"applies to kind crash or oom, not {info.data.get('kind')!r}")
        return v

    @field_validator("when")
    @classmethod
    def _engine_args_only(cls, v):
        for name in v or {}:
            why = unknown_engine_arg(name)
            if why:
                raise ValueError(why)
        return v


class SimEngineSpec(StrictModel):
    kind: Literal["sim"] = "sim"
    mode: Literal["served", "virtual"] = Field(
        default="served", description="served: a Ray Serve app in real time; virtual: no HTTP, no sleeping")
    startup_s: float = Field(default=0.0, ge=0, le=3600, description="simulated engine start time (served mode)")
    transport: Literal["direct", "serve"] = Field(
        default="direct", description="direct: HTTP straight to the replica (as vLLM's API server); "
                                      "serve: through Ray Serve's proxy (adds its per-chunk cost)")
    calibration: SimCalibration = SimCalibration()
    start_timeout_s: Optional[float] = Field(default=None, gt=0, le=86_400,
                                             description="served mode; default: 3 x startup_s + 60")
    faults: list[SimFault] = Field(default_factory=list, description="injected failures (served mode)")

    @field_validator("faults")
    @classmethod
    def _faults_need_served(cls, v, info):
        if v and info.data.get("mode") != "served":
            raise ValueError("faults are injected into the served engine; set engine.mode: served")
        return v


class VllmEngineSpec(StrictModel):
    kind: Literal["vllm"] = "vllm"
    platform: Literal["auto", "cuda", "cpu"] = "auto"
    ingress: Literal["engine", "serve_llm"] = Field(
        default="engine",
        description="engine: a Serve replica runs vLLM's own OpenAI server and the load goes to it directly "
                    "(measures the engine); serve_llm: ray.serve.llm's OpenAI ingress (proxy, router, stream "
                    "batching), as deployed in production with ray.serve.llm")
    load_format: Literal["auto", "dummy"] = Field(
        default="auto", description="dummy: random weights from config.json (shape-only runs)")
    model_source: Optional[str] = Field(default=None, description="local model directory (checkpoint or config + tokenizer)")
    start_timeout_s: float = Field(default=900, gt=0)
    teardown_timeout_s: float = Field(default=120, gt=0)
    cpu_kv_cache_gib: int = Field(default=1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="fixed extra engine arguments")
    env: dict[str, str] = Field(default_factory=dict, description="environment of the engine processes")


class ExternalEngineSpec(StrictModel):
    kind: Literal["external"] = "external"
    base_url: str = Field(description="e.g. http://127.0.0.1:8000 (the /v1 routes live under it)")
    model_name: Optional[str] = None
    api_key_env: Optional[str] = Field(default=None, description="environment variable holding the API key")
    metrics_url: Optional[str] = None
    start_timeout_s: float = Field(default=60.0, gt=0, description="how long to wait for /v1/models to answer")

    @field_validator("base_url", "metrics_url")
    @classmethod
    def _plain_url(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http:// or https:// URL with a host")
        why = url_credential_problem(v)
        if why:
            raise ValueError(why)
        return v


EngineSpec = Annotated[Union[SimEngineSpec, VllmEngineSpec, ExternalEngineSpec], Field(discriminator="kind")]
ENGINE_SPECS = models_by_tag(EngineSpec, "kind")


def serving_arg_problems(data: dict) -> list[Problem]:
    """ray.serve.llm's serving-layer parameters exist only behind its ingress (checked on the raw document)."""
    engine = data.get("engine") if isinstance(data.get("engine"), dict) else {}
    if engine.get("kind") == "vllm" and engine.get("ingress") == "serve_llm":
        return []
    where = {"space": data.get("space"), "engine.engine_kwargs": engine.get("engine_kwargs")}
    return [Problem(f"{key}.{name}", "a ray.serve.llm serving-layer setting: needs engine.kind: vllm with "
                                     "engine.ingress: serve_llm")
            for key, table in where.items() if isinstance(table, dict) for name in table if name in SERVING_ARGS]
