"""Typed workload description: when requests arrive and how long they are.

A study names one workload; :func:`orchestrator.workload.generate.build_requests`
turns (spec, seed) into the same request list for every trial.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- lengths
class FixedLength(_Strict):
    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, description="every request has this many tokens")


class UniformLength(_Strict):
    kind: Literal["uniform"] = "uniform"
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class NormalLength(_Strict):
    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: int = Field(default=1, ge=1)
    max: Optional[int] = Field(default=None, ge=1)


class LognormalLength(_Strict):
    """Lognormal with the given mean (not median) and shape ``sigma``; clipped."""

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0)
    sigma: float = Field(gt=0, le=4)
    min: int = Field(default=1, ge=1)
    max: Optional[int] = Field(default=None, ge=1)


class ChoiceLength(_Strict):
    kind: Literal["choice"] = "choice"
    values: list[int] = Field(min_length=1)
    weights: Optional[list[float]] = None

    @model_validator(mode="after")
    def _weights_match(self):
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(f"weights has {len(self.weights)} entries but values has {len(self.values)}")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        if any(v < 1 for v in self.values):
            raise ValueError("every value must be >= 1")
        return self


LengthSpec = Annotated[
    Union[FixedLength, UniformLength, NormalLength, LognormalLength, ChoiceLength],
    Field(discriminator="kind"),
]


def _length_shorthand(value):
    """``input_len: 512`` means a fixed length."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


# ---------------------------------------------------------------- arrivals
class PoissonArrival(_Strict):
    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, description="requests per second")


class GammaArrival(_Strict):
    """Gamma inter-arrival times; burstiness < 1 is burstier than Poisson (vLLM's ``--burstiness``)."""

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0)
    burstiness: float = Field(gt=0)


class ConstantArrival(_Strict):
    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0)


class ConcurrencyArrival(_Strict):
    """Closed loop: keep this many requests in flight."""

    kind: Literal["concurrency"] = "concurrency"
    concurrency: int = Field(ge=1)


class BurstArrival(_Strict):
    """Every request at time zero (vLLM's ``--request-rate inf``)."""

    kind: Literal["burst"] = "burst"


ArrivalSpec = Annotated[
    Union[PoissonArrival, GammaArrival, ConstantArrival, ConcurrencyArrival, BurstArrival],
    Field(discriminator="kind"),
]


class SharedPrefix(_Strict):
    """Requests share one of ``groups`` prefixes of ``length`` tokens (system prompts, RAG context)."""

    groups: int = Field(ge=1)
    length: int = Field(ge=1)
    fraction: float = Field(default=1.0, ge=0, le=1, description="share of requests that use a prefix")


class WorkloadSpec(_Strict):
    api: Literal["completions", "chat"] = "completions"
    arrival: ArrivalSpec = PoissonArrival(rate=4.0)
    num_requests: int = Field(default=200, ge=1, le=1_000_000)
    warmup_requests: int = Field(default=2, ge=0, le=10_000)
    input_len: LengthSpec = FixedLength(value=512)
    output_len: LengthSpec = FixedLength(value=128)
    shared_prefix: Optional[SharedPrefix] = None
    max_concurrency: Optional[int] = Field(default=None, ge=1, description="client-side cap on in-flight requests")
    timeout_s: float = Field(default=300.0, gt=0, description="per-request timeout")
    ignore_eos: bool = True

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            for key in ("input_len", "output_len"):
                if key in data:
                    data[key] = _length_shorthand(data[key])
        return data

    @property
    def requested_rate(self) -> Optional[float]:
        return getattr(self.arrival, "rate", None)
