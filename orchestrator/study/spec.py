"""The study file: what to tune, on what, under which traffic and SLOs.

Strict on input: unknown keys are errors, and every problem is reported as one
line naming the key path, the bad value and what is allowed
(:class:`StudyFileError`). See ``search_spaces/quickstart.yaml`` for an example.

This module is the schema and :func:`parse_study`; :func:`orchestrator.study.load.load_study` reads a file.
Sections with rules of their own live beside it: ``engine`` in :mod:`orchestrator.study.engine`,
``search`` in :mod:`orchestrator.study.search`, ``space`` in :mod:`orchestrator.study.space` and
``workload`` in :mod:`orchestrator.workload.spec`.
Problem lines are formatted by :mod:`orchestrator.study.errors`; the YAML is read by
:mod:`orchestrator.study.file`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from orchestrator.hardware.accelerator import CPU, DeviceDefaults, runs_on_cpu
from orchestrator.hardware.engine_args import EngineArgs, engine_args_from_params
from orchestrator.hardware.gpus import GPUS, get_gpu
from orchestrator.hardware.pricing import GpuHourPrice, gpu_hour_price
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE
from orchestrator.measure.metrics import LOAD_METRIC_NAMES, REQUEST_SLO_FAMILIES, RequestSLO
from orchestrator.models.shapes import ModelShape, find_model_config
from orchestrator.redaction import redact
from orchestrator.strict_model import StrictModel
from orchestrator.study.analysis import AnalysisSettings
from orchestrator.study.capacity import CAPACITY_DEFAULTS_ADDED_LATER, CapacitySpec, SaturationSettings
from orchestrator.study.engine import (ENGINE_SPECS, EngineSpec, ExternalEngineSpec, SimCalibration, SimEngineSpec,
                                       SimFault, VllmEngineSpec, serving_arg_problems)
from orchestrator.study.errors import LocatedError, Problem, StudyFileError, models_by_tag, problems_from_validation
from orchestrator.study.goals import Constraint, Objective, parse_objective
from orchestrator.study.probe import ProbeSpec, probe_problems
from orchestrator.study.search import MAX_SEED, SearchSettings, SearchStage, fidelity_problems, search_problems
from orchestrator.study.space import SearchSpace, space_problems
from orchestrator.study.state_dir import output_problem
from orchestrator.workload.arrivals import is_rate_driven
from orchestrator.workload.spec import (ArrivalSpec, Count, DatasetSpec, LengthSpec, SharedPrefix, TraceSpec,
                                        WarmupSpec, WorkloadSpec)

# What callers import from here, the engine section and the problem types included.
__all__ = [
    "Budget", "CapacitySpec", "Constraint", "EngineSpec", "ExternalEngineSpec", "HardwareSpec", "LocatedError",
    "ModelSpec", "Objective", "Problem", "SaturationSettings", "SearchSettings", "SearchStage", "SimCalibration",
    "SimEngineSpec", "SimFault", "Study", "StudyFileError", "VllmEngineSpec", "parse_objective", "parse_study",
]


class ModelSpec(StrictModel):
    name: str = Field(description="a catalog name (search_spaces/models/NAME.json) or a config.json path")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    served_name: Optional[str] = Field(default=None, description="model id the endpoint serves")

    @field_validator("served_name")
    @classmethod
    def _printable(cls, v: Optional[str]) -> Optional[str]:
        # It goes into command lines and log lines: a line break or NUL would split or cut them.
        if v is not None and not v.isprintable():
            raise ValueError("control characters (line breaks, tabs, NUL, ...) are not allowed; use printable "
                             "characters (letters, digits, punctuation, spaces)")
        return v


class HardwareSpec(StrictModel):
    gpu: str = Field(description="GPU type from the catalog (orchestrator.hardware.gpus)")
    gpus_per_node: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=4096)
    price_per_gpu_hour: Optional[float] = Field(
        default=None, gt=0, description="US dollars per GPU-hour for cost_per_mtok (default: orchestrator.hardware.pricing)")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
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


class Budget(StrictModel):
    trials: Count = Field(default=16, ge=1, le=100_000)
    wall_time_s: Optional[float] = Field(default=None, gt=0)
    max_concurrent_trials: int = Field(default=1, ge=1, le=1024)
    trial_retries: int = Field(default=1, ge=0, le=10,
                               description="reruns of a trial whose process was lost (a node died); a "
                                           "configuration's own failures are recorded, never retried")


DEFAULT_MAX_ERROR_RATE = 0.01


class Study(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
    description: str = ""
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="seeds the workload, the sampler and the probe")
    engine: EngineSpec = SimEngineSpec()
    model: ModelSpec
    hardware: HardwareSpec
    workload: WorkloadSpec = WorkloadSpec()
    space: SearchSpace
    objectives: list[Objective] = Field(min_length=1)
    constraints: list[Constraint] = Field(default_factory=list)
    search: SearchSettings = SearchSettings()
    analysis: AnalysisSettings = AnalysisSettings()
    budget: Budget = Budget()
    capacity: Optional[CapacitySpec] = None
    probe: Optional[ProbeSpec] = Field(default=None, description="reference-agreement probe (orchestrator.trial.probe)")
    max_error_rate: float = Field(default=DEFAULT_MAX_ERROR_RATE, ge=0, lt=1,
                                  description="share of a trial's measured requests that may fail; above it the "
                                              "trial is degraded (kept off the front and out of recommend)")
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
        problems = search_problems(self.search, self.space, self.budget.trials) + probe_problems(self)
        problems += fidelity_problems(self.search, self.engine.kind, self.on_cpu)
        if self.engine.kind == "sim" and self.hardware.gpu == "CPU":  # run would look it up in the GPU catalog
            problems.append(Problem("hardware.gpu", f"the simulated engine models a GPU; name one of the catalog's: "
                                                    f"{', '.join(GPUS)} (CPU is for engine kind vllm, its CPU "
                                                    f"build, or external)", self.hardware.gpu, True))
        if self.engine.kind == "external" and self.search.preflight:  # its engine's arguments are not ours to plan
            problems.append(Problem("search.preflight", "an external endpoint is already running: there is no start "
                                                        "to check before; leave it unset or false", True, True))
        if problems:
            raise LocatedError(problems)
        metrics = [o.metric for o in self.objectives]
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"objectives: each metric at most once, got {metrics}")
        return self

    @model_validator(mode="after")
    def _check_capacity(self):
        if self.capacity is not None and self.workload.trace is None:
            if not is_rate_driven(self.workload.arrival):
                raise ValueError(f"capacity: needs a workload whose rate can be varied (arrival kind poisson, "
                                 f"gamma, constant, ramp or diurnal, or a trace); got arrival kind "
                                 f"{self.workload.arrival.kind!r}")
        return self

    @model_validator(mode="after")
    def _check_output(self, info):
        if not (info.context or {}).get("stored"):  # study.json beside results: read anywhere
            why = output_problem(self.output, self.name)
            if why:
                raise LocatedError([Problem("output", why, self.output, True)])
        return self

    def capacity_slo(self) -> list[Constraint]:
        """What a capacity level must meet: ``capacity.slo``, else the constraints on load metrics."""
        if self.capacity is not None and self.capacity.slo is not None:
            return list(self.capacity.slo)
        return [c for c in self.constraints if c.metric in LOAD_METRIC_NAMES]

    # ---- derived
    @property
    def directions(self) -> list[str]:
        return [o.resolved_direction for o in self.objectives]

    def request_slo(self) -> RequestSLO:
        """Per-request limits for goodput, from constraints on ttft/tpot/e2el percentiles: the
        tightest upper limit of each family, strict (``<``) when a constraint at that value is."""
        limits: dict[str, float] = {}
        strict: set[str] = set()
        for c in self.constraints:
            fam = c.metric.split("_", 1)[0]
            if fam not in REQUEST_SLO_FAMILIES or not c.metric.endswith("_ms") or c.op not in ("<=", "<"):
                continue
            key = f"{fam}_ms"
            if c.value < limits.get(key, math.inf):
                limits[key] = c.value
                strict.discard(fam)
            if c.value == limits[key] and c.op == "<":
                strict.add(fam)
        return RequestSLO(**limits, strict=frozenset(strict))

    def without_secrets(self) -> "Study":
        """This study with its engine's secret values ``***`` (see :mod:`orchestrator.redaction`): what
        the driver hands to objects that Tune pickles into its experiment state. Trials get the
        study itself through Ray's object store, which is never written to disk."""
        engine = self.engine.model_dump(mode="json")
        hidden = redact(engine)
        if hidden == engine:
            return self
        return self.model_copy(update={"engine": type(self.engine).model_validate(hidden)})

    def fingerprint(self) -> str:
        """Hash of what defines the measurements (not the budget): same hash, comparable trials."""
        # Redacted: a rotated token is the same study (and no hash of a secret is recorded).
        body = redact(self.model_dump(mode="json", exclude={"budget", "description", "output", "source_path",
                                                             "search", "analysis"}))
        if body.get("max_error_rate") == DEFAULT_MAX_ERROR_RATE:  # added later: hashed only when set
            body.pop("max_error_rate")
        if body["hardware"].get("price_per_gpu_hour") is None:  # added later: hashed only when set
            body["hardware"].pop("price_per_gpu_hour", None)
        if body.get("probe") is None:  # added later: hashed only when set
            body.pop("probe", None)
        for key in ("sessions", "repetition"):  # added later: hashed only when set
            if (body.get("workload") or {}).get(key, 0) is None:
                body["workload"].pop(key)
        capacity = body.get("capacity") or {}
        for key, default in CAPACITY_DEFAULTS_ADDED_LATER.items():  # hashed only when set
            if key in capacity and capacity[key] == default:
                capacity.pop(key)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def base_dir(self) -> Optional[Path]:
        return Path(self.source_path).parent if self.source_path else None

    @property
    def comparison_confidence(self) -> float:
        """The confidence comparisons of its trials are decided at: the capacity search's, else the intervals'."""
        return self.capacity.confidence if self.capacity is not None else DEFAULT_CONFIDENCE

    @property
    def on_cpu(self) -> bool:
        """Whether the study's engine runs on CPUs (see :func:`~orchestrator.hardware.accelerator.runs_on_cpu`)."""
        return runs_on_cpu(self.engine, self.hardware.gpu)

    @property
    def price(self) -> GpuHourPrice:
        """The GPU-hour price in use: ``hardware.price_per_gpu_hour``, else the list price (:mod:`orchestrator.hardware.pricing`)."""
        return gpu_hour_price(self.hardware.gpu, self.hardware.price_per_gpu_hour)

    @cached_property
    def model_shape(self) -> ModelShape:
        """The model's architecture, read once: the one place a study's model config is loaded."""
        return ModelShape.load(self.model.name, self.base_dir)

    @cached_property
    def device_defaults(self) -> DeviceDefaults:
        """The model on the study's device: the one resolver of engine arguments."""
        gpu = None if self.hardware.gpu.upper() == CPU else get_gpu(self.hardware.gpu)
        return DeviceDefaults(gpu, self.on_cpu, self.model_shape.max_position_embeddings, self.model.dtype)

    def engine_args(self, params: Mapping[str, Any]) -> EngineArgs:
        """A point of the space as engine arguments, beside the engine section's fixed
        ``engine_kwargs`` (not yet resolved for the device)."""
        return engine_args_from_params(dict(params), fixed=dict(getattr(self.engine, "engine_kwargs", None) or {}))

    def with_device_defaults(self, args: EngineArgs) -> EngineArgs:
        """``args`` resolved for the study's model and device (:meth:`DeviceDefaults.resolve`)."""
        return self.device_defaults.resolve(args)


