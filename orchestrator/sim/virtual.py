"""Virtual-time simulation: run a :class:`RequestSet` through a :class:`SimEngineCore` without sleeping.

A discrete-event loop. The engine is either busy with one step (requests that
arrive meanwhile join at the step's end, as they reach vLLM's busy engine core)
or idle until the next arrival. Records are what an ideal client would see: a
request reaches the engine ``frontend_latency_s`` after it is sent (HTTP,
tokenization, IPC) and a token arrives when the step producing it ends. Times are
seconds from the start of the load window; warm-up requests run before it
(negative times): the burst one at a time, then the steady warm-up in virtual time,
judged by the same :class:`~orchestrator.measure.warmup.SteadyJudge` as a served trial's.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Optional

from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.measure.warmup import SteadyJudge
from orchestrator.sim.core import SimEngineCore, SimRequest
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request

# The steady warm-up sends at most this many requests, or a few times what its rate and max_s call
# for: gaps that collapse to 0 s would otherwise send requests at one instant for ever.
STEADY_FLOOR = 1000


def _time_out(rec: RequestRecord, deadline: float, timeout_s: float) -> None:
    """What the HTTP load generator records when the stream did not end within ``timeout_s``."""
    rec.token_times_s = [x for x in rec.token_times_s if x <= deadline]
    rec.first_token_s = rec.token_times_s[0] if rec.token_times_s else None
    rec.end_s = rec.token_times_s[-1] if rec.token_times_s else None
    rec.completion_tokens = None  # no usage chunk came: counted from the streamed chunks
    rec.finished_s = deadline
    rec.error_kind = RequestErrorKind.TIMEOUT
    rec.error = f"no end of stream within {timeout_s:g} s ({len(rec.token_times_s)} token chunks received)"


def _ended_at(rec: RequestRecord) -> float:
    return rec.end_s if rec.end_s is not None else rec.finished_s


class _Driver:
    """Owns the virtual clock; feeds requests to the core and fills their records. A request not
    ended ``timeout_s`` after it was sent is given up (the client's timeout) and aborted in the
    engine, as vLLM aborts a request whose client went away."""

    def __init__(self, core: SimEngineCore, timeout_s: Optional[float] = None):
        self.core = core
        self.timeout_s = timeout_s
        self._deadlines: list = []  # (deadline, seq, request id) of the requests in the engine
        self.t = 0.0
        self.latency = core.cost.frontend_latency_s
        self.token_s = core.cost.frontend_token_s
        self.frontend_free = 0.0  # when the API server has streamed every token handed to it so far
        self.live: dict[str, RequestRecord] = {}
        self.records: dict[tuple[bool, int], RequestRecord] = {}
        self._due: list = []  # (time reaching the engine, seq, request id, Request)
        self._seq = itertools.count()

    def send(self, req: Request, at: float, scheduled: Optional[float] = None) -> RequestRecord:
        rec = RequestRecord(index=req.index, scheduled_s=at if scheduled is None else scheduled, sent_s=at,
                            expected_prompt_tokens=req.prompt_len, expected_output_tokens=req.output_len,
                            warmup=req.warmup, prefix_group=req.prefix_group, prompt_tokens=req.prompt_len,
                            completion_tokens=0, session=req.session, turn=req.turn,
                            expected_cached_tokens=req.history_len)
        self.records[(req.warmup, req.index)] = rec
        heapq.heappush(self._due, (at + self.latency, next(self._seq), req))
        return rec

    def deliver(self, until: Optional[float] = None) -> list[RequestRecord]:
        """Hand the engine every request due by ``until`` (default: now); return the ones it rejected."""
        until = self.t if until is None else until
        rejected = []
        while self._due and self._due[0][0] <= until:
            due, _, req = heapq.heappop(self._due)
            at = max(due, self.t)  # reaches the engine when due, or now if it waited for the engine loop
            rec = self.records[(req.warmup, req.index)]
            rid = f"{'w' if req.warmup else 'r'}{req.index}"
            deadline = None if self.timeout_s is None else rec.sent_s + self.timeout_s
            if deadline is not None and at > deadline:  # given up before it reached the engine
                _time_out(rec, deadline, self.timeout_s)
                rejected.append(rec)
                continue
            try:
                self.core.add_request(SimRequest(rid, req.prompt_token_ids, req.output_len, arrival_s=at))
            except ValueError as e:  # the server's 400 answer
                rec.error, rec.error_kind, rec.completion_tokens = str(e), RequestErrorKind.HTTP_STATUS, None
                rec.end_s = at
                rejected.append(rec)
                continue
            self.live[rid] = rec
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, next(self._seq), rid))
        return rejected

    def expire(self) -> list[RequestRecord]:
        """Give up (and abort) the requests whose deadline passed by now."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= self.t:
            deadline, _, rid = heapq.heappop(self._deadlines)
            rec = self.live.pop(rid, None)
            if rec is not None:  # else it ended in time
                self.core.abort_request(rid)
                _time_out(rec, deadline, self.timeout_s)
                out.append(rec)
        return out

    def next_due(self) -> Optional[float]:
        return self._due[0][0] if self._due else None

    def advance(self) -> list[RequestRecord]:
        """Deliver due requests, then run one step (or idle to the next arrival). Returns requests that ended."""
        ended = self.deliver()
        if not self.core.has_work():
            nxt = self.next_due()
            if nxt is not None:
                self.t = max(self.t, nxt)
            return ended
        start = self.t

        def before_next(launch_s: float) -> None:  # requests that arrived while the step was launched
            ended.extend(self.deliver(start + launch_s))

        res = self.core.step(before_next)
        self.t = start + res.duration_s
        fe = max(self.frontend_free, self.t)
        for out in res.outputs:
            if not out.new_tokens:
                continue
            fe += self.token_s  # the API server streams the step's tokens one after another
            t = fe
            rec = self.live[out.request_id]
            if rec.first_token_s is None:
                rec.first_token_s = t
            rec.token_times_s.append(t)
            rec.completion_tokens += out.new_tokens
            if out.finished:
                rec.end_s = t
                del self.live[out.request_id]
                if self.timeout_s is not None and t > rec.sent_s + self.timeout_s:  # its end came too late
                    _time_out(rec, rec.sent_s + self.timeout_s, self.timeout_s)
                ended.append(rec)
        self.frontend_free = fe
        return ended + self.expire()

    def busy(self) -> bool:
        return bool(self._due) or self.core.has_work()


def _shift(rec: RequestRecord, dt: float) -> None:
    rec.scheduled_s += dt
    rec.sent_s = None if rec.sent_s is None else rec.sent_s + dt
    rec.first_token_s = None if rec.first_token_s is None else rec.first_token_s + dt
    rec.end_s = None if rec.end_s is None else rec.end_s + dt
    rec.finished_s = None if rec.finished_s is None else rec.finished_s + dt
    rec.token_times_s = [x + dt for x in rec.token_times_s]


def _warm_until_steady(drv: _Driver, stream) -> tuple[list[RequestRecord], str]:
    """The steady warm-up in virtual time: its records (in the order sent) and why it ended.

    The stream is played from ``drv.t`` (open loop at its arrival times, or closed loop)
    and judged every ``check_interval_s`` of virtual time, as the load generator judges
    it in real time. Unlike there, the requests in flight at the end are always run to
    completion (virtual time costs nothing; no request is cut), so ``warmup_s_used``
    includes that drain.
    """
    start = drv.t
    judge = SteadyJudge(stream.settings, start)
    sent: list[RequestRecord] = []
    requests = iter(stream)
    closed = stream.concurrency
    stopped = False

    def send(req: Request, at: float) -> None:
        rec = drv.send(req, at)
        sent.append(rec)
        judge.on_send(at, rec)

    def advance() -> None:
        for rec in drv.advance():
            judge.on_finish(drv.t, rec)
            if closed and not stopped:
                send(next(requests), max(drv.t, _ended_at(rec)))  # once its last token reached the client

    limit = max(STEADY_FLOOR, int(4 * (stream.rate or 0) * stream.settings.max_s))
    nxt = None
    if closed:
        for _ in range(closed):
            send(next(requests), start)
    else:
        nxt = next(requests)
    check = start + judge.check_interval_s
    while True:
        horizon = max(check, drv.t)
        while nxt is not None and start + nxt.arrival_s <= horizon:
            send(nxt, start + nxt.arrival_s)
            nxt = next(requests) if len(sent) < limit else None
        while drv.t < check and drv.busy():
            advance()
        drv.t = max(drv.t, check)
        reason = judge.check(drv.t)
        if reason is not None:
            break
        check = drv.t + judge.check_interval_s
    stopped = True
    while drv.busy():
        advance()
    return sent, reason


def _play_sessions(drv: _Driver, measured) -> None:
    """Multi-turn sessions: first turns at their session's start; turn k+1 once turn k's answer
    reached the client, plus its think time (closed loop within a session)."""
    following = {}
    for prev, req in zip(measured, measured[1:]):
        if req.session == prev.session and req.turn == prev.turn + 1:
            following[prev.index] = req
    for req in measured:
        if req.turn <= 1:
            drv.send(req, req.arrival_s, scheduled=req.arrival_s)
    while drv.busy():
        for rec in drv.advance():
            nxt = following.get(rec.index) if not rec.warmup else None
            if nxt is not None:
                due = max(drv.t, _ended_at(rec)) + nxt.think_s
                drv.send(nxt, due, scheduled=due)


def simulate(core: SimEngineCore, requests: RequestSet, warmup_report=None,
             timeout_s: Optional[float] = None) -> list[RequestRecord]:
    """Run the workload to completion in virtual time; records of warm-ups first, then measured by index.

    The burst's warm-ups are sent one after another, each when the previous ended; then
    the steady warm-up (``requests.warmup_stream``) runs until its judge ends it and its
    requests have finished (:func:`_warm_until_steady`); every warm-up record is shifted
    so the warm-up ends at t=0. ``warmup_report`` (an :class:`orchestrator.measure.warmup.WarmupOutcome`)
    receives its length, requests and verdict. Open loop: each measured request is sent at its
    ``arrival_s``. Closed loop (``closed_loop_concurrency`` = C): C requests at t=0,
    then the next one whenever one ends. A request the engine rejects (too long
    for max_model_len) gets an error record, as an HTTP 400 would; one not ended ``timeout_s``
    after it was sent, a ``timeout`` record, as the HTTP load generator's.
    """
    drv = _Driver(core, timeout_s)
    warm = []
    for req in requests.warmup:  # each sent once the previous one's last token reached the client
        warm.append(drv.send(req, max([drv.t] + [_ended_at(r) for r in warm[-1:]])))
        while drv.busy():
            drv.advance()
    reason = None
    if requests.warmup_stream is not None:
        steady, reason = _warm_until_steady(drv, requests.warmup_stream)
        warm += steady
    # The warm-up ends when its last token reaches the client (the API server streams after the step).
    end = max([drv.t] + [_ended_at(r) for r in warm if _ended_at(r) is not None])
    if warmup_report is not None:  # it began at 0: its length is its end
        warmup_report.seconds, warmup_report.requests = end, len(warm)
        warmup_report.converged = None if reason is None else reason == "converged"
        warmup_report.reason = reason
    for rec in warm:
        _shift(rec, -end)
    drv.frontend_free -= end
    drv.t -= end

    measured = sorted(requests.measured, key=lambda r: (r.arrival_s, r.index))
    conc = requests.closed_loop_concurrency
    if requests.sessions:
        _play_sessions(drv, requests.measured)
    elif conc is None:
        for req in measured:
            drv.send(req, req.arrival_s, scheduled=req.arrival_s)
        while drv.busy():
            drv.advance()
    else:
        todo = iter(measured)
        for req in itertools.islice(todo, max(1, conc)):
            drv.send(req, 0.0)
        while drv.busy():
            for rec in drv.advance():
                nxt = next(todo, None)
                if nxt is not None:
                    drv.send(nxt, max(drv.t, _ended_at(rec)))
    return warm + [drv.records[(False, r.index)] for r in sorted(requests.measured, key=lambda r: r.index)]
