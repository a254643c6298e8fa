"""The study file: what to tune, on what, under which traffic and SLOs.

Strict on input: unknown keys are errors, and every problem is reported as one
line naming the key path, the bad value and what is allowed
(:class:`StudyFileError`). See ``search_spaces/quickstart.yaml`` for an example.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from orchestrator.metrics import DIRECTIONS, RequestSLO, default_direction, known_metric_names
from orchestrator.space import Scalar, SearchSpace
from orchestrator.workload.spec import WorkloadSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ------------------------------------------------------------------ engines
class SimCalibration(_Strict):
    """Multipliers fitted against real vLLM runs (1.0 = the catalog roofline as is)."""

    compute_efficiency: float = Field(default=1.0, gt=0, le=10)
    bandwidth_efficiency: float = Field(default=1.0, gt=0, le=10)
    step_overhead: float = Field(default=1.0, gt=0, le=100)
    slowdown: float = Field(default=1.0, gt=0, le=100, description="multiplies every step time")


class SimFault(_Strict):
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
        from orchestrator.engine_args import ENGINE_ARG_RULES, TUNABLE_ENGINE_ARGS

        for name in v or {}:
            if name not in ENGINE_ARG_RULES:
                close = difflib.get_close_matches(str(name), TUNABLE_ENGINE_ARGS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown engine argument {name!r}{hint}; allowed: "
                                 + ", ".join(TUNABLE_ENGINE_ARGS))
        return v


class SimEngineSpec(_Strict):
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


class VllmEngineSpec(_Strict):
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


class ExternalEngineSpec(_Strict):
    kind: Literal["external"] = "external"
    base_url: str = Field(description="e.g. http://127.0.0.1:8000 (the /v1 routes live under it)")
    model_name: Optional[str] = None
    api_key_env: Optional[str] = Field(default=None, description="environment variable holding the API key")
    metrics_url: Optional[str] = None
    start_timeout_s: float = Field(default=60.0, gt=0, description="how long to wait for /v1/models to answer")

    @field_validator("base_url")
    @classmethod
    def _plain_url(cls, v: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("credentials do not belong in the URL (it is recorded); put the key in an "
                             "environment variable and name it in api_key_env")
        return v


EngineSpec = Annotated[Union[SimEngineSpec, VllmEngineSpec, ExternalEngineSpec], Field(discriminator="kind")]


# ------------------------------------------------------------------ the rest
class ModelSpec(_Strict):
    name: str = Field(description="a catalog name (search_spaces/models/NAME.json) or a config.json path")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    served_name: Optional[str] = Field(default=None, description="model id the endpoint serves")


class HardwareSpec(_Strict):
    gpu: str = Field(description="GPU type from the catalog (orchestrator.sim.hardware)")
    gpus_per_node: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=4096)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        from orchestrator.sim.hardware import GPUS, get_gpu

        if v.upper() == "CPU":
            return "CPU"
        try:
            return get_gpu(v).name
        except KeyError:
            close = difflib.get_close_matches(v, list(GPUS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown GPU{hint}; allowed: {', '.join(GPUS)}, CPU") from None

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def parse_objective(text: str) -> tuple[str, Optional[str]]:
    """``"maximize NAME"`` -> ``(NAME, "maximize")``; a bare ``"NAME"`` -> ``(NAME, None)`` (default direction)."""
    parts = text.split()
    if len(parts) == 2 and parts[0] in DIRECTIONS:
        return parts[1], parts[0]
    if len(parts) == 1:
        return parts[0], None
    raise ValueError(f"cannot read objective {text!r}; expected 'COLUMN' or 'maximize|minimize COLUMN'")


class Objective(_Strict):
    metric: str
    direction: Optional[Literal["maximize", "minimize"]] = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        if isinstance(data, str):  # "maximize output_throughput"
            try:
                metric, direction = parse_objective(data)
            except ValueError:  # reported by the metric check, with the closest known metric
                return {"metric": data}
            return {"metric": metric} | ({"direction": direction} if direction else {})
        return data

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        return _check_metric(v)

    @property
    def resolved_direction(self) -> str:
        return self.direction or default_direction(self.metric)


_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


class Constraint(_Strict):
    """An SLO on a trial metric, e.g. ``ttft_p99_ms <= 200``."""

    metric: str
    op: Literal["<=", ">=", "<", ">"]
    value: float

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data):
        if isinstance(data, str):
            m = _CONSTRAINT_RE.match(data)
            if not m:
                raise ValueError(f"cannot parse {data!r}; expected 'METRIC <= NUMBER' (or >=, <, >)")
            return {"metric": m.group(1), "op": m.group(2), "value": float(m.group(3))}
        return data

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        return _check_metric(v)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"

    def violation(self, value: Optional[float]) -> float:
        """Optuna constraint value: <= 0 when met, else the relative excess."""
        if value is None:
            return 1.0
        scale = max(abs(self.value), 1e-9)
        if self.op in ("<=", "<"):
            return (value - self.value) / scale
        return (self.value - value) / scale

    def met(self, value: Optional[float]) -> bool:
        if value is None:
            return False
        return {"<=": value <= self.value, "<": value < self.value,
                ">=": value >= self.value, ">": value > self.value}[self.op]


class SearchStage(_Strict):
    """One step of a staged search: its parameters are searched while the others are held."""

    name: Optional[str] = Field(default=None, max_length=100)
    params: list[str] = Field(min_length=1, description="searched in this stage (each parameter in one stage)")
    trials: Optional[int] = Field(default=None, ge=1, le=100_000,
                                  description="trials of this stage; the last stage may leave it out (the rest)")


class SearchSettings(_Strict):
    sampler: Literal["tpe", "nsga2", "gp", "random", "grid"] = "tpe"
    seed: Optional[int] = Field(default=None, description="sampler seed; default: the study's seed")
    n_startup_trials: Optional[int] = Field(default=None, ge=0, description="random trials before the model kicks in")
    warm_start: list[str] = Field(default_factory=list, description="result datasets whose best points are tried first")
    initial_points: list[dict[str, Any]] = Field(
        default_factory=list, description="configurations tried first, in order (e.g. today's hand-tuned setting)")
    warm_start_trials: Optional[int] = Field(default=None, ge=0, le=100_000,
                                             description="most warm-start points tried; default: half the budget")
    stages: list[SearchStage] = Field(
        default_factory=list, description="staged search: parameter groups searched one after another")
    preflight: Optional[bool] = Field(
        default=None, description="skip configurations that cannot fit in memory before starting them; "
                                  "default: on for real engines, off for the sim (its start is the same arithmetic)")


class SaturationSettings(_Strict):
    """When a capacity level counts as saturated (queue growing without bound) and stops early."""

    window_s: float = Field(default=5.0, gt=0, description="trailing window the backlog growth is measured over "
                                                           "(at least twice the median latency)")
    check_interval_s: float = Field(default=0.5, gt=0, le=60)
    min_growth: int = Field(default=8, ge=1, description="the backlog must grow by at least this many requests")
    growth_fraction: float = Field(default=0.25, gt=0, le=1,
                                   description="... and by this share of the requests sent in the window")
    confirm: int = Field(default=2, ge=1, le=100, description="consecutive windows the backlog must grow in")


class CapacitySpec(_Strict):
    """Capacity search: one deployment, several load levels, the highest rate that meets the SLOs."""

    start_rate: Optional[float] = Field(default=None, gt=0, description="first level (default: the workload's rate)")
    min_rate: float = Field(default=0.1, gt=0)
    max_rate: float = Field(default=1000.0, gt=0)
    growth: float = Field(default=2.0, gt=1, le=16, description="rate factor between levels until one fails")
    tolerance: float = Field(default=0.05, gt=0, lt=1,
                             description="stop when (lowest failing - highest passing) / lowest failing <= this")
    max_levels: int = Field(default=10, ge=1, le=100)
    requests_per_level: Optional[int] = Field(default=None, ge=1, le=1_000_000,
                                              description="default: workload.num_requests")
    level_duration_s: Optional[float] = Field(default=None, gt=0,
                                              description="requests per level = rate x this (instead of a count)")
    min_requests: int = Field(default=20, ge=1, description="fewest requests of a level (with level_duration_s)")
    max_error_rate: float = Field(default=0.0, ge=0, lt=1, description="share of failed requests a level may have")
    slo: Optional[list[Constraint]] = Field(
        default=None, description="what a level must meet; default: the study's constraints on load metrics")
    saturation: SaturationSettings = SaturationSettings()

    @field_validator("slo")
    @classmethod
    def _load_metrics_only(cls, v):
        from orchestrator.metrics import LOAD_METRIC_NAMES

        for c in v or []:
            if c.metric not in LOAD_METRIC_NAMES:
                raise ValueError(f"{c.metric} is not measured per level; use a load metric "
                                 f"(e.g. ttft_p99_ms, tpot_p50_ms, e2el_p99_ms, goodput)")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.min_rate >= self.max_rate:
            raise ValueError(f"min_rate ({self.min_rate:g}) must be < max_rate ({self.max_rate:g})")
        if self.requests_per_level is not None and self.level_duration_s is not None:
            raise ValueError("give requests_per_level or level_duration_s, not both")
        if self.start_rate is not None and not self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError(f"start_rate ({self.start_rate:g}) must lie in [min_rate, max_rate]")
        return self


class Budget(_Strict):
    trials: int = Field(default=16, ge=1, le=100_000)
    wall_time_s: Optional[float] = Field(default=None, gt=0)
    max_concurrent_trials: int = Field(default=1, ge=1, le=1024)
    trial_retries: int = Field(default=1, ge=0, le=10,
                               description="reruns of a trial whose process was lost (a node died); a "
                                           "configuration's own failures are recorded, never retried")


class Study(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
    description: str = ""
    seed: int = 0
    engine: EngineSpec = SimEngineSpec()
    model: ModelSpec
    hardware: HardwareSpec
    workload: WorkloadSpec = WorkloadSpec()
    space: SearchSpace
    objectives: list[Objective] = Field(min_length=1)
    constraints: list[Constraint] = Field(default_factory=list)
    search: SearchSettings = SearchSettings()
    budget: Budget = Budget()
    capacity: Optional[CapacitySpec] = None
    output: str = Field(default="results", description="local path or pyarrow filesystem URI (s3://, gs://)")

    # Set by load_study: where the file lives (relative model paths resolve from there).
    source_path: Optional[str] = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _objective_shorthand(cls, data):
        if isinstance(data, dict) and isinstance(data.get("objectives"), (str, dict)):
            data = {**data, "objectives": [data["objectives"]]}
        return data

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: ModelSpec, info) -> ModelSpec:
        from orchestrator.sim.models import find_model_config

        context = info.context or {}
        if context.get("stored"):  # study.json beside results: the model was found when it ran
            return v
        base_dir = context.get("base_dir")  # the study file's folder (see parse_study)
        try:
            find_model_config(v.name, Path(base_dir) if base_dir is not None else None)
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _check(self):
        problems = _search_problems(self)
        if problems:
            raise LocatedError(problems)
        metrics = [o.metric for o in self.objectives]
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"objectives: each metric at most once, got {metrics}")
        return self

    @model_validator(mode="after")
    def _check_capacity(self):
        if self.capacity is not None and self.workload.trace is None:
            from orchestrator.workload.arrivals import is_rate_driven

            if not is_rate_driven(self.workload.arrival):
                raise ValueError(f"capacity: needs a workload whose rate can be varied (arrival kind poisson, "
                                 f"gamma, constant, ramp or diurnal, or a trace); got arrival kind "
                                 f"{self.workload.arrival.kind!r}")
        return self

    def capacity_slo(self) -> list[Constraint]:
        """What a capacity level must meet: ``capacity.slo``, else the constraints on load metrics."""
        from orchestrator.metrics import LOAD_METRIC_NAMES

        if self.capacity is not None and self.capacity.slo is not None:
            return list(self.capacity.slo)
        return [c for c in self.constraints if c.metric in LOAD_METRIC_NAMES]

    # ---- derived
    @property
    def directions(self) -> list[str]:
        return [o.resolved_direction for o in self.objectives]

    def request_slo(self) -> RequestSLO:
        """Per-request limits for goodput, from constraints on ttft/tpot/e2el percentiles."""
        limits: dict[str, float] = {}
        for c in self.constraints:
            fam = c.metric.split("_", 1)[0]
            if fam in ("ttft", "tpot", "e2el") and c.metric.endswith("_ms") and c.op in ("<=", "<"):
                key = f"{fam}_ms"
                limits[key] = min(limits.get(key, float("inf")), c.value)
        return RequestSLO(**limits)

    def fingerprint(self) -> str:
        """Hash of what defines the measurements (not the budget): same hash, comparable trials."""
        body = self.model_dump(mode="json", exclude={"budget", "description", "output", "source_path", "search"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def base_dir(self) -> Optional[Path]:
        return Path(self.source_path).parent if self.source_path else None


class LocatedError(ValueError):
    """Cross-field problems that already know their key paths (kept as such in the report)."""

    def __init__(self, problems: list["Problem"]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def _search_problems(study: "Study") -> list["Problem"]:
    """``search`` keys that depend on the space and the budget."""
    s, space = study.search, study.space
    names = list(space.params)
    problems: list[Problem] = []
    for i, point in enumerate(s.initial_points):
        for name, value in point.items():
            spec = space.params.get(name)
            if spec is None:
                problems.append(Problem(f"search.initial_points.{i}.{name}",
                                        f"not a parameter of the space; parameters: {', '.join(names)}"))
            elif not spec.allows(value):
                problems.append(Problem(f"search.initial_points.{i}.{name}", f"not in the space: {spec.allowed()}",
                                        value, True))
    if not s.stages:
        return problems
    if s.sampler == "grid":
        problems.append(Problem("search.stages", "not with sampler 'grid' (it enumerates every combination); "
                                                 "allowed samplers: tpe, nsga2, gp, random", s.sampler, True))
    sampled = set(space.sampled_names())
    owner: dict[str, int] = {}
    for i, stage in enumerate(s.stages):
        for name in stage.params:
            if name not in space.params:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(Problem(f"search.stages.{i}.params", f"not a parameter of the space{hint}; "
                                        f"parameters: {', '.join(names)}", name, True))
            elif name not in sampled:
                problems.append(Problem(f"search.stages.{i}.params", "a fixed parameter has nothing to search; "
                                        f"searched parameters: {', '.join(sorted(sampled))}", name, True))
            elif name in owner:
                problems.append(Problem(f"search.stages.{i}.params", f"already in stage {owner[name]}; "
                                        "each parameter belongs to one stage", name, True))
            else:
                owner[name] = i
        if stage.trials is None and i < len(s.stages) - 1:
            problems.append(Problem(f"search.stages.{i}.trials", "required key is missing (only the last stage "
                                                                 "may leave it out: it gets the rest of the budget)"))
    missing = sorted(sampled - set(owner))
    if missing:
        problems.append(Problem("search.stages", "searched parameters in no stage: " + ", ".join(missing)
                                + " (each searched parameter belongs to exactly one stage)"))
    planned = sum(st.trials or 0 for st in s.stages)
    rest = study.budget.trials - planned
    if rest < 0 or (rest == 0 and s.stages[-1].trials is None):
        problems.append(Problem("search.stages", f"the stages need {planned} trials"
                                + (" and the last stage at least one more" if s.stages[-1].trials is None else "")
                                + f"; budget.trials is {study.budget.trials}"))
    return problems


def _check_metric(v: str) -> str:
    names = known_metric_names()
    if v not in names:
        close = difflib.get_close_matches(v, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown metric{hint}; allowed: {', '.join(sorted(names))}")
    return v


# ------------------------------------------------------------------ loading
@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    value: Any = None
    has_value: bool = False

    def __str__(self) -> str:
        got = f" (got {_short(self.value)})" if self.has_value else ""
        return _one_line(f"{self.path or '<root>'}: {self.message}{got}")


def _one_line(text: str) -> str:
    """Control characters (line breaks included) escaped: a problem is always one printable line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class StudyFileError(Exception):
    """A study file that cannot be used; ``problems`` holds one entry per bad key."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return [n for n, f in model.model_fields.items() if not f.exclude]


_ALLOWED_AT = {
    (): Study, ("engine",): None, ("model",): ModelSpec, ("hardware",): HardwareSpec, ("workload",): WorkloadSpec,
    ("search",): SearchSettings, ("budget",): Budget, ("capacity",): CapacitySpec,
    ("capacity", "saturation"): SaturationSettings,
}


def _problems_from_validation(err: ValidationError, data: Any) -> list[Problem]:
    problems = []
    for e in err.errors(include_url=False):
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, LocatedError):
            problems.extend(cause.problems)
            continue
        loc = _data_path(data, [str(x) for x in e["loc"]])
        msg = e["msg"].removeprefix("Value error, ")
        etype = e["type"]
        path = ".".join(loc)
        if etype == "extra_forbidden":
            parent = tuple(loc[:-1])
            model = _ALLOWED_AT.get(parent)
            if model is None:
                model = _model_for_path(data, parent)
            allowed = _allowed_keys(model) if model is not None else []
            close = difflib.get_close_matches(loc[-1], allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msg = f"unknown key{hint}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
            problems.append(Problem(path, msg))
            continue
        if etype == "missing":
            problems.append(Problem(path, "required key is missing"))
            continue
        if etype in ("union_tag_invalid", "literal_error"):
            ctx = e.get("ctx") or {}
            expected = ctx.get("expected_tags") or ctx.get("expected")
            if expected:
                msg = f"not allowed; expected one of {expected}"
        problems.append(Problem(path, msg, e.get("input"), has_value="input" in e and etype != "missing"))
    return problems


def _data_path(data: Any, loc: list[str]) -> list[str]:
    """Drop pydantic's union-member tags (``engine.sim.x`` -> ``engine.x``) from an error location."""
    out: list[str] = []
    cur = data
    for seg in loc:
        if seg.startswith(("function-", "tagged-union[")):
            continue
        if isinstance(cur, dict):
            if seg in cur:
                cur = cur[seg]
                out.append(seg)
            elif cur.get("kind") == seg or cur.get("type") == seg or seg in ("int", "str", "float", "bool"):
                continue
            else:
                out.append(seg)
                cur = None
        elif isinstance(cur, list) and seg.isdigit() and int(seg) < len(cur):
            cur = cur[int(seg)]
            out.append(seg)
        elif cur is None:
            out.append(seg)
        else:
            break  # a shorthand scalar (``output_len: 0``): report at its key
    return out


