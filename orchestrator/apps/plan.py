"""Plan a fleet for a target load: replicas, GPUs, cost and Ray Serve autoscaling from measured capacity.

A capacity search measures, per configuration, the highest request rate one replica serves
within the SLOs (``capacity_rps``) and an interval around it (``capacity_rps_low`` /
``capacity_rps_high`` at ``confidence``; the low end is the highest rate *validated*: a level
decided met). :func:`plan_fleet` turns that into the fleet that serves a target rate ``R``:

* **replicas** = ``ceil(R x (1 + headroom) / capacity_rps_low)``. Sized on the low end: the
  point estimate lies above the validated rate by up to the measurement's noise, and a fleet
  sized on it runs each replica past what was shown to meet the SLOs. A row without an
  interval (results written before intervals existed) is sized on its point estimate, and
  the plan says so (``sized_on``).
* **GPUs** = replicas x GPUs per replica (TP x PP, the trial's ``gpus``); **cost per hour** =
  GPUs x the price of a GPU-hour (:mod:`orchestrator.hardware.pricing`).
* **cost per million output tokens**, as :mod:`orchestrator.hardware.pricing`'s ``cost_per_mtok`` (dollars
  per million output tokens at the output rate served) for the whole fleet at ``R``:
  ``cost_per_hour / 3600 / (R x output_tokens_per_request) x 1e6``, where output tokens per
  request is the trial's measured ``output_throughput / request_throughput`` at its capacity
  level. It includes the headroom and the rounding: idle capacity is paid for.
* **autoscaling** (Ray Serve ``autoscaling_config``): ``max_replicas`` = the replicas above;
  ``min_replicas`` the floor asked for (default 1); ``target_ongoing_requests`` from Little's
  law, concurrency = arrival rate x time in system: a replica loaded at its share of the sized
  rate, ``capacity_rps_low / (1 + headroom)``, holds that rate x the mean E2E latency measured
  at the capacity level. Latency grows with load, so the latency at capacity bounds the one at
  the lower sized rate: the target keeps each replica below its validated capacity.

Candidates are ranked cheapest fleet first (cost per hour; GPUs without a price), so the best
configuration per GPU is not always first: replicas round up. Configurations whose capacity
per GPU is tied within the noise (:func:`orchestrator.results.ties.tie_mask`) say so.

Pure functions of plain inputs; reading a study and writing files is the ``plan`` command's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import pandas as pd

from orchestrator.results.ties import tie_mask, tie_note

__all__ = ["DEFAULT_HEADROOM", "PlanError", "Candidate", "Autoscaling", "FleetPlan", "FleetPlans",
           "replicas_for", "target_ongoing_requests", "plan_fleet", "check_rate"]

DEFAULT_HEADROOM = 0.2  # 20% above the target rate: bursts, a replica restarting, drift since the measurement


class PlanError(ValueError):
    """No plan can be made (a bad rate or headroom, no configuration with a measured capacity)."""


@dataclass(frozen=True)
class Candidate:
    """One measured configuration, as one replica."""

    trial_id: str
    gpus_per_replica: int  # TP x PP
    tensor_parallel_size: int
    capacity_rps: float  # the point estimate per replica
    capacity_rps_low: Optional[float] = None  # the validated rate (None: no interval recorded)
    capacity_rps_high: Optional[float] = None  # None: unbounded above, or no interval
    confidence: Optional[float] = None  # of the interval
    output_tokens_per_request: Optional[float] = None
    rate_at_capacity: Optional[float] = None  # the capacity level's achieved arrival rate
    e2el_mean_s_at_capacity: Optional[float] = None  # the capacity level's mean end-to-end latency
    params: str = ""  # the tuned parameters, for people

    @property
    def sizing_rps(self) -> float:
        """The per-replica rate the fleet is sized on: the validated low end, else the point."""
        return self.capacity_rps if self.capacity_rps_low is None else self.capacity_rps_low

    @property
    def sized_on(self) -> str:
        if self.capacity_rps_low is None:
            return "capacity_rps (no interval recorded: the point estimate, which may be above what holds)"
        conf = f" at {self.confidence:.0%} confidence" if self.confidence else ""
        return f"capacity_rps_low (the validated capacity{conf})"

    def concurrency_at_capacity(self) -> Optional[float]:
        """Little's law at the capacity level: requests in the replica = arrival rate x time in it."""
        if not _positive(self.rate_at_capacity) or not _positive(self.e2el_mean_s_at_capacity):
            return None
        return self.rate_at_capacity * self.e2el_mean_s_at_capacity


