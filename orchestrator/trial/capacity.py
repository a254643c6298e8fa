"""Capacity search: the highest request rate one deployment sustains within the SLOs, and how sure.

One engine start, several load levels. Each level replays the study's workload at one
rate: ``build_requests(..., level=k)``, a draw of its own (arrivals, lengths, prompts;
only the shared prefixes repeat), so that no level is answered from the prefix cache an
earlier level filled and the levels average the workload's noise instead of repeating one
draw (:mod:`orchestrator.workload.generate`). The engine is warmed up before the first
level only, until steady (:mod:`orchestrator.measure.warmup`). A level's verdict
(:func:`judge_level`) is a decision at a confidence: **met** or **missed** when each SLO
metric's interval (:mod:`orchestrator.measure.confidence`) lies on one side of its limit, or it
saturated (:mod:`orchestrator.measure.saturation`), or failed too many requests; **undecided**
otherwise, and then measured again (``capacity.repeats``, fresh draws, pooled).

The rates come from :func:`next_rate`, a pure function of the levels so far: from the start
rate, multiply (or divide) by ``growth`` until a level is decided missed and one below it
decided met; then measure where the capacity is least known, until its interval is within
``tolerance``, the levels left undecided between are the measurement's noise band, or
``max_levels`` / ``max_windows`` are spent. The interval (:func:`capacity_bracket`) is bounded
by the decided levels and narrowed by a line through the levels' log SLO margins near the
knee (:func:`knee_fit`), whose zero crossing is the estimate, ``capacity_rps``.

Every level is a row of the ``levels`` table: the configuration's latency-throughput curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from orchestrator.failures import error_rate, too_many_failures
from orchestrator.measure import limits
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, Interval, intervals_to_columns, t_of, z_of
from orchestrator.measure.metrics import LoadMetrics
from orchestrator.measure.records import RequestRecord
from orchestrator.measure.warmup import WarmupOutcome
from orchestrator.study import judge
from orchestrator.workload.arrivals import with_rate

__all__ = ["LevelVerdict", "judge_level", "LevelPoint", "next_rate",
           "capacity_index", "capacity_bracket", "CapacityBracket", "LevelResult", "CapacityResult", "search_capacity",
           "level_workload"]


# ---------------------------------------------------------------- judging one level
@dataclass(frozen=True)
class LevelVerdict:
    """A level against the SLOs: its measured values (``ok``, ``violation``), and whether that
    holds at the confidence the level's intervals were taken at (``decided``)."""

    ok: bool
    violation: float  # the largest relative SLO excess (<= 0: met); inf when not measurable
    reasons: tuple[str, ...] = ()
    decided: bool = True
    margin: Optional[float] = None  # log(value / limit) of the binding SLO (> 0: missed); None: no such SLO
    margin_sd: Optional[float] = None  # its standard deviation, from the metric's interval

    @property
    def outcome(self) -> str:
        """``met``, ``missed`` or ``undecided`` (the interval of an SLO's metric holds its limit)."""
        return "undecided" if not self.decided else "met" if self.ok else "missed"


def judge_level(metrics: LoadMetrics, slo: Sequence, *, max_error_rate: float = 0.0,
                saturated: bool = False, intervals: Optional[Mapping[str, Interval]] = None,
                confidence: float = DEFAULT_CONFIDENCE) -> LevelVerdict:
    """Does a level meet the SLOs? ``slo``: :class:`orchestrator.study.spec.Constraint` objects.

    ``intervals``: each SLO metric's interval (:mod:`orchestrator.measure.confidence`). The verdict is
    decided when every SLO is met by its whole interval, or one is missed by its whole
    interval (or the level saturated, or failed too many requests); a metric without an
    interval is decided by its value. Without ``intervals`` every verdict is decided.
    """
    reasons = []
    if metrics.num_requests == 0:
        return LevelVerdict(False, math.inf, ("no measured request",))
    checks = judge.check_all(slo, metrics.as_dict())
    violation = max((c.violation for c in checks), default=-math.inf)
    ok = all(c.met for c in checks)
    reasons += [c.describe() for c in checks if not c.met]
    sure_miss, sure_met = False, True
    margin = margin_sd = None
    for c in checks:
        op, limit = c.constraint.op, c.constraint.value
        if c.value is None:  # a missing metric never meets an SLO
            sure_miss, sure_met = True, False
            continue
        lo, hi = _bounds(c, (intervals or {}).get(c.constraint.metric))
        best, worst = (lo, hi) if op in ("<=", "<") else (hi, lo)  # None: unbounded on that side
        sure_miss |= best is not None and not limits.met(op, limit, best)
        sure_met &= worst is not None and limits.met(op, limit, worst)
        m = _log_margin(op, limit, c.value)
        if m is not None and (margin is None or m > margin):
            margin = m
            # The wider side of the interval: a tail's is lopsided (wide above, narrow below), and
            # the line through the levels must not trust the narrow side.
            margin_sd = (max(math.log(hi / c.value), math.log(c.value / lo)) / z_of(confidence)
                         if lo is not None and hi is not None and lo > 0 and hi >= c.value >= lo else None)
    if too_many_failures(metrics, max_error_rate):  # only a failing error rate enters the margin
        rate = error_rate(metrics)
        violation = max(violation, (rate - max_error_rate) / max(max_error_rate, 0.01))
        ok = False
        sure_miss = True
        reasons.append(f"error rate {rate:.3g} > {max_error_rate:g}")
    if saturated:
        ok = False
        sure_miss = True
        reasons.append("saturated: the backlog grew without bound")
    if violation == -math.inf:
        violation = 0.0 if ok else math.inf
    decided = sure_miss if not ok else sure_met
    return LevelVerdict(ok, float(violation), tuple(reasons), decided, margin, margin_sd)