def _model_at(data: Any, loc: tuple[str, ...]) -> Optional[type[BaseModel]]:
    """Best effort: the model describing the mapping at ``loc`` of a study document (for 'allowed keys')."""
    sections = {(): Study, ("model",): ModelSpec, ("hardware",): HardwareSpec, ("workload",): WorkloadSpec,
                ("search",): SearchSettings, ("budget",): Budget, ("capacity",): CapacitySpec, ("probe",): ProbeSpec,
                ("capacity", "saturation"): SaturationSettings}
    if loc in sections:
        return sections[loc]
    if loc == ("engine",):
        kind = (data or {}).get("engine", {}).get("kind", "sim") if isinstance(data, dict) else "sim"
        return ENGINE_SPECS.get(kind)
    if loc[:1] == ("workload",) and len(loc) == 2:
        fixed = {"shared_prefix": SharedPrefix, "warmup": WarmupSpec, "trace": TraceSpec, "dataset": DatasetSpec}
        if loc[1] in fixed:
            return fixed[loc[1]]
        entry = (data or {}).get("workload", {}).get(loc[1], {})
        kind = entry.get("kind") if isinstance(entry, dict) else None
        return _WORKLOAD_KINDS.get(kind)
    if loc == ("engine", "calibration"):
        return SimCalibration
    if len(loc) == 3 and loc[:2] == ("engine", "faults"):
        return SimFault
    if len(loc) == 3 and loc[:2] == ("search", "stages"):
        return SearchStage
    return None