@dataclass(frozen=True)
class Autoscaling:
    """Ray Serve's ``autoscaling_config`` of the planned deployment, and how it was derived."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: Optional[float]  # None: no latency measured at capacity
    derivation: str

    def config(self) -> dict:
        out: dict = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas}
        if self.target_ongoing_requests is not None:
            out["target_ongoing_requests"] = self.target_ongoing_requests
        return out


@dataclass(frozen=True)
class FleetPlan:
    """One configuration deployed as a fleet that serves ``rate`` with ``headroom``."""

    candidate: Candidate
    rate: float
    headroom: float
    replicas: int
    gpus: int
    price_per_gpu_hour: Optional[float]
    cost_per_hour: Optional[float]
    cost_per_mtok: Optional[float]
    utilisation: float  # rate / (replicas x sizing capacity): how loaded the replicas are at the target
    replicas_on_point: int  # what sizing on the point estimate would give (fewer: under-provisioned)
    autoscaling: Autoscaling
    tied_with: tuple[str, ...] = ()  # other candidates tied with this one on capacity per GPU

    @property
    def tie_note(self) -> str:
        return tie_note(len(self.tied_with))


@dataclass(frozen=True)
class FleetPlans:
    """Every candidate's plan, cheapest first, and the candidates that could not be planned."""

    rate: float
    headroom: float
    plans: tuple[FleetPlan, ...]
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (trial id, why)

    @property
    def best(self) -> FleetPlan:
        return self.plans[0]


