"""Capacity search: the highest request rate one deployment sustains within the SLOs.

One engine start, several load levels. Each level replays the study's workload at
one rate and is judged. Level k is ``build_requests(..., level=k)``: the same
arrival gaps (scaled to the rate), lengths and shared prefixes at every level, but
prompts of its own (their unique parts), so that no level is answered from the
prefix cache an earlier level filled (vLLM's prefix caching is on by default); see
:mod:`orchestrator.workload.generate`. The engine is warmed up before the first
level only, until steady (:mod:`orchestrator.warmup`); it stays warm for the others.
A level is:

* **saturated** when its backlog (requests sent but not finished) grows without
  bound (:class:`SaturationDetector`); in served mode the level is then stopped
  early, the requests in flight aborted: an overloaded level costs seconds, not the
  time its queue would take to drain;
* **passing** when it is not saturated, its error rate is at most
  ``capacity.max_error_rate`` and its metrics meet every SLO of
  :meth:`Study.capacity_slo`.

The rates come from :func:`next_rate`, a pure function of the levels measured so
far: from the start rate, multiply (or divide) by ``growth`` until one level passes
and one fails; then, between the highest passing rate and the lowest failing one,
interpolate where the SLO margin crosses zero (regula falsi, kept inside the middle
half of the bracket so that it always shrinks by a quarter, bisection when a margin
is unusable), until the bracket is within ``tolerance`` or ``max_levels`` are spent.
The capacity is the highest *measured* passing rate (below the lowest failing one):
an interpolated rate is never reported as met.

Every level is a row of the ``levels`` table: the configuration's
latency-throughput curve, for free.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from orchestrator import judge
from orchestrator.metrics import LoadMetrics
from orchestrator.records import RequestRecord

__all__ = ["SaturationDetector", "detect_saturation", "Verdict", "judge_level", "LevelPoint", "next_rate",
           "capacity_index", "LevelResult", "CapacityResult", "search_capacity", "level_workload"]


# ---------------------------------------------------------------- saturation
_SERVICE_SAMPLE = 10  # first finished requests whose lower-quartile latency is the service time


class SaturationDetector:
    """Flags a load level whose backlog grows without bound (a :class:`~orchestrator.loadgen.LoadMonitor`).

    Checked every ``check_interval_s``: with W = max(``window_s``, 2 x the service time),
    the backlog (sent minus finished) must
    have grown in each of the last ``confirm`` windows of length W, every time by at
    least max(``min_growth``, ``growth_fraction`` x N, 2 sqrt(N)), N the requests sent
    in that window (2 sqrt(N): twice the Poisson noise of N arrivals). A burst of
    arrivals lifts a stable queue's backlog once; a saturated queue's grows in every
    window. Nothing is judged before the first request finished and the windows fit
    after it (the queue is still filling then). The service time is the lower quartile
    of the first ten latencies: the first requests to finish met an empty engine, but
    when arrivals outrun its sequence slots, later ones of those ten had queued already,
    and the latency of later requests grows with the very backlog being judged, which
    would stretch the window past the level's end.
    :attr:`saturated_at` says when it fired.
    """

    def __init__(self, settings):
        self.s = settings
        self.sends: list[float] = []
        self.finishes: list[float] = []
        self._lat: list[tuple[float, float]] = []  # (finish time, latency), by finish time
        self.saturated_at: Optional[float] = None

    # ---- LoadMonitor
    def on_send(self, t: float) -> None:
        bisect.insort(self.sends, t)

    def on_finish(self, t: float, record: RequestRecord) -> None:
        bisect.insort(self.finishes, t)
        if record.sent_s is not None:
            bisect.insort(self._lat, (t, t - record.sent_s))

    def should_stop(self, t: float) -> bool:
        if self.saturated_at is None and self._growing(t):
            self.saturated_at = t
        return self.saturated_at is not None

    # ---- the rule
    def backlog(self, t: float) -> int:
        return bisect.bisect_right(self.sends, t) - bisect.bisect_right(self.finishes, t)

    def _growing(self, t: float) -> bool:
        known = bisect.bisect_right(self._lat, (t, math.inf))
        if known == 0:
            return False
        first_finish = self._lat[0][0]
        service = float(np.percentile([lat for _, lat in self._lat[:min(known, _SERVICE_SAMPLE)]], 25))
        window = max(self.s.window_s, 2.0 * service)
        if t - self.s.confirm * window < first_finish:
            return False
        for k in range(self.s.confirm):
            a, b = t - (k + 1) * window, t - k * window
            sent = bisect.bisect_right(self.sends, b) - bisect.bisect_right(self.sends, a)
            growth = self.backlog(b) - self.backlog(a)
            if growth < max(self.s.min_growth, self.s.growth_fraction * sent, 2.0 * math.sqrt(sent)):
                return False
        return True


def detect_saturation(records: Sequence[RequestRecord], settings) -> Optional[float]:
    """When a load window would have been flagged saturated (None: never), from its records.

    Replays the checks of :class:`SaturationDetector` every ``check_interval_s`` over the
    records' send and finish times: the same rule, after the fact (virtual time).
    """
    det = SaturationDetector(settings)
    measured = [r for r in records if not r.warmup and r.sent_s is not None]
    if not measured:
        return None
    for r in measured:
        det.on_send(r.sent_s)
        end = r.finished_s if r.finished_s is not None else r.end_s
        if end is not None:
            det.on_finish(end, r)
    last = max(det.sends[-1], det.finishes[-1] if det.finishes else 0.0)
    t = settings.check_interval_s
    while t <= last:
        if det.should_stop(t):
            return det.saturated_at
        t += settings.check_interval_s
    return None


# ---------------------------------------------------------------- judging one level
@dataclass(frozen=True)
class Verdict:
    ok: bool
    violation: float  # the largest relative SLO excess (<= 0: met); inf when not measurable
    reasons: tuple[str, ...] = ()


def judge_level(metrics: LoadMetrics, slo: Sequence, *, max_error_rate: float = 0.0,
                saturated: bool = False) -> Verdict:
    """Does a level meet the SLOs? ``slo``: :class:`orchestrator.study.Constraint` objects."""
    reasons = []
    if metrics.num_requests == 0:
        return Verdict(False, math.inf, ("no measured request",))
    checks = judge.check_all(slo, metrics.as_dict())
    violation = max((c.violation for c in checks), default=-math.inf)
    ok = all(c.met for c in checks)
    reasons += [c.describe() for c in checks if not c.met]
    error_rate = metrics.failed / metrics.num_requests
    if error_rate > max_error_rate:  # only a failing error rate enters the margin
        violation = max(violation, (error_rate - max_error_rate) / max(max_error_rate, 0.01))
        ok = False
        reasons.append(f"error rate {error_rate:.3g} > {max_error_rate:g}")
    if saturated:
        ok = False
        reasons.append("saturated: the backlog grew without bound")
    if violation == -math.inf:
        violation = 0.0 if ok else math.inf
    return Verdict(ok, float(violation), tuple(reasons))


# ---------------------------------------------------------------- choosing the next rate
@dataclass(frozen=True)
class LevelPoint:
    rate: float
    ok: bool
    violation: float
    saturated: bool = False


def _bracket(points: Sequence[LevelPoint]) -> tuple[Optional[LevelPoint], Optional[LevelPoint]]:
    """(highest passing point below the lowest failing one, lowest failing point)."""
    fails = [p for p in points if not p.ok]
    hi = min(fails, key=lambda p: p.rate) if fails else None
    passes = [p for p in points if p.ok and (hi is None or p.rate < hi.rate)]
    lo = max(passes, key=lambda p: p.rate) if passes else None
    return lo, hi


def capacity_index(points: Sequence[LevelPoint]) -> Optional[int]:
    """Index of the capacity level (highest passing rate below the lowest failing); None if none passes."""
    lo, _ = _bracket(points)
    return None if lo is None else points.index(lo)


def next_rate(points: Sequence[LevelPoint], spec, start_rate: float) -> tuple[Optional[float], str]:
    """The next rate to measure, or ``(None, why the search stops)``. Pure: history in, rate out."""
    if not points:
        return float(min(max(start_rate, spec.min_rate), spec.max_rate)), ""
    if len(points) >= spec.max_levels:
        return None, f"max_levels ({spec.max_levels}) measured"
    lo, hi = _bracket(points)
    if hi is None:  # everything passed so far: go up
        top = max(p.rate for p in points)
        if top >= spec.max_rate:
            return None, f"max_rate ({spec.max_rate:g}/s) met the SLOs"
        return min(top * spec.growth, spec.max_rate), ""
    if lo is None:  # nothing passed below the lowest failure: go down
        if hi.rate <= spec.min_rate:
            return None, f"min_rate ({spec.min_rate:g}/s) failed the SLOs"
        return max(hi.rate / spec.growth, spec.min_rate), ""
    width = hi.rate - lo.rate
    if width / hi.rate <= spec.tolerance:
        return None, f"bracketed within {spec.tolerance:.0%}"
    x = lo.rate + width / 2
    usable = (math.isfinite(lo.violation) and math.isfinite(hi.violation) and not hi.saturated
              and lo.violation <= 0 < hi.violation)
    if usable:
        x = lo.rate + width * (-lo.violation) / (hi.violation - lo.violation)
    return float(min(max(x, lo.rate + width / 4), hi.rate - width / 4)), ""


# ---------------------------------------------------------------- the search
@dataclass
class LevelResult:
    """One measured level: its records (``level`` set), metrics, verdict, and how it ended."""

    level: int
    rate: float
    planned_requests: int
    records: list[RequestRecord]
    metrics: LoadMetrics
    verdict: Verdict
    saturated_at_s: Optional[float] = None
    stopped_early: bool = False
    telemetry: dict = field(default_factory=dict)
    warmup: dict = field(default_factory=dict)  # the warm-up before it: warmup_* columns (orchestrator.warmup)

    @property
    def point(self) -> LevelPoint:
        return LevelPoint(self.rate, self.verdict.ok, self.verdict.violation, self.saturated_at_s is not None)

    def row(self) -> dict:
        """One row of the ``levels`` table (see :mod:`orchestrator.results.levels`)."""
        v = self.verdict.violation
        return {"level": self.level, "rate": self.rate, "planned_requests": self.planned_requests,
                "saturated": self.saturated_at_s is not None, "saturated_at_s": self.saturated_at_s,
                "stopped_early": self.stopped_early, "slo_met": self.verdict.ok,
                "slo_violation": v if math.isfinite(v) else None,
                "slo_failures": "; ".join(self.verdict.reasons) or None, **self.metrics.as_dict(), **self.warmup}


@dataclass
class CapacityResult:
    levels: list[LevelResult]
    stop_reason: str

    @property
    def best(self) -> Optional[LevelResult]:
        i = capacity_index([lv.point for lv in self.levels])
        return None if i is None else self.levels[i]

    @property
    def capacity_rps(self) -> float:
        """Highest SLO-compliant rate measured; 0 when even the lowest rate tried failed."""
        b = self.best
        return b.rate if b is not None else 0.0

    @property
    def capacity_goodput(self) -> float:
        b = self.best
        return b.metrics.goodput if b is not None else 0.0


def search_capacity(measure: Callable[[int, float], LevelResult], spec, start_rate: float) -> CapacityResult:
    """Measure levels (``measure(level index, rate)``) as :func:`next_rate` asks, until it stops."""
    levels: list[LevelResult] = []
    while True:
        rate, why = next_rate([lv.point for lv in levels], spec, start_rate)
        if rate is None:
            return CapacityResult(levels, why)
        levels.append(measure(len(levels), rate))


def level_workload(workload, rate: float, spec, base_rate: Optional[float]):
    """The workload of one level: ``workload`` at ``rate`` requests per second.

    Synthetic and dataset workloads get the arrival rescaled and ``requests_per_level``
    requests (or ``rate x level_duration_s``, at least ``min_requests``); a trace is
    replayed whole with its time scale multiplied by ``base_rate / rate`` (``base_rate``:
    the trace's own rate as the study replays it).
    """
    from orchestrator.workload.arrivals import with_rate

    if workload.trace is not None:
        if not base_rate:
            raise ValueError("a trace needs at least two requests at distinct times to be replayed at a rate")
        trace = workload.trace.model_copy(update={"time_scale": workload.trace.time_scale * base_rate / rate})
        return workload.model_copy(update={"trace": trace})
    if spec.level_duration_s is not None:
        n = max(spec.min_requests, int(math.ceil(rate * spec.level_duration_s)))
    else:
        n = spec.requests_per_level or workload.num_requests
    return workload.model_copy(update={"arrival": with_rate(workload.arrival, rate, n), "num_requests": n})
