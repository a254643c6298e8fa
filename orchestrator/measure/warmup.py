"""Warm up until the engine is steady: the rule, and what a trial records of it.

A trial warms its engine up before it measures, with the trial's own kind of load
(:class:`~orchestrator.workload.warmup_stream.WarmupStream`: its arrival process at its
rate, its lengths, prompts that are never measured). :class:`SteadyJudge` decides
when that warm-up ends; the load generator (served engines) and the virtual
simulator (virtual time) run the same judge on the same records:

* never before ``min_s`` seconds (the floor), nor before two windows fit;
* **converged** when the last two successive windows of W seconds agree: their TTFT
  p50 (requests whose first token came in the window) and their output throughput
  (tokens streamed in the window) each differ by at most ``tolerance`` (relative),
  or by no more than their sampling noise (two standard errors: of a median, from the
  windows' pooled median absolute deviation; of a throughput, 1/sqrt(requests
  streaming)), and the backlog (sent minus finished) did not grow over the last
  window by more than 2 sqrt(N), N the requests sent in it (a queue still filling, or
  saturated, is not steady even when its TTFT changes slowly). W is ``window_s``,
  stretched at low rates so that a window holds about four requests;
* **saturated** (not converged) when the backlog grows without bound, by the rule of
  :class:`orchestrator.trial.capacity.SaturationDetector` over windows of ``window_s``: the
  load will never be steady, and waiting longer only builds a queue;
* **failing** (not converged) when at least two requests ended in the last window
  and none succeeded (a dead engine);
* ``max_s``: the cap (not converged).

Once converged, the warm-up requests still in flight are awaited (the engine drains
in about one request latency); otherwise they are aborted. Either way nothing of the
warm-up is in flight when the measured window starts, so neither the client's metrics
nor the engine's own counters over the window see a warm-up request.

:class:`WarmupOutcome` is what a trial records: ``warmup_s_used`` (first warm-up send
to the start of the measured window, the burst of ``warmup_requests`` included),
``warmup_requests_used`` (every warm-up request sent) and ``warmup_converged`` (1 or
0; null when no steady warm-up ran).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from orchestrator.measure.records import RequestRecord
from orchestrator.measure.saturation import SaturationDetector

__all__ = ["WarmupOutcome", "SteadyJudge", "MIN_WINDOW_REQUESTS"]

# A window holds at least this many requests on average (W = max(window_s, this / send rate)).
MIN_WINDOW_REQUESTS = 4
_Z = 2.0  # standard errors of sampling noise two windows may differ by


@dataclass
class WarmupOutcome:
    """How long a warm-up ran and why it ended (``reason``: converged, max_s, saturated, failing)."""

    seconds: float = 0.0
    requests: int = 0
    converged: Optional[bool] = None  # None: no steady warm-up ran
    reason: Optional[str] = None

    def columns(self) -> dict[str, Optional[float]]:
        """The ``warmup_*`` columns (orchestrator.measure.metrics.WARMUP_METRIC_NAMES)."""
        return {"warmup_s_used": float(self.seconds), "warmup_requests_used": float(self.requests),
                "warmup_converged": None if self.converged is None else float(self.converged)}


@dataclass(frozen=True)
class _Saturation:
    """SaturationDetector settings over the warm-up's windows (the capacity search's defaults otherwise)."""

    window_s: float
    check_interval_s: float
    min_growth: int = 8
    growth_fraction: float = 0.25
    confirm: int = 2


@dataclass(frozen=True)
class _Window:
    ttft: list  # seconds, requests whose first token came in the window
    tokens: float
    streaming: int  # requests with a token in the window


class SteadyJudge:
    """Decides when a warm-up ends (see the module docstring); times are seconds on the records' clock.

    Feed it every warm-up request when it is sent (:meth:`on_send`, the live record: the
    judge reads its tokens as they arrive) and when it ends (:meth:`on_finish`); ask
    :meth:`check` every :attr:`check_interval_s`.
    """

    def __init__(self, settings, start: float):
        self.s = settings
        self.start = start
        self.check_interval_s = min(0.25, settings.window_s / 4)
        self._sends: list[float] = []
        self._finishes: list[float] = []
        self._live: dict[int, RequestRecord] = {}  # id -> record, until it ended before the windows
        self._ended: dict[int, float] = {}
        self._ok_tokens = 0.0
        self._ok_chunks = 0
        self._saturation = SaturationDetector(_Saturation(settings.window_s, self.check_interval_s))
        self.reason: Optional[str] = None

    # ---- feeding
    def on_send(self, t: float, record: RequestRecord) -> None:
        bisect.insort(self._sends, t)
        self._live[id(record)] = record
        self._saturation.on_send(t)

    def on_finish(self, t: float, record: RequestRecord) -> None:
        bisect.insort(self._finishes, t)
        self._ended[id(record)] = t
        if record.success and record.completion_tokens and record.token_times_s:
            self._ok_tokens += record.completion_tokens
            self._ok_chunks += len(record.token_times_s)
        if record.sent_s is not None:
            self._saturation.on_finish(t, record)

    # ---- the rule
    def window_s(self, t: float) -> float:
        """W: ``window_s``, or longer at low rates (about MIN_WINDOW_REQUESTS sends per window)."""
        elapsed = t - self.start
        rate = len(self._sends) / elapsed if elapsed > 0 else 0.0
        return max(self.s.window_s, MIN_WINDOW_REQUESTS / rate) if rate > 0 else math.inf

    def check(self, t: float) -> Optional[str]:
        """None: keep warming up; else why the warm-up ends (``converged``, ``max_s``, ``saturated``, ``failing``)."""
        elapsed = t - self.start
        if elapsed >= self.s.max_s:
            return self._end("max_s")
        if self._saturation.should_stop(t):
            return self._end("saturated")
        w = self.window_s(t)
        if self._failing(t, min(w, self.s.window_s * 2)):
            return self._end("failing")
        if elapsed < max(self.s.min_s, 2 * w):
            return None
        # Requests that ended before the earlier window (and a window's length more) matter no more.
        for rid in [rid for rid, at in self._ended.items() if at < t - 3 * w]:
            del self._ended[rid], self._live[rid]
        return self._end("converged") if self.steady(t, w) else None

    def _end(self, reason: str) -> str:
        self.reason = reason
        return reason

    def _failing(self, t: float, w: float) -> bool:
        ended = [rid for rid, at in self._ended.items() if t - w <= at <= t]
        if len(ended) < 2:
            return False
        return not any(self._live[rid].success for rid in ended)

    def backlog(self, t: float) -> int:
        return bisect.bisect_right(self._sends, t) - bisect.bisect_right(self._finishes, t)

    def steady(self, t: float, w: float) -> bool:
        """Do the windows [t - 2w, t - w) and [t - w, t) agree (and the backlog not grow)?"""
        a, b = self._window(t - 2 * w, t - w), self._window(t - w, t)
        if not (a.ttft and b.ttft and a.tokens > 0 and b.tokens > 0):
            return False
        ma, mb = float(np.median(a.ttft)), float(np.median(b.ttft))
        if abs(mb - ma) > max(self.s.tolerance * max(ma, mb), _median_noise(a.ttft, b.ttft)):
            return False
        ta, tb = a.tokens / w, b.tokens / w
        noise = _Z * math.sqrt(1.0 / max(a.streaming, 1) + 1.0 / max(b.streaming, 1))
        if abs(tb - ta) > max(self.s.tolerance, noise) * max(ta, tb):
            return False
        sent = bisect.bisect_left(self._sends, t) - bisect.bisect_left(self._sends, t - w)
        return self.backlog(t) - self.backlog(t - w) <= _Z * math.sqrt(max(sent, 1))

    def _window(self, lo: float, hi: float) -> _Window:
        per_chunk = self._ok_tokens / self._ok_chunks if self._ok_chunks else 1.0
        ttft, tokens, streaming = [], 0.0, 0
        for rec in self._live.values():
            ft = rec.first_token_s
            if ft is not None and rec.sent_s is not None and lo <= ft < hi:
                ttft.append(ft - rec.sent_s)
            times = rec.token_times_s
            if times:
                k = bisect.bisect_left(times, hi) - bisect.bisect_left(times, lo)
                if k:
                    streaming += 1
                    done = rec.success and rec.completion_tokens and id(rec) in self._ended
                    tokens += k * (rec.completion_tokens / len(times) if done else per_chunk)
        return _Window(ttft, tokens, streaming)


def _median_noise(a: list, b: list) -> float:
    """Two standard errors of the difference of two sample medians (pooled MAD scale, normal approximation)."""
    ma, mb = float(np.median(a)), float(np.median(b))
    dev = np.abs(np.concatenate([np.asarray(a, dtype=float) - ma, np.asarray(b, dtype=float) - mb]))
    sigma = 1.4826 * float(np.median(dev))
    return _Z * 1.2533 * sigma * math.sqrt(1.0 / len(a) + 1.0 / len(b))