_WORKLOAD_KINDS = {**models_by_tag(ArrivalSpec, "kind"), **models_by_tag(LengthSpec, "kind")}


def parse_study(data: Any, source: str = "<study>", source_path: Optional[str | Path] = None) -> Study:
    """Validate a parsed YAML document; raise :class:`StudyFileError` with every problem.

    ``source_path``: the study file; relative model, trace and dataset paths resolve from its folder.
    """
    if not isinstance(data, dict):
        raise StudyFileError(source, [Problem("", "expected a mapping at the top level", data, True)])
    space = data.get("space")
    if space is None:
        problems = [Problem("space", "required key is missing")]
    elif not isinstance(space, dict) or not space:
        problems = [Problem("space", "expected a non-empty mapping of engine argument -> parameter", space, True)]
    else:
        problems = space_problems(space)
    problems += serving_arg_problems(data)
    base_dir = Path(source_path).resolve().parent if source_path is not None else None
    try:
        study = Study.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as err:
        found = problems_from_validation(err, data, _model_at)
        # space problems were already reported entry by entry
        problems += [p for p in found if not p.path.startswith("space")] if problems else found
        raise StudyFileError(source, problems) from None
    if problems:
        raise StudyFileError(source, problems)
    if source_path is not None:
        study = study.model_copy(update={"source_path": str(Path(source_path).resolve())})
    return study
