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
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from orchestrator import judge
from orchestrator.confidence import Interval, intervals_to_columns
from orchestrator.metrics import LoadMetrics
from orchestrator.records import RequestRecord

__all__ = ["SaturationDetector", "detect_saturation", "Verdict", "judge_level", "LevelPoint", "next_rate",
           "capacity_index", "capacity_bracket", "CapacityBracket", "LevelResult", "CapacityResult", "search_capacity",
           "level_workload"]


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
    """A level against the SLOs: its measured values (``ok``, ``violation``), and whether that
    holds at the confidence the level's intervals were taken at (``decided``)."""

    ok: bool
    violation: float  # the largest relative SLO excess (<= 0: met); inf when not measurable
    reasons: tuple[str, ...] = ()
    decided: bool = True

    @property
    def outcome(self) -> str:
        """``met``, ``missed`` or ``undecided`` (the interval of an SLO's metric holds its limit)."""
        return "undecided" if not self.decided else "met" if self.ok else "missed"


def judge_level(metrics: LoadMetrics, slo: Sequence, *, max_error_rate: float = 0.0,
                saturated: bool = False, intervals: Optional[Mapping[str, Interval]] = None) -> Verdict:
    """Does a level meet the SLOs? ``slo``: :class:`orchestrator.study.Constraint` objects.

    ``intervals``: each SLO metric's interval (:mod:`orchestrator.confidence`). The verdict is
    decided when every SLO is met by its whole interval, or one is missed by its whole
    interval (or the level saturated, or failed too many requests); a metric without an
    interval is decided by its value. Without ``intervals`` every verdict is decided.
    """
    reasons = []
    if metrics.num_requests == 0:
        return Verdict(False, math.inf, ("no measured request",))
    checks = judge.check_all(slo, metrics.as_dict())
    violation = max((c.violation for c in checks), default=-math.inf)
    ok = all(c.met for c in checks)
    reasons += [c.describe() for c in checks if not c.met]
    sure_miss, sure_met = False, True
    for c in checks:
        op, limit = c.constraint.op, c.constraint.value
        if c.value is None:  # a missing metric never meets an SLO
            sure_miss, sure_met = True, False
            continue
        lo, hi = _bounds(c, (intervals or {}).get(c.constraint.metric))
        best, worst = (lo, hi) if op in ("<=", "<") else (hi, lo)  # None: unbounded on that side
        sure_miss |= best is not None and not judge.met(op, limit, best)
        sure_met &= worst is not None and judge.met(op, limit, worst)
    error_rate = metrics.failed / metrics.num_requests
    if error_rate > max_error_rate:  # only a failing error rate enters the margin
        violation = max(violation, (error_rate - max_error_rate) / max(max_error_rate, 0.01))
        ok = False
        sure_miss = True
        reasons.append(f"error rate {error_rate:.3g} > {max_error_rate:g}")
    if saturated:
        ok = False
        sure_miss = True
        reasons.append("saturated: the backlog grew without bound")
    if violation == -math.inf:
        violation = 0.0 if ok else math.inf
    decided = sure_miss if not ok else sure_met
    return Verdict(ok, float(violation), tuple(reasons), decided)


def _bounds(check: judge.ConstraintCheck, interval: Optional[Interval]) -> tuple[Optional[float], Optional[float]]:
    """(low, high) of a checked metric: its interval around the value (None: unbounded), or the value itself."""
    v = check.value
    if interval is None:
        return v, v
    return (None if interval.low is None else min(interval.low, v),
            None if interval.high is None else max(interval.high, v))


# ---------------------------------------------------------------- choosing the next rate
@dataclass(frozen=True)
class LevelPoint:
    rate: float
    ok: bool
    violation: float
    saturated: bool = False
    decided: bool = True


def _bracket(points: Sequence[LevelPoint]) -> tuple[Optional[LevelPoint], Optional[LevelPoint]]:
    """(highest point decided met below the lowest decided missed, lowest point decided missed)."""
    fails = [p for p in points if p.decided and not p.ok]
    hi = min(fails, key=lambda p: p.rate) if fails else None
    passes = [p for p in points if p.decided and p.ok and (hi is None or p.rate < hi.rate)]
    lo = max(passes, key=lambda p: p.rate) if passes else None
    return lo, hi


def capacity_index(points: Sequence[LevelPoint]) -> Optional[int]:
    """Index of the level whose metrics stand for the capacity: the highest level that met the SLOs
    (by its values) at or below the capacity estimate; None if none did."""
    cap = capacity_bracket(points)
    met = [i for i, p in enumerate(points) if p.ok and p.rate <= cap.estimate + 1e-9 and cap.estimate > 0]
    return max(met, key=lambda i: points[i].rate) if met else None


@dataclass(frozen=True)
class CapacityBracket:
    """Where the capacity lies: ``low`` (the highest rate decided met: validated), ``high`` (the
    lowest rate decided missed; None when none was) and ``estimate``, the rate where the levels'
    SLO margin crosses zero, inside [low, high]."""

    low: float
    high: Optional[float]
    estimate: float