def _log_margin(op: str, limit: float, value: Optional[float]) -> Optional[float]:
    """log(value / limit) for an upper limit, log(limit / value) for a lower one (> 0: missed)."""
    if value is None or value <= 0 or limit <= 0:
        return None
    return math.log(value / limit) if op in ("<=", "<") else math.log(limit / value)


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
    margin: Optional[float] = None  # LevelVerdict.margin
    margin_sd: Optional[float] = None
    windows: int = 1  # times the level was measured


def _bracket(points: Sequence[LevelPoint]) -> tuple[Optional[LevelPoint], Optional[LevelPoint]]:
    """(highest point decided met below the lowest decided missed, lowest point decided missed)."""
    fails = [p for p in points if p.decided and not p.ok]
    hi = min(fails, key=lambda p: p.rate) if fails else None
    passes = [p for p in points if p.decided and p.ok and (hi is None or p.rate < hi.rate)]
    lo = max(passes, key=lambda p: p.rate) if passes else None
    return lo, hi


def capacity_index(points: Sequence[LevelPoint], confidence: float = DEFAULT_CONFIDENCE) -> Optional[int]:
    """Index of the level whose metrics stand for the capacity: the highest level that met the SLOs
    (by its values) at or below the capacity estimate; None if none did."""
    cap = capacity_bracket(points, confidence)
    met = [i for i, p in enumerate(points) if p.ok and p.rate <= cap.estimate + 1e-9 and cap.estimate > 0]
    return max(met, key=lambda i: points[i].rate) if met else None


@dataclass(frozen=True)
class CapacityBracket:
    """Where the capacity lies, at ``confidence``: between ``low`` and ``high`` (None: no level
    was decided missed), best estimated by ``estimate``.

    Two kinds of evidence: the levels decided met and missed (``low`` is never below the
    highest rate decided met, ``high`` never above the lowest decided missed), and the line
    through the levels' SLO margins near the capacity (:func:`knee_fit`), whose interval narrows
    the bracket when enough levels lie near the crossing."""

    low: float
    high: Optional[float]
    estimate: float
    fitted: bool = False  # the interval came from the levels' line, not only from decided levels


# Levels whose binding SLO margin is within this many log units of the limit (0.4x .. 2.5x of it)
# inform the line through the knee; further out the margin bends (saturation, an idle engine).
KNEE_MARGIN = 0.9


def knee_fit(points: Sequence[LevelPoint], confidence: float = DEFAULT_CONFIDENCE
             ) -> Optional[tuple[float, float, float]]:
    """``(crossing, low, high)``: where a straight line through the levels' log SLO margins
    crosses zero, and its interval at ``confidence``.

    Weighted least squares over the levels near the knee (margin within :data:`KNEE_MARGIN`,
    not saturated), each weighted by its margin's variance (from its metric's interval); the
    crossing's variance by the delta method, inflated by the residuals' excess over the weights
    (a level that disagrees more than its interval says widens the answer), its interval
    Student's t with the fit's degrees of freedom. None with fewer
    than three such levels at two rates or more, or a margin that does not grow with the rate."""
    near = [p for p in points if p.margin is not None and abs(p.margin) <= KNEE_MARGIN and not p.saturated]
    if len(near) < 3 or len({p.rate for p in near}) < 2:
        return None
    x = np.array([p.rate for p in near], dtype=float)
    y = np.array([p.margin for p in near], dtype=float)
    sd = np.array([p.margin_sd if p.margin_sd and p.margin_sd > 0 else np.nan for p in near], dtype=float)
    sd = np.where(np.isfinite(sd), sd, np.nanmedian(sd) if np.isfinite(sd).any() else 0.2)
    w = 1.0 / np.maximum(sd, 1e-3) ** 2
    a_mat = np.column_stack([np.ones_like(x), x])
    cov = np.linalg.pinv(a_mat.T @ (a_mat * w[:, None]))
    a, b = cov @ (a_mat.T @ (w * y))
    if b <= 0:
        return None
    resid = y - (a + b * x)
    dof = len(near) - 2
    scale = max(1.0, float(np.sum(w * resid ** 2)) / dof) if dof > 0 else 1.0
    cov = cov * scale
    r = -a / b
    grad = np.array([-1.0 / b, a / b ** 2])
    se = math.sqrt(max(float(grad @ cov @ grad), 0.0))
    t = t_of(confidence, max(dof, 1))  # a handful of levels: Student's t, not the normal
    return float(r), float(r - t * se), float(r + t * se)


