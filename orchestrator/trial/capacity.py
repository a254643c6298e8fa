"""Capacity search: the highest request rate one deployment sustains within the SLOs, and how sure.

One engine start, several load levels. Each level replays the study's workload at one
rate of the study's :class:`RateGrid`: a draw of its own per grid point (arrivals, lengths,
prompts; only the shared prefixes repeat), so that no level is answered from the prefix cache an
earlier level filled and the levels average the workload's noise instead of repeating one draw
(:mod:`orchestrator.workload.generate`), and the same draw at that rate in every trial of the study
(common random numbers: two configurations measured at one rate are compared on the same requests).
The engine is warmed up before the first level only, until steady (:mod:`orchestrator.measure.warmup`).
A level's verdict (:func:`judge_level`) is a decision at a confidence: **met** or **missed** when
each SLO metric's interval (:mod:`orchestrator.measure.confidence`) lies on one side of its limit, or
it saturated (:mod:`orchestrator.measure.saturation`), or failed too many requests; **undecided**
otherwise, and then measured again (``capacity.repeats``, fresh draws, pooled).

The rates come from :func:`next_rate`, a pure function of the levels so far: from the start
rate, multiply (or divide) by ``growth`` until a level is decided missed and one below it
decided met; then measure where the levels' fit puts the capacity, until its interval is within
``tolerance``, every grid rate in it is measured (the measurement's noise band), or
``max_levels`` / ``max_windows`` are spent. The answer, ``capacity_rps`` and its interval, is one
fit of every level (:mod:`orchestrator.trial.capacity_fit`): isotonic in the rate, bootstrapped,
with the engine's start-to-start noise; never clamped into the decided levels' bracket.

Every level is a row of the ``levels`` table: the configuration's latency-throughput curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from orchestrator.failures import error_rate, too_many_failures
from orchestrator.measure import limits
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, Interval, intervals_to_columns, z_of
from orchestrator.measure.metrics import LoadMetrics
from orchestrator.measure.records import RequestRecord
from orchestrator.measure.warmup import WarmupOutcome
from orchestrator.study import judge
from orchestrator.trial.capacity_fit import CapacityFit
from orchestrator.workload.arrivals import with_rate

__all__ = ["LevelVerdict", "judge_level", "LevelPoint", "next_rate", "RateGrid", "draw_level",
           "capacity_index", "LevelResult", "CapacityResult", "search_capacity", "level_workload"]


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
        best, worst = (lo, hi) if limits.upper(op) else (hi, lo)  # None: unbounded on that side
        sure_miss |= best is not None and not limits.met(op, limit, best)
        sure_met &= worst is not None and limits.met(op, limit, worst)
        m = limits.log_margin(op, limit, c.value)
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


def capacity_index(points: Sequence[LevelPoint], estimate: float) -> Optional[int]:
    """Index of the level whose metrics stand for the capacity: the highest level that met the SLOs
    (by its values) at or below the capacity ``estimate``; None if none did."""
    met = [i for i, p in enumerate(points) if p.ok and p.rate <= estimate * (1 + 1e-9) and estimate > 0]
    return max(met, key=lambda i: points[i].rate) if met else None


@dataclass(frozen=True)
class RateGrid:
    """The rates a capacity search may measure: ``start x growth^(k / steps)`` inside ``[min_rate,
    max_rate]``. Every configuration of a study measures on the same grid, and the level at grid point
    ``k`` replays the same requests in every trial (:func:`draw_level`): two configurations measured at one
    rate saw the same requests, and their comparison there is paired. ``growth`` is a whole number of
    ``steps`` (its rates exact: 10, 20, 40 for a growth of 2); a step is about half the search's ``tolerance``."""

    start: float
    growth: float
    steps: int
    min_rate: float
    max_rate: float

    @classmethod
    def of(cls, spec, start_rate: float) -> "RateGrid":
        steps = max(1, math.ceil(math.log(spec.growth) / math.log1p(spec.tolerance / 2.0) - 1e-9))
        start = float(min(max(start_rate, spec.min_rate), spec.max_rate))
        return cls(start, float(spec.growth), steps, spec.min_rate, spec.max_rate)

    @property
    def step(self) -> float:
        return self.growth ** (1.0 / self.steps)

    def index(self, rate: float) -> int:
        return int(round(math.log(rate / self.start) / math.log(self.growth) * self.steps))

    def rate(self, k: int) -> float:
        whole, part = divmod(k, self.steps)
        return self.start * self.growth ** whole * (self.growth ** (part / self.steps) if part else 1.0)

    @property
    def lowest(self) -> int:
        return math.ceil(math.log(self.min_rate / self.start) / math.log(self.step) - 1e-9)

    @property
    def highest(self) -> int:
        return math.floor(math.log(self.max_rate / self.start) / math.log(self.step) + 1e-9)

    def snap(self, rate: float) -> int:
        """The grid index nearest ``rate`` (log scale), inside the rate limits (0: the lowest; inf: the highest)."""
        if not rate > 0:
            return self.lowest
        if math.isinf(rate):
            return self.highest
        return min(max(self.index(rate), self.lowest), self.highest)


