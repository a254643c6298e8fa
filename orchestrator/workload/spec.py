"""Typed workload description: when requests arrive and how long they are.

A study names one workload; :func:`orchestrator.workload.generate.build_requests`
turns (spec, seed, load level) into the same request list for every trial.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import AfterValidator, Field, Strict, model_validator

from orchestrator.strict_model import StrictModel

# A count given as true or "20" is a mistake, not 1 or 20.
Count = Annotated[int, Strict()]


# ---------------------------------------------------------------- lengths
class FixedLength(StrictModel):
    kind: Literal["fixed"] = "fixed"
    value: Count = Field(ge=1, description="every request has this many tokens")


class UniformLength(StrictModel):
    kind: Literal["uniform"] = "uniform"
    min: Count = Field(ge=1)
    max: Count = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class NormalLength(StrictModel):
    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0)
    std: float = Field(ge=0)
    min: Count = Field(default=1, ge=1)
    max: Optional[Count] = Field(default=None, ge=1)


class LognormalLength(StrictModel):
    """Lognormal with the given mean (not median) and shape ``sigma``; clipped."""

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0)
    sigma: float = Field(gt=0, le=4)
    min: Count = Field(default=1, ge=1)
    max: Optional[Count] = Field(default=None, ge=1)


class ChoiceLength(StrictModel):
    kind: Literal["choice"] = "choice"
    values: list[Count] = Field(min_length=1)
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
# Loads beyond any one deployment and any one load generator. A steady warm-up sends the
# trial's own load for seconds before it can judge it: at a rate of millions per second that
# is millions of requests in memory before the first check.
MAX_RATE = 10_000.0  # requests per second
MAX_CONCURRENCY = 10_000  # requests in flight
# Gamma gaps of shape below MIN_BURSTINESS are mostly 0.0 in floating point (every request at
# once, and a steady warm-up that never advances its clock); above MAX_BURSTINESS they are constant.
MIN_BURSTINESS, MAX_BURSTINESS = 0.01, 1e6


def _burstiness(value: float) -> float:
    if not MIN_BURSTINESS <= value <= MAX_BURSTINESS:
        raise ValueError(f"must be in [{MIN_BURSTINESS:g}, {MAX_BURSTINESS:g}]: below, most gaps are 0 s (every "
                         "request at once); above, the gaps are constant (use kind: constant)")
    return value


Burstiness = Annotated[float, Field(gt=0), AfterValidator(_burstiness)]
class PoissonArrival(StrictModel):
    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, le=MAX_RATE, description="requests per second")


class GammaArrival(StrictModel):
    """Gamma inter-arrival times; burstiness < 1 is burstier than Poisson (vLLM's ``--burstiness``)."""

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0, le=MAX_RATE)
    burstiness: Burstiness


class ConstantArrival(StrictModel):
    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0, le=MAX_RATE)


class ConcurrencyArrival(StrictModel):
    """Closed loop: keep this many requests in flight."""

    kind: Literal["concurrency"] = "concurrency"
    concurrency: Count = Field(ge=1, le=MAX_CONCURRENCY)


class BurstArrival(StrictModel):
    """Every request at time zero (vLLM's ``--request-rate inf``)."""

    kind: Literal["burst"] = "burst"


class RampArrival(StrictModel):
    """The rate moves from ``start_rate`` to ``end_rate`` over the requests (vLLM's ``--ramp-up-strategy``).

    Request i (of n) is drawn at ``start + (end - start) * i / (n - 1)`` (linear) or
    ``start * (end / start) ** (i / (n - 1))`` (exponential); gaps are gamma with
    shape ``burstiness`` (1: Poisson).
    """

    kind: Literal["ramp"] = "ramp"
    start_rate: float = Field(gt=0, le=MAX_RATE)
    end_rate: float = Field(gt=0, le=MAX_RATE)
    shape: Literal["linear", "exponential"] = "linear"
    burstiness: Burstiness = 1.0


class DiurnalArrival(StrictModel):
    """A daily rate cycle compressed into the load window (non-homogeneous Poisson).

    The rate is ``rate * (1 + amplitude * sin(2 pi (t / period_s + phase)))``, or, with
    ``profile``, ``rate`` times the profile: relative levels at equally spaced points of
    one period, joined linearly, repeated, rescaled to mean 1 (so ``rate`` stays the mean).
    """

    kind: Literal["diurnal"] = "diurnal"
    rate: float = Field(gt=0, le=MAX_RATE, description="mean requests per second")
    period_s: float = Field(gt=0, description="length of one cycle in seconds")
    amplitude: float = Field(default=0.5, ge=0, lt=1)
    phase: float = Field(default=0.0, ge=0, lt=1, description="fraction of a period at t = 0")
    profile: Optional[list[float]] = Field(default=None, min_length=2)

    @model_validator(mode="after")
    def _profile_ok(self):
        if self.profile is not None and (any(v < 0 for v in self.profile) or sum(self.profile) <= 0):
            raise ValueError("profile levels must be >= 0 with a positive sum")
        return self