def capacity_bracket(points: Sequence[LevelPoint], confidence: float = DEFAULT_CONFIDENCE) -> CapacityBracket:
    lo, hi = _bracket(points)
    low = lo.rate if lo is not None else 0.0
    high = hi.rate if hi is not None else None
    if high is None:  # nothing decided missed: the highest rate that met the SLOs by its values
        top = [p.rate for p in points if p.ok]
        return CapacityBracket(low, None, max(top + [low]))
    fit = knee_fit(points, confidence)
    if fit is not None and low < fit[0] < high and max(low, fit[1]) <= min(high, fit[2]):
        # The line's interval, inside what the decided levels allow (a level decided met at a
        # rate the line puts above the capacity is the stronger evidence there). A line that
        # crosses outside them disagrees with a decided level: the levels alone answer then.
        f_lo, f_hi = max(low, fit[1]), min(high, fit[2])
        return CapacityBracket(f_lo, f_hi, float(min(max(fit[0], f_lo), f_hi)), fitted=True)
    inside = [p for p in points if low <= p.rate <= high and math.isfinite(p.violation) and not p.saturated]
    estimate = _crossing(inside)
    if estimate is None:
        point_met = [p.rate for p in points if p.ok and p.rate < high]
        estimate = max(point_met + [low])
    return CapacityBracket(low, high, float(min(max(estimate, low), high)))


def _crossing(points: Sequence[LevelPoint], near: int = 2) -> Optional[float]:
    """The rate where the SLO margin crosses zero, from the ``near`` highest-rate points that met
    and the ``near`` lowest that missed (a straight line, least squares: the margin is convex in
    the rate, so far points bend it); None with fewer than two rates or a margin that does not
    grow with the rate. What :func:`capacity_bracket` falls back to without :func:`knee_fit`."""
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
    if spec.max_windows is not None and sum(p.windows for p in points) >= spec.max_windows:
        return None, f"max_windows ({spec.max_windows}) measured"
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
    cap = capacity_bracket(points, spec.confidence)
    if cap.high is not None and (cap.high - cap.low) / cap.high <= spec.tolerance:
        return None, f"bracketed within {spec.tolerance:.0%}" + (" (the levels' line)" if cap.fitted else "")
    if cap.fitted:
        # Measure where the line crosses zero: a level there tells the most about the crossing.
        # Next to a level already there, half the tolerance to the side with fewer levels.
        x = cap.estimate
        if any(abs(p.rate - x) <= spec.tolerance / 4 * x for p in points):
            above = sum(p.rate > x for p in points)
            x *= 1 + (spec.tolerance / 2 if above <= len(points) - above else -spec.tolerance / 2)
        return float(min(max(x, cap.low), cap.high)), ""
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
    verdict: LevelVerdict
    saturated_at_s: Optional[float] = None
    stopped_early: bool = False
    telemetry: dict = field(default_factory=dict)
    warmup: Optional[WarmupOutcome] = None  # the warm-up before it (orchestrator.measure.warmup)
    windows: int = 1  # windows measured at this rate (an undecided level is measured again)
    intervals: Mapping[str, Interval] = field(default_factory=dict)
    confidence: Optional[float] = None

    @property
    def point(self) -> LevelPoint:
        return LevelPoint(self.rate, self.verdict.ok, self.verdict.violation, self.saturated_at_s is not None,
                          self.verdict.decided, self.verdict.margin, self.verdict.margin_sd, self.windows)

    def row(self) -> dict:
        """One row of the ``levels`` table (see :mod:`orchestrator.results.levels`)."""
        v = self.verdict.violation
        return {"level": self.level, "rate": self.rate, "planned_requests": self.planned_requests,
                "saturated": self.saturated_at_s is not None, "saturated_at_s": self.saturated_at_s,
                "stopped_early": self.stopped_early, "slo_met": self.verdict.ok,
                "slo_decided": self.verdict.decided, "windows": self.windows, "confidence": self.confidence,
                "slo_violation": v if math.isfinite(v) else None,
                "slo_failures": "; ".join(self.verdict.reasons) or None, **self.metrics.as_dict(), **(self.warmup.columns() if self.warmup else {}),
                **intervals_to_columns(self.intervals)}


@dataclass
class CapacityResult:
    levels: list[LevelResult]
    stop_reason: str
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def bracket(self) -> CapacityBracket:
        return capacity_bracket([lv.point for lv in self.levels], self.confidence)

    @property
    def best(self) -> Optional[LevelResult]:
        i = capacity_index([lv.point for lv in self.levels], self.confidence)
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
            return CapacityResult(levels, why, spec.confidence)
        levels.append(measure(len(levels), rate))


def level_workload(workload, rate: float, spec, base_rate: Optional[float]):
    """The workload of one level: ``workload`` at ``rate`` requests per second.

    Synthetic and dataset workloads get the arrival rescaled and ``requests_per_level``
    requests (or ``rate x level_duration_s``, at least ``min_requests``); a trace is
    replayed whole with its time scale multiplied by ``base_rate / rate`` (``base_rate``:
    the trace's own rate as the study replays it).
    """

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