def capacity_bracket(points: Sequence[LevelPoint]) -> CapacityBracket:
    lo, hi = _bracket(points)
    low = lo.rate if lo is not None else 0.0
    high = hi.rate if hi is not None else None
    if high is None:  # nothing decided missed: the highest rate that met the SLOs by its values
        top = [p.rate for p in points if p.ok]
        return CapacityBracket(low, None, max(top + [low]))
    inside = [p for p in points if low <= p.rate <= high and math.isfinite(p.violation) and not p.saturated]
    estimate = _crossing(inside)
    if estimate is None:
        point_met = [p.rate for p in points if p.ok and p.rate < high]
        estimate = max(point_met + [low])
    return CapacityBracket(low, high, float(min(max(estimate, low), high)))


def _crossing(points: Sequence[LevelPoint], near: int = 2) -> Optional[float]:
    """The rate where the SLO margin crosses zero: a straight line (least squares) through the
    ``near`` highest-rate points that met and the ``near`` lowest that missed (the margin is
    convex in the rate, so far points bend the line); None with fewer than two rates or a
    margin that does not grow with the rate."""
    met = sorted((p for p in points if p.violation <= 0), key=lambda p: p.rate)[-near:]
    missed = sorted((p for p in points if p.violation > 0), key=lambda p: p.rate)[:near]
    points = met + missed
    if len({p.rate for p in points}) < 2:
        return None
    x = np.array([p.rate for p in points], dtype=float)
    y = np.array([p.violation for p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    if slope <= 0:
        return None
    return float(-intercept / slope)


def next_rate(points: Sequence[LevelPoint], spec, start_rate: float) -> tuple[Optional[float], str]:
    """The next rate to measure, or ``(None, why the search stops)``. Pure: history in, rate out.

    Brackets with decided levels only: go up (``growth``) until a level is decided missed, down
    until one below it is decided met; then split the widest gap between measured rates inside
    that bracket (at the margin's zero where the two ends straddle it), until the bracket is within
    ``tolerance``, or every gap inside it is (the levels there stayed undecided: the noise band
    of this measurement), or ``max_levels`` are spent.
    """
    if not points:
        return float(min(max(start_rate, spec.min_rate), spec.max_rate)), ""
    if len(points) >= spec.max_levels:
        return None, f"max_levels ({spec.max_levels}) measured"
    lo, hi = _bracket(points)
    if hi is None:  # nothing decided missed so far: go up
        top = max(p.rate for p in points)
        if top >= spec.max_rate:
            return None, f"max_rate ({spec.max_rate:g}/s) met the SLOs"
        return min(top * spec.growth, spec.max_rate), ""
    if lo is None:  # nothing decided met below the lowest miss: go down
        bottom = min(p.rate for p in points)
        if bottom <= spec.min_rate:
            return None, f"min_rate ({spec.min_rate:g}/s) failed the SLOs"
        return max(min(bottom, hi.rate) / spec.growth, spec.min_rate), ""
    if (hi.rate - lo.rate) / hi.rate <= spec.tolerance:
        return None, f"bracketed within {spec.tolerance:.0%}"
    inside = sorted({p.rate: p for p in points if lo.rate <= p.rate <= hi.rate}.values(), key=lambda p: p.rate)
    gaps = [(b.rate - a.rate, a, b) for a, b in zip(inside, inside[1:]) if (b.rate - a.rate) / hi.rate > spec.tolerance]
    if not gaps:
        return None, (f"the levels between {lo.rate:.3g} and {hi.rate:.3g}/s stayed undecided: "
                      f"the measurement's noise band")
    width, a, b = max(gaps, key=lambda g: g[0])
    x = a.rate + width / 2
    usable = (math.isfinite(a.violation) and math.isfinite(b.violation) and not b.saturated
              and a.violation <= 0 < b.violation)
    if usable:
        x = a.rate + width * (-a.violation) / (b.violation - a.violation)
    return float(min(max(x, a.rate + width / 4), b.rate - width / 4)), ""


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
    windows: int = 1  # windows measured at this rate (an undecided level is measured again)
    intervals: Mapping[str, Interval] = field(default_factory=dict)
    confidence: Optional[float] = None

    @property
    def point(self) -> LevelPoint:
        return LevelPoint(self.rate, self.verdict.ok, self.verdict.violation, self.saturated_at_s is not None,
                          self.verdict.decided)

    def row(self) -> dict:
        """One row of the ``levels`` table (see :mod:`orchestrator.results.levels`)."""
        v = self.verdict.violation
        return {"level": self.level, "rate": self.rate, "planned_requests": self.planned_requests,
                "saturated": self.saturated_at_s is not None, "saturated_at_s": self.saturated_at_s,
                "stopped_early": self.stopped_early, "slo_met": self.verdict.ok,
                "slo_decided": self.verdict.decided, "windows": self.windows, "confidence": self.confidence,
                "slo_violation": v if math.isfinite(v) else None,
                "slo_failures": "; ".join(self.verdict.reasons) or None, **self.metrics.as_dict(), **self.warmup,
                **intervals_to_columns(self.intervals)}


@dataclass
class CapacityResult:
    levels: list[LevelResult]
    stop_reason: str

    @property
    def bracket(self) -> CapacityBracket:
        return capacity_bracket([lv.point for lv in self.levels])

    @property
    def best(self) -> Optional[LevelResult]:
        i = capacity_index([lv.point for lv in self.levels])
        return None if i is None else self.levels[i]

    @property
    def capacity_rps(self) -> float:
        """The estimate: where the SLO margin crosses zero between the validated rate and the lowest
        rate decided missed; 0 when no level met the SLOs."""
        return self.bracket.estimate if self.best is not None else 0.0

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