ArrivalSpec = Annotated[
    Union[PoissonArrival, GammaArrival, ConstantArrival, ConcurrencyArrival, BurstArrival, RampArrival,
          DiurnalArrival],
    Field(discriminator="kind"),
]
# Arrival kinds driven by a rate (what a capacity search can scale).
RATE_ARRIVALS = (PoissonArrival, GammaArrival, ConstantArrival, RampArrival, DiurnalArrival)


# ---------------------------------------------------------------- recorded traffic
class TraceSpec(StrictModel):
    """Replay a JSONL trace: arrival times and lengths come from the file (:mod:`.trace`)."""

    path: str = Field(description="a JSONL file (relative to the study file), or the name of a shipped "
                                  "trace in search_spaces/traces/ (e.g. chat)")
    time_unit: Literal["s", "ms"] = "s"
    time_scale: float = Field(default=1.0, gt=0, description="multiplies every gap: 0.5 replays twice as fast")
    start_s: float = Field(default=0.0, ge=0, description="window start, seconds after the trace's first request")
    end_s: Optional[float] = Field(default=None, gt=0, description="window end (exclusive), same clock")
    max_requests: Optional[Count] = Field(default=None, ge=1)
    prefix_len: Optional[Count] = Field(default=None, ge=1,
                                      description="shared-prefix length of lines with a prefix_group "
                                                  "and no prefix_len of their own")

    @model_validator(mode="after")
    def _window(self):
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s:g}) must be > start_s ({self.start_s:g})")
        return self


class DatasetSpec(StrictModel):
    """Prompts and output lengths from a file; arrivals from ``workload.arrival`` (:mod:`.datasets`)."""

    format: Literal["sharegpt", "vllm-custom", "trace"]
    path: str
    shuffle: bool = Field(default=True, description="seeded shuffle before taking num_requests (cycled if short)")
    output_len: Optional[Count] = Field(default=None, ge=1,
                                      description="every request asks for this many tokens instead of the file's "
                                                  "(vllm bench serve's --custom-output-len)")


class SharedPrefix(StrictModel):
    """Requests share one of ``groups`` prefixes of ``length`` tokens (system prompts, RAG context)."""

    groups: Count = Field(ge=1)
    length: Count = Field(ge=1)
    fraction: float = Field(default=1.0, ge=0, le=1, description="share of requests that use a prefix")


class Repetition(StrictModel):
    """Prompts that repeat their own earlier text, as code edits and answers quoting their sources
    do: what n-gram speculative decoding (prompt lookup) finds to propose."""

    fraction: float = Field(gt=0, lt=1, description="chance that each span of a prompt's own tokens after its "
                                                    "first is a copy of an earlier span of the prompt")
    span: Count = Field(default=16, ge=2, le=4096, description="tokens per span")


class SessionFileSpec(StrictModel):
    """Sessions read from a file (:mod:`.session_files`): every turn's user message and answer length."""

    format: Literal["sharegpt", "session-trace"] = Field(
        description="sharegpt: every turn of each conversation; session-trace: JSONL of "
                    "{session, turn, timestamp, input_len | prompt, output_len, think_s}")
    path: str = Field(description="the file (relative to the study file)")
    shuffle: bool = Field(default=True, description="seeded shuffle of the sessions before taking num_requests "
                                                    "(cycled if short)")
    timestamps: bool = Field(default=False, description="session-trace: sessions start at their first turn's "
                                                        "timestamp instead of at workload.arrival")
    time_scale: float = Field(default=1.0, gt=0, description="multiplies the start times and think times of a "
                                                             "session-trace")
    output_len: Optional[Count] = Field(default=None, ge=1, description="every turn asks for this many tokens "
                                                                        "instead of the file's")


class SessionSpec(StrictModel):
    """Multi-turn sessions (:mod:`.sessions`): with it, ``num_requests`` counts sessions and the
    arrival's rate is sessions per second. Turn k+1 is sent ``think_time_ms`` after turn k's answer
    ends; its prompt is the conversation so far (every user message and every answer the workload
    wrote) and a new user message of ``input_len`` tokens; it asks for ``output_len`` tokens."""

    turns: LengthSpec = Field(description="turns per session (a length distribution of counts)")
    think_time_ms: Optional[LengthSpec] = Field(default=None,
                                                description="milliseconds between an answer's end and the "
                                                            "next turn (none: at once)")
    max_prompt_len: Optional[Count] = Field(default=None, ge=2,
                                            description="a session ends before a turn whose prompt would be "
                                                        "longer (the engine's max_model_len minus output_len)")
    file: Optional[SessionFileSpec] = None

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            for key in ("turns", "think_time_ms"):
                if key in data:
                    data[key] = _length_shorthand(data[key])
        return data


