"""Saturation: a load level whose backlog grows without bound, and what the SLOs allow it to hold.

:class:`SaturationDetector` watches a served level while it runs (a load monitor of the
load generator) and stops it early; :func:`detect_saturation` applies the same rule to a
level's records afterwards (virtual time). :func:`slo_backlog` is the floor the backlog must
also exceed: by Little's law, the requests a level can hold while it meets its SLOs.
See :mod:`orchestrator.trial.capacity` for how a saturated level ends a capacity search's climb.
"""

from __future__ import annotations

import bisect
import math
from typing import Optional, Sequence

import numpy as np

from orchestrator.measure import limits
from orchestrator.measure.records import RequestRecord

__all__ = ["SaturationDetector", "detect_saturation", "slo_backlog"]


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

    ``min_backlog``: a floor the backlog must also exceed. A continuous-batching engine's backlog
    grows while a level starts from an idle engine, until the batch (and each request's latency)
    reaches its new level; near capacity that takes longer than two windows, and the growth rule
    alone fired on levels that met their SLOs (on the simulator, 1 level in 3 near the knee). A
    level whose SLOs bound a request's latency to L seconds holds, by Little's law, at most
    rate x L requests while it meets them (:func:`slo_backlog`): beyond that it is hopeless.
    """

    def __init__(self, settings, min_backlog: float = 0.0):
        self.s = settings
        self.min_backlog = min_backlog
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
        if self.backlog(t) <= self.min_backlog:
            return False
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


def slo_backlog(slo: Sequence, rate: float, output_tokens: Sequence[int]) -> float:
    """Requests in flight beyond which a level at ``rate`` cannot meet ``slo`` (0: no bound):
    ``rate`` x the longest latency the SLOs allow a request (an ``e2el`` limit, else a TTFT limit
    plus a TPOT limit for each of the level's longest outputs; Little's law)."""
    bound: dict[str, float] = {}
    for c in slo:
        if limits.upper(c.op):
            for fam in ("e2el", "ttft", "tpot"):
                if c.metric.startswith(f"{fam}_"):
                    bound[fam] = max(bound.get(fam, 0.0), c.value / 1000.0)
    if "e2el" in bound:
        return rate * bound["e2el"]
    if "ttft" in bound and "tpot" in bound and len(output_tokens):
        return rate * (bound["ttft"] + bound["tpot"] * max(output_tokens))
    return 0.0


def detect_saturation(records: Sequence[RequestRecord], settings, min_backlog: float = 0.0) -> Optional[float]:
    """When a load window would have been flagged saturated (None: never), from its records.

    Replays the checks of :class:`SaturationDetector` every ``check_interval_s`` over the
    records' send and finish times: the same rule, after the fact (virtual time).
    """
    det = SaturationDetector(settings, min_backlog)
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