def _model_for_path(data: Any, loc: tuple[str, ...]):
    """Best effort: the pydantic model describing the mapping at ``loc`` (for 'allowed keys')."""
    from orchestrator import space as space_mod
    from orchestrator.workload import spec as wl

    if loc == ("engine",):
        kind = (data or {}).get("engine", {}).get("kind", "sim") if isinstance(data, dict) else "sim"
        return {"sim": SimEngineSpec, "vllm": VllmEngineSpec, "external": ExternalEngineSpec}.get(kind)
    if len(loc) == 2 and loc[0] == "space":
        entry = (data or {}).get("space", {}).get(loc[1], {})
        kind = entry.get("type") if isinstance(entry, dict) else None
        return {"int": space_mod.IntParam, "float": space_mod.FloatParam,
                "categorical": space_mod.CategoricalParam, "fixed": space_mod.FixedParam}.get(kind)
    if loc[:1] == ("workload",) and len(loc) == 2:
        entry = (data or {}).get("workload", {}).get(loc[1], {})
        kind = entry.get("kind") if isinstance(entry, dict) else None
        table = {"poisson": wl.PoissonArrival, "gamma": wl.GammaArrival, "constant": wl.ConstantArrival,
                 "concurrency": wl.ConcurrencyArrival, "burst": wl.BurstArrival, "ramp": wl.RampArrival,
                 "diurnal": wl.DiurnalArrival, "fixed": wl.FixedLength,
                 "uniform": wl.UniformLength, "normal": wl.NormalLength, "lognormal": wl.LognormalLength,
                 "choice": wl.ChoiceLength}
        if loc[1] == "shared_prefix":
            return wl.SharedPrefix
        if loc[1] == "warmup":
            return wl.WarmupSpec
        if loc[1] in ("trace", "dataset"):
            return wl.TraceSpec if loc[1] == "trace" else wl.DatasetSpec
        return table.get(kind)
    if loc[:1] == ("engine",) and loc[1:] == ("calibration",):
        return SimCalibration
    if len(loc) == 3 and loc[:2] == ("engine", "faults"):
        return SimFault
    if len(loc) == 3 and loc[:2] == ("search", "stages"):
        return SearchStage
    return None