class WarmupSpec(StrictModel):
    """Warm up until the engine is steady (after the ``warmup_requests`` burst), then measure.

    The trial's own load (its arrival process at its rate, or a capacity search's first
    level's; its length distributions; prompts of its own) runs for at least ``min_s``
    seconds and until two successive windows of ``window_s`` agree (TTFT p50 and output
    throughput within ``tolerance``, or within their sampling noise, and a backlog that
    does not grow), at most ``max_s`` seconds. See :mod:`orchestrator.measure.warmup`.
    """

    enabled: bool = Field(default=True, description="false: only the warmup_requests burst (a fixed warm-up)")
    min_s: float = Field(default=2.0, ge=0, description="the floor: never shorter than this")
    max_s: float = Field(default=10.0, gt=0, description="the cap: stop there, not converged")
    window_s: float = Field(default=1.0, gt=0,
                            description="length of the windows compared (longer at low rates: >= 4 requests each)")
    tolerance: float = Field(default=0.2, gt=0, le=1,
                             description="relative difference of TTFT p50 and output throughput allowed "
                                         "between two successive windows")

    @model_validator(mode="after")
    def _ordered(self):
        if self.min_s > self.max_s:
            raise ValueError(f"min_s ({self.min_s:g}) must be <= max_s ({self.max_s:g})")
        if 2 * self.window_s > self.max_s:
            raise ValueError(f"two windows ({2 * self.window_s:g} s) must fit in max_s ({self.max_s:g})")
        return self


class WorkloadSpec(StrictModel):
    api: Literal["completions", "chat"] = "completions"
    arrival: ArrivalSpec = PoissonArrival(rate=4.0)
    num_requests: Count = Field(default=200, ge=1, le=1_000_000)
    warmup_requests: Count = Field(default=2, ge=0, le=10_000,
                                 description="sent all at once and awaited first (before the steady warm-up)")
    warmup: WarmupSpec = Field(default=WarmupSpec(), description="then warm up until steady")
    input_len: LengthSpec = FixedLength(value=512)
    output_len: LengthSpec = FixedLength(value=128)
    shared_prefix: Optional[SharedPrefix] = None
    repetition: Optional[Repetition] = Field(default=None, description="synthetic prompts that repeat their own "
                                                                       "earlier spans (code edits, quoting)")
    max_concurrency: Optional[Count] = Field(default=None, ge=1, description="client-side cap on in-flight requests")
    timeout_s: float = Field(default=300.0, gt=0, description="per-request timeout")
    ignore_eos: bool = True
    trace: Optional[TraceSpec] = None
    dataset: Optional[DatasetSpec] = None
    sessions: Optional[SessionSpec] = Field(default=None, description="multi-turn sessions: num_requests counts "
                                                                      "sessions, the rate is sessions per second")
    warmup_s: float = Field(default=0.0, ge=0, description="requests due in the first seconds are not measured")
    cooldown_s: float = Field(default=0.0, ge=0, description="requests due in the last seconds are not measured")
    max_sched_lag_ms: float = Field(default=20.0, gt=0,
                                    description="p99 send lag above which a trial is flagged loadgen_overloaded")

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            for key in ("input_len", "output_len"):
                if key in data:
                    data[key] = _length_shorthand(data[key])
        return data

    @model_validator(mode="after")
    def _sources(self):
        # Compared with the defaults, not with the keys given: a dumped and reloaded spec
        # (study.json) has every key.
        def changed(*keys: str) -> list[str]:
            return [k for k in keys if getattr(self, k) != type(self).model_fields[k].default]

        if self.sessions is not None:
            if self.trace is not None or self.dataset is not None:
                raise ValueError("sessions exclude trace and dataset; read multi-turn files with sessions.file")
            if not isinstance(self.arrival, (PoissonArrival, GammaArrival, ConstantArrival)):
                raise ValueError(f"sessions arrive by a rate: arrival kind {self.arrival.kind!r} is not allowed "
                                 "with sessions; use poisson, gamma or constant")
            if self.sessions.file is not None and changed("input_len", "output_len"):
                raise ValueError("sessions.file gives each turn's lengths; remove "
                                 f"{', '.join(changed('input_len', 'output_len'))} "
                                 "(sessions.file.output_len replaces the file's answer lengths)")
        if self.repetition is not None and (self.trace, self.dataset, self.sessions) != (None, None, None):
            raise ValueError("repetition shapes synthetic prompts; a trace, a dataset or sessions bring their own")
        if self.trace is not None and self.dataset is not None:
            raise ValueError("trace and dataset exclude each other; use one")
        if self.trace is not None:
            clash = changed("arrival", "num_requests", "input_len", "output_len", "shared_prefix")
            if clash:
                raise ValueError(f"trace gives arrivals and lengths; remove {', '.join(clash)} "
                                 "(or use dataset: to replay the file's lengths at workload.arrival)")
        if self.dataset is not None:
            clash = changed("input_len", "output_len", "shared_prefix")
            if clash:
                raise ValueError(f"dataset gives prompts and output lengths; remove {', '.join(clash)} "
                                 "(dataset.output_len replaces the file's output lengths)")
        return self