def draw_level(k: int) -> int:
    """The workload draw (``build_requests(level=...)``) of grid point ``k``: 0 for the start rate
    (the workload's own draw, with its warm-up), then 1, 2, 3, 4, ... for k = 1, -1, 2, -2, ..."""
    return 0 if k == 0 else 2 * k - 1 if k > 0 else -2 * k


def _below(beat: Optional[float], missed: Optional[LevelPoint], fit) -> str:
    """Why the search stops, decided below ``beat`` (the best trial's capacity, its lower bound): a level at
    or below it decided missed, or the levels' fit (within this start) wholly below it; else ``""``."""
    if beat is None:
        return ""
    if missed is not None and missed.rate <= beat:
        return f"decided below the best trial's capacity ({beat:.3g}/s): {missed.rate:.3g}/s missed the SLOs"
    if fit is not None and fit.high is not None and 0 < fit.high < beat:
        return f"decided below the best trial's capacity ({beat:.3g}/s): the levels' fit ends at {fit.high:.3g}/s"
    return ""


def next_rate(points: Sequence[LevelPoint], spec, start_rate: float, fit=None,
              beat: Optional[float] = None) -> tuple[Optional[float], str]:
    """The next rate to measure (a point of the study's :class:`RateGrid`), or ``(None, why the search
    stops)``. Pure: history in, rate out.

    Brackets with decided levels: go up (``growth``) until a level is decided missed, down until one
    below it is decided met. Then ``fit`` (:class:`~orchestrator.trial.capacity_fit.CapacityFit` of the
    levels so far, within this engine start) says where the capacity is and how sure: stop when its
    interval is within ``tolerance``; otherwise measure the grid point nearest its estimate that is not
    measured yet, inside its interval and the bracket, until there is none (the levels left are the
    measurement's noise band), or ``max_levels`` / ``max_windows`` are spent. Without ``fit``, the
    widest gap inside the bracket is split. With ``beat`` (the best trial's capacity, its lower bound), it
    stops as soon as this capacity is decided below it: the comparison it feeds is decided.
    """
    grid = RateGrid.of(spec, start_rate)
    if not points:
        return grid.rate(grid.snap(grid.start)), ""
    if len(points) >= spec.max_levels:
        return None, f"max_levels ({spec.max_levels}) measured"
    if spec.max_windows is not None and sum(p.windows for p in points) >= spec.max_windows:
        return None, f"max_windows ({spec.max_windows}) measured"
    per_growth = grid.steps
    measured = {grid.index(p.rate) for p in points}
    lo, hi = _bracket(points)
    below = _below(beat, hi, fit)
    if below:
        return None, below
    if hi is None:  # nothing decided missed so far: go up
        top = max(grid.index(p.rate) for p in points)
        if top >= grid.highest:
            return None, f"max_rate ({spec.max_rate:g}/s) met the SLOs"
        return grid.rate(min(top + per_growth, grid.highest)), ""
    if lo is None:  # nothing decided met below the lowest miss: go down
        bottom = min(grid.index(p.rate) for p in points + [hi])
        if bottom <= grid.lowest:
            return None, f"min_rate ({spec.min_rate:g}/s) failed the SLOs"
        return grid.rate(max(bottom - per_growth, grid.lowest)), ""
    k_lo, k_hi = grid.index(lo.rate), grid.index(hi.rate)
    if fit is not None and fit.high is not None and fit.estimate > 0:
        narrow = fit.bracket is None or (fit.bracket[1] - fit.bracket[0]) / fit.bracket[1] <= spec.tolerance
        if narrow and (fit.high - fit.low) / fit.high <= spec.tolerance:
            return None, f"bracketed within {spec.tolerance:.0%} (the levels' fit)"
        a, b = grid.snap(fit.low), grid.snap(fit.high)
        if fit.bracket is not None:  # the crossing lies between these two levels: measure there first
            a, b = (grid.index(fit.bracket[0]), grid.index(fit.bracket[1])) if not narrow else (a, b)
        free = [k for k in range(a, b + 1) if k not in measured]
        if not free:
            return None, (f"every rate between {grid.rate(a):.3g} and {grid.rate(b):.3g}/s measured: "
                          f"the measurement's noise band")
        target = math.log(fit.estimate)
        return grid.rate(min(free, key=lambda k: (abs(math.log(grid.rate(k)) - target), k))), ""
    if (hi.rate - lo.rate) / hi.rate <= spec.tolerance:
        return None, f"bracketed within {spec.tolerance:.0%}"
    inside = sorted(k for k in measured if k_lo <= k <= k_hi)
    gaps = [(b - a, a, b) for a, b in zip(inside, inside[1:]) if b - a > 1]
    if not gaps:
        return None, (f"the levels between {lo.rate:.3g} and {hi.rate:.3g}/s stayed undecided: "
                      f"the measurement's noise band")
    _, a, b = max(gaps)
    return grid.rate((a + b) // 2), ""


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
    grid_index: Optional[int] = None  # its point of the study's RateGrid (the draw every trial replays there)
    contradicts: bool = False  # met above a level that missed, or missed below one that met (set by the fit)

    @property
    def point(self) -> LevelPoint:
        return LevelPoint(self.rate, self.verdict.ok, self.verdict.violation, self.saturated_at_s is not None,
                          self.verdict.decided, self.verdict.margin, self.verdict.margin_sd, self.windows)

    def row(self) -> dict:
        """One row of the ``levels`` table (see :mod:`orchestrator.results.levels`)."""
        v = self.verdict.violation
        return {"level": self.level, "rate": self.rate, "planned_requests": self.planned_requests,
                "grid_index": self.grid_index, "contradicts": self.contradicts,
                "saturated": self.saturated_at_s is not None, "saturated_at_s": self.saturated_at_s,
                "stopped_early": self.stopped_early, "slo_met": self.verdict.ok,
                "slo_decided": self.verdict.decided, "windows": self.windows, "confidence": self.confidence,
                "slo_violation": v if math.isfinite(v) else None,
                "slo_failures": "; ".join(self.verdict.reasons) or None, **self.metrics.as_dict(),
                **(self.warmup.columns() if self.warmup else {}), **intervals_to_columns(self.intervals)}


@dataclass
class CapacityResult:
    """A capacity search: its levels, why it stopped, and the fit of every level
    (:mod:`orchestrator.trial.capacity_fit`, the engine's start noise included) that answers it."""

    levels: list[LevelResult]
    stop_reason: str
    confidence: float = DEFAULT_CONFIDENCE
    fit: Optional[CapacityFit] = None

    def __post_init__(self):
        involved = set(self.fit.contradicting) if self.fit is not None else set()
        for i, lv in enumerate(self.levels):
            lv.contradicts = i in involved

    @property
    def best(self) -> Optional[LevelResult]:
        if self.fit is None:
            return None
        i = capacity_index([lv.point for lv in self.levels], self.fit.estimate)
        return None if i is None else self.levels[i]

    @property
    def capacity_rps(self) -> float:
        """The fit's estimate: where the binding SLO margin crosses zero; 0 when no level met the SLOs."""
        return self.fit.estimate if self.fit is not None and self.best is not None else 0.0

    @property
    def capacity_goodput(self) -> float:
        b = self.best
        return b.metrics.goodput if b is not None else 0.0


def search_capacity(measure: Callable[[int, float], LevelResult], spec, start_rate: float,
                    fit: Optional[Callable[[Sequence[LevelResult], bool], Optional[CapacityFit]]] = None,
                    beat: Optional[float] = None) -> CapacityResult:
    """Measure levels (``measure(level index, rate)``) as :func:`next_rate` asks, until it stops.
    ``fit(levels, with_start_noise)``: the levels' capacity fit; the search steers by the fit within
    this start (what more levels can narrow), the answer carries the engine's start noise too. ``beat``:
    the capacity below which the comparison this trial feeds is decided (:func:`next_rate`)."""
    levels: list[LevelResult] = []
    while True:
        current = fit(levels, False) if fit is not None and levels else None
        rate, why = next_rate([lv.point for lv in levels], spec, start_rate, current, beat)
        if rate is None:
            final = fit(levels, True) if fit is not None and levels else None
            return CapacityResult(levels, why, spec.confidence, final)
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