def _space_problems(raw: Any) -> list[Problem]:
    """Validate ``space`` entry by entry so each problem names its parameter."""
    from orchestrator.engine_args import ENGINE_ARG_RULES, TUNABLE_ENGINE_ARGS, validate_engine_arg
    from orchestrator.space import ParamSpec, _bounds_to_check, _shorthand

    if raw is None:
        return [Problem("space", "required key is missing")]
    if not isinstance(raw, dict) or not raw:
        return [Problem("space", "expected a non-empty mapping of engine argument -> parameter", raw, True)]
    problems: list[Problem] = []
    adapter = TypeAdapter(ParamSpec)
    parsed = {}
    for name, value in raw.items():
        if name not in ENGINE_ARG_RULES:
            close = difflib.get_close_matches(str(name), TUNABLE_ENGINE_ARGS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(Problem(f"space.{name}", f"unknown engine argument{hint}; allowed: "
                                    + ", ".join(TUNABLE_ENGINE_ARGS)))
            continue
        try:
            p = adapter.validate_python(_shorthand(value))
        except ValidationError as err:
            for pr in _problems_from_validation(err, _shorthand(value)):
                sub = pr.path
                path = f"space.{name}" + (f".{sub}" if sub else "")
                if sub and pr.message.startswith("unknown key"):
                    model = _model_for_path({"space": {name: _shorthand(value)}}, ("space", name))
                    allowed = _allowed_keys(model) if model else []
                    pr = Problem(path, "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else ""))
                    problems.append(pr)
                else:
                    problems.append(Problem(path, pr.message, pr.value, pr.has_value))
            continue
        parsed[name] = p
        for v in _bounds_to_check(p):
            why = validate_engine_arg(name, v)
            if why:
                problems.append(Problem(f"space.{name}", f"value not allowed for {name}: {why}", v, True))
                break
    for name, p in parsed.items():
        for other in (p.when or {}):
            if other not in raw:
                problems.append(Problem(f"space.{name}.when.{other}", "condition on an unknown parameter; parameters: "
                                        + ", ".join(map(str, raw))))
    if not problems:
        try:
            SearchSpace.model_validate(raw)
        except ValidationError as err:
            for e in err.errors(include_url=False):
                problems.append(Problem("space", e["msg"].removeprefix("Value error, ")))
    return problems


def _serving_arg_problems(data: dict) -> list[Problem]:
    """ray.serve.llm's serving-layer parameters exist only behind its ingress."""
    from orchestrator.engine_args import SERVING_ARGS

    engine = data.get("engine") if isinstance(data.get("engine"), dict) else {}
    if engine.get("kind") == "vllm" and engine.get("ingress") == "serve_llm":
        return []
    where = {"space": data.get("space"), "engine.engine_kwargs": engine.get("engine_kwargs")}
    return [Problem(f"{key}.{name}", "a ray.serve.llm serving-layer setting: needs engine.kind: vllm with "
                                     "engine.ingress: serve_llm")
            for key, table in where.items() if isinstance(table, dict) for name in table if name in SERVING_ARGS]


def parse_study(data: Any, source: str = "<study>", source_path: Optional[str | Path] = None) -> Study:
    """Validate a parsed YAML document; raise :class:`StudyFileError` with every problem.

    ``source_path``: the study file; relative model, trace and dataset paths resolve from its folder.
    """
    if not isinstance(data, dict):
        raise StudyFileError(source, [Problem("", "expected a mapping at the top level", data, True)])
    problems = _space_problems(data.get("space")) + _serving_arg_problems(data)
    base_dir = Path(source_path).resolve().parent if source_path is not None else None
    try:
        study = Study.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as err:
        found = _problems_from_validation(err, data)
        # space problems were already reported entry by entry
        problems += [p for p in found if not p.path.startswith("space")] if problems else found
        raise StudyFileError(source, problems) from None
    if problems:
        raise StudyFileError(source, problems)
    if source_path is not None:
        study = study.model_copy(update={"source_path": str(Path(source_path).resolve())})
    return study


class _DuplicateKeys(yaml.YAMLError):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(map(str, problems)))


class _StudyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, except that a key given twice in one mapping is an error (YAML keeps the last)."""

    def construct_document(self, node):
        problems: list[Problem] = []
        self._check_keys(node, [], problems, set())
        if problems:
            raise _DuplicateKeys(problems)
        return super().construct_document(node)

    def _check_keys(self, node, path: list[str], problems: list[Problem], seen: set[int]) -> None:
        if id(node) in seen:  # an alias of a node already walked (or a recursive anchor)
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check_keys(item, path + [str(i)], problems, seen)
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # merged entries may be overridden
                    self._check_keys(value_node, path, problems, seen)
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                try:
                    key = self.construct_object(key_node)
                    hash(key)
                except Exception:  # noqa: BLE001 - an unusual key: compare its text
                    key = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                key_path = ".".join(path + [str(key)])
                if key in first:
                    problems.append(Problem(key_path, f"duplicate key on line {line} (first on line {first[key]}); "
                                                      "YAML would keep only the last, so give each key once"))
                else:
                    first[key] = line
                self._check_keys(value_node, path + [str(key)], problems, seen)


def load_study(path: str | Path) -> Study:
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise StudyFileError(source, [Problem("", "file not found")])
    try:
        data = yaml.load(path.read_text(), Loader=_StudyLoader)  # noqa: S506 - a SafeLoader
    except _DuplicateKeys as e:
        raise StudyFileError(source, e.problems) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise StudyFileError(source, [Problem("", f"{where}not valid YAML: {getattr(e, 'problem', e)}")]) from None
    except UnicodeDecodeError:
        raise StudyFileError(source, [Problem("", "not a text file")]) from None
    study = parse_study(data, source, source_path=path)
    problems = workload_file_problems(study)
    if problems:
        raise StudyFileError(source, problems)
    return study


def workload_file_problems(study: Study) -> list[Problem]:
    """A trace or dataset file that is missing or malformed (one problem naming its file and line)."""
    wl = study.workload
    if wl.trace is None and wl.dataset is None:
        return []
    from orchestrator.workload.generate import load_entries
    from orchestrator.workload.trace import TraceError, select_window

    key = "workload.trace.path" if wl.trace is not None else "workload.dataset.path"
    try:
        entries = load_entries(wl, study.base_dir)
        if wl.trace is not None:
            select_window(entries, start_s=wl.trace.start_s, end_s=wl.trace.end_s, max_requests=wl.trace.max_requests)
    except TraceError as e:
        return [Problem(key, str(e))]
    return []
