"""The study file's ``probe`` section: the reference-agreement probe, and its checks.

A probe sends a fixed, seeded prompt set through every trial's engine (greedy, with
logprobs, outside the measured load window) and compares the answers with the study's
baseline configuration (:mod:`orchestrator.trial.probe`). Its metrics (``token_agreement``, ...)
may then be objectives or constraints like any other column.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field, field_validator, model_validator

from orchestrator.hardware.engine_args import validate_engine_arg
from orchestrator.measure.metrics import PROBE_METRIC_NAMES
from orchestrator.strict_model import StrictModel
from orchestrator.study.errors import Problem

# Metrics only a probe measures (``probe_s`` is its duration; it needs a probe all the same).
AGREEMENT_METRICS = PROBE_METRIC_NAMES


class ProbeSpec(StrictModel):
    """How the probe is made and which configuration is the reference."""

    prompts: int = Field(default=64, ge=64, le=100_000, description="prompts of the probe set (at least 64)")
    min_input_tokens: int = Field(default=16, ge=1, le=1 << 20)
    max_input_tokens: int = Field(default=512, ge=1, le=1 << 20,
                                  description="prompt lengths are log-uniform in [min_input_tokens, this]")
    output_tokens: int = Field(default=32, ge=1, le=1 << 16, description="greedy tokens per prompt (EOS ignored)")
    concurrency: int = Field(default=1, ge=1, le=1024,
                             description="probe requests in flight; 1 keeps batch composition, hence numerics, "
                                         "the same in every trial")
    floor_concurrency: Optional[int] = Field(
        default=None, ge=0, le=1024,
        description="the baseline trial answers the probe set a second time at this concurrency, another batch "
                    "composition, and the two answers' agreement is the noise floor every row records "
                    "(floor_*); default: 1 if concurrency > 1, else 8; 0: no second pass")
    perplexity_sequences: int = Field(default=16, ge=0, le=1024,
                                      description="held-out texts scored for heldout_perplexity (0: none)")
    perplexity_tokens: int = Field(default=256, ge=2, le=1 << 16, description="tokens per held-out text")
    seed: Optional[int] = Field(default=None, description="default: the study's seed")
    timeout_s: float = Field(default=120.0, gt=0, le=86_400, description="per probe request")
    baseline: Optional[dict[str, Union[bool, int, float, str, None]]] = Field(
        default=None, description="engine arguments of the reference configuration (a subset); default: "
                                  "quantization null, kv_cache_dtype auto, num_speculative_tokens 0")

    @field_validator("baseline")
    @classmethod
    def _engine_args(cls, v):
        for name, value in (v or {}).items():
            why = validate_engine_arg(name, value)
            if why:
                raise ValueError(f"{name}: {why}")
        return v

    @model_validator(mode="after")
    def _lengths(self):
        if self.min_input_tokens > self.max_input_tokens:
            raise ValueError(f"min_input_tokens ({self.min_input_tokens}) must be <= max_input_tokens "
                             f"({self.max_input_tokens})")
        return self

    def floor_pass_concurrency(self) -> int:
        """Probe requests in flight in the baseline's second pass (0: none)."""
        if self.floor_concurrency is not None:
            return self.floor_concurrency
        return 1 if self.concurrency > 1 else 8

    def reference(self) -> dict[str, Any]:
        """The engine arguments a baseline trial has."""
        # Speculation off too: n-gram speculation should leave greedy answers as they are, which the probe checks.
        return dict(self.baseline) if self.baseline is not None else {"quantization": None, "kv_cache_dtype": "auto",
                                                                      "num_speculative_tokens": 0}


def probe_problems(study: Any) -> list[Problem]:
    """Probe metrics need a ``probe`` section and an engine that computes tokens."""
    named = [(f"objectives.{i}", o.metric) for i, o in enumerate(study.objectives)]
    named += [(f"constraints.{i}", c.metric) for i, c in enumerate(study.constraints)]
    kind = study.engine.kind
    problems = []
    if study.probe is not None and kind == "sim":
        problems.append(Problem("probe", "the simulated engine (engine.kind 'sim') computes no tokens, so it has no "
                                         "agreement to measure; allowed with engine.kind: vllm or external"))
    for key, metric in named:
        if metric not in AGREEMENT_METRICS:
            continue
        if kind == "sim":
            problems.append(Problem(key, f"{metric} is measured by the probe, which engine.kind 'sim' cannot run "
                                         "(no model numerics); allowed with engine.kind: vllm or external"))
        elif study.probe is None:
            problems.append(Problem(key, f"{metric} is measured by the probe: add a 'probe:' section "
                                         "(e.g. probe: {prompts: 64})"))
    return problems