def _positive(x: Optional[float]) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check_rate(rate: object) -> float:
    """The target rate as a positive finite number, or :class:`PlanError` saying what is wrong."""
    try:
        value = float(rate)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PlanError(f"--rate must be a number of requests per second, got {rate!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"--rate must be a positive number of requests per second, got {rate!r}")
    return value


def replicas_for(rate: float, capacity_per_replica: float, headroom: float) -> int:
    """``ceil(rate x (1 + headroom) / capacity)``, at least 1. A quotient within float rounding of a
    whole number is that number (400 x 1.2 / 48 is 10, not 10.000000000000002 -> 11)."""
    if not _positive(capacity_per_replica):
        raise PlanError(f"capacity per replica must be positive, got {capacity_per_replica!r}")
    need = rate * (1.0 + headroom) / capacity_per_replica
    whole = round(need)
    return max(1, whole if abs(need - whole) <= 1e-9 * max(1.0, need) else math.ceil(need))


def target_ongoing_requests(candidate: Candidate, headroom: float) -> Optional[float]:
    """Little's law at the rate a replica is sized to carry: ``capacity_low / (1 + headroom)`` x
    the mean E2E latency at the capacity level, to one decimal (at least 1); None without a latency."""
    latency = candidate.e2el_mean_s_at_capacity
    if not _positive(latency):
        return None
    return max(1.0, math.floor(candidate.sizing_rps / (1.0 + headroom) * latency * 10) / 10)


def _autoscaling(candidate: Candidate, replicas: int, headroom: float, min_replicas: int) -> Autoscaling:
    target = target_ongoing_requests(candidate, headroom)
    per_replica = candidate.sizing_rps / (1.0 + headroom)
    if target is None:
        why = ("no end-to-end latency measured at the capacity level: target_ongoing_requests left to "
               "Ray Serve LLM's default (set it, or autoscaling will not scale up)")
    else:
        at_cap = candidate.concurrency_at_capacity()
        why = (f"target_ongoing_requests {target:g} = {per_replica:,.4g} req/s per replica (capacity "
               f"{candidate.sizing_rps:,.4g} / {1 + headroom:g}) x {candidate.e2el_mean_s_at_capacity:.3g} s mean "
               "E2E latency at the capacity level (Little's law)"
               + (f"; {at_cap:,.4g} requests in flight at capacity" if at_cap is not None else ""))
    return Autoscaling(min(min_replicas, replicas), replicas, target, why)


def _ties(candidates: Sequence[Candidate]) -> list[tuple[str, ...]]:
    """Per candidate, the others tied with it on capacity per GPU (their intervals overlap)."""
    def nan(x: Optional[float]) -> float:
        return float("nan") if x is None else float(x)

    frame = pd.DataFrame({
        "capacity_rps_per_gpu": [c.capacity_rps / c.gpus_per_replica for c in candidates],
        "capacity_rps_per_gpu_low": [nan(c.capacity_rps_low) / c.gpus_per_replica for c in candidates],
        # no high beside a low: unbounded above (the search met every level it decided)
        "capacity_rps_per_gpu_high": [nan(c.capacity_rps_high) / c.gpus_per_replica for c in candidates],
    })
    out = []
    for i in range(len(candidates)):
        mask = tie_mask(frame, i, "capacity_rps_per_gpu")
        out.append(tuple(c.trial_id for j, c in enumerate(candidates) if mask[j] and j != i))
    return out


def plan_fleet(candidates: Sequence[Candidate], rate: float, *, headroom: float = DEFAULT_HEADROOM,
               price_per_gpu_hour: Optional[float] = None, min_replicas: int = 1) -> FleetPlans:
    """The fleet each candidate needs to serve ``rate`` req/s with ``headroom``, cheapest first.

    Ranked by cost per hour (by GPUs when no price is known), then fewer GPUs, then the larger
    validated capacity of the whole fleet. A candidate without a positive capacity to size on is
    skipped with the reason; :class:`PlanError` when none is left, or ``rate`` / ``headroom`` /
    ``min_replicas`` is out of range."""
    rate = check_rate(rate)
    if not math.isfinite(headroom) or headroom < 0:
        raise PlanError(f"--headroom must be a fraction >= 0 (0.2: 20% spare), got {headroom!r}")
    if min_replicas < 0:
        raise PlanError(f"--min-replicas must be >= 0, got {min_replicas}")
    if price_per_gpu_hour is not None and not (math.isfinite(price_per_gpu_hour) and price_per_gpu_hour >= 0):
        raise PlanError(f"the price per GPU-hour must be a number >= 0, got {price_per_gpu_hour!r}")
    usable, skipped = [], []
    for c in candidates:
        if not _positive(c.sizing_rps):
            skipped.append((c.trial_id, "no validated capacity (no load level was decided met)"))
        elif c.gpus_per_replica < 1:
            skipped.append((c.trial_id, f"GPUs per replica {c.gpus_per_replica}"))
        else:
            usable.append(c)
    if not usable:
        raise PlanError("no configuration has a measured capacity to size a fleet on"
                        + "".join(f"\n  {t}: {why}" for t, why in skipped))
    plans = []
    for c, tied in zip(usable, _ties(usable)):
        replicas = replicas_for(rate, c.sizing_rps, headroom)
        gpus = replicas * c.gpus_per_replica
        cost = None if price_per_gpu_hour is None else gpus * price_per_gpu_hour
        tokens = c.output_tokens_per_request
        per_mtok = cost / 3600.0 / (rate * tokens) * 1e6 if cost is not None and _positive(tokens) else None
        plans.append(FleetPlan(
            candidate=c, rate=rate, headroom=headroom, replicas=replicas, gpus=gpus,
            price_per_gpu_hour=price_per_gpu_hour, cost_per_hour=cost, cost_per_mtok=per_mtok,
            utilisation=rate / (replicas * c.sizing_rps),
            replicas_on_point=replicas_for(rate, c.capacity_rps, headroom) if _positive(c.capacity_rps) else replicas,
            autoscaling=_autoscaling(c, replicas, headroom, min_replicas), tied_with=tied))
    # equal cost: the fleet with more validated capacity (more spare at the target) first
    plans.sort(key=lambda p: (p.cost_per_hour if p.cost_per_hour is not None else p.gpus, p.gpus,
                              -p.replicas * p.candidate.sizing_rps, p.candidate.trial_id))
    return FleetPlans(rate, headroom, tuple(plans), tuple(skipped))
