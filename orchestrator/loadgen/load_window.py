"""Playing a :class:`RequestSet` against a server over one load window (asyncio + aiohttp).

:func:`run_load` plays a :class:`RequestSet`: warm-up first (the burst all at once,
awaited; then the steady warm-up at the trial's own load until the engine is steady,
see :mod:`orchestrator.measure.warmup`), then the measured requests, open loop at their
precomputed arrival times (or closed loop with N workers when the set says so), over
one shared session. Each request is :func:`~orchestrator.loadgen.request.send_request`.

Records are on one clock: seconds since the start of the load window (the moment the
first measured request was due; warm-up times are therefore negative). A
:class:`LoadMonitor` may stop the window; what is in flight is then aborted.

The generator measures its own cost: ``scheduled_s`` vs ``sent_s`` is its send lag,
and :attr:`RequestRecord.client_s` its time handling each request's chunks, so a
trial can show that the client was not the bottleneck (``sched_lag_*`` and
``client_us_per_token`` metrics).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any, Callable, Optional, Protocol

import aiohttp

from orchestrator.loadgen.api import MAX_ERROR_CHARS, Endpoint
from orchestrator.loadgen.request import AbortFlag, Clock, send_request
from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.measure.warmup import SteadyJudge, WarmupOutcome
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None

__all__ = ["LoadMonitor", "ProgressFn", "run_load", "run_load_sync"]

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (measured requests finished, measured requests in all)


def _raise_fd_limit(wanted: int) -> None:
    """Let the process open ``wanted`` sockets (soft RLIMIT_NOFILE up to the hard limit)."""
    if resource is None:  # pragma: no cover - not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):  # pragma: no cover
        log.warning("could not raise the open-file limit from %d to %d", soft, new)


class LoadMonitor(Protocol):
    """Watches a load window and may stop it (e.g. :class:`orchestrator.trial.capacity.SaturationDetector`).

    ``on_send`` is called when a measured request is dispatched, ``on_finish`` when its
    record is complete; ``should_stop`` every ``check_interval_s``. Times are seconds on
    the records' clock.
    """

    def on_send(self, t: float) -> None: ...

    def on_finish(self, t: float, record: RequestRecord) -> None: ...

    def should_stop(self, t: float) -> bool: ...


class _Progress:
    def __init__(self, fn: Optional[ProgressFn], total: int):
        self.fn, self.total, self.done = fn, total, 0

    def __call__(self) -> None:
        self.done += 1
        if self.fn is not None:
            try:
                self.fn(self.done, self.total)
            except Exception:  # a broken progress bar must not lose records
                log.exception("on_progress failed; progress reporting disabled")
                self.fn = None


async def run_load(endpoint: Endpoint, requests: RequestSet, *, timeout_s: float,
                   max_concurrency: Optional[int] = None, ignore_eos: bool = True,
                   on_progress: Optional[ProgressFn] = None, monitor: Optional[LoadMonitor] = None,
                   check_interval_s: float = 0.5,
                   on_measure_start: Optional[Callable[[list[RequestRecord]], None]] = None,
                   warmup_report: Optional[WarmupOutcome] = None) -> list[RequestRecord]:
    """Play ``requests`` against ``endpoint``; one record per request, warm-up first (in the
    order sent), then the measured ones by index.

    The warm-up burst (``requests.warmup``) is sent all at once and awaited; then, if the
    set has a ``warmup_stream``, the steady warm-up plays it at its own arrival times (or
    closed loop) until :class:`~orchestrator.measure.warmup.SteadyJudge` ends it; once converged its
    requests in flight are awaited, otherwise aborted (:mod:`orchestrator.measure.warmup`).
    Warm-up records are flagged ``warmup``; their times are negative on the measured clock.
    ``warmup_report`` (optional) receives how long the warm-up took, how many requests it
    sent and whether it converged. Then a fresh t0 starts the load window:

    * open loop: each request is started at ``t0 + arrival_s`` whatever happened to the
      earlier ones (sleep-until on ``time.perf_counter``, so lag never accumulates);
      with ``max_concurrency`` it then waits for a slot, and ``sent_s`` is when it got
      one while ``scheduled_s`` stays its due time;
    * multi-turn sessions (``requests.sessions``): one task per session sends its first turn
      at ``t0 + arrival_s`` and each next turn ``think_s`` after the previous answer's last
      token (or after the client gave up on it); ``scheduled_s`` is that due time;
    * closed loop (``requests.closed_loop_concurrency`` = N): N workers (at most
      ``max_concurrency``) each send the next request as soon as their previous one
      ends; ``scheduled_s`` is when the worker picked it.

    ``monitor`` (optional) sees every measured send and finish; once its ``should_stop``
    answers True, no further request is sent and those in flight are aborted (records
    of kind ``ABORTED``); a request already due but not yet on the wire (a busy event loop)
    is an ``ABORTED`` record without ``sent_s``; requests not yet due get no record.

    ``on_measure_start(warm-up records)`` is called once the warm-up requests are done,
    right before the measured clock starts (the engine-side telemetry snapshots its
    histograms there; it may block: nothing is in flight).

    ``on_progress(done, total)`` is called after each measured request. The soft
    open-file limit is raised (up to the hard limit) if it is below the number of
    sockets the load may hold open at once, and the objects alive at t0 are
    ``gc.freeze()``-d for the window (then unfrozen) so that the garbage collector's
    full passes, which would otherwise walk the whole process, do not stall the loop.
    """
    measured = requests.measured
    n = len(measured)
    closed = requests.closed_loop_concurrency
    in_flight = closed or n
    if max_concurrency:
        in_flight = min(in_flight, max_concurrency)
    wanted = max(in_flight, len(requests.warmup))
    stream = requests.warmup_stream
    if stream is not None:  # the steady warm-up's requests in flight: at most what max_s sends
        wanted = max(wanted, stream.concurrency or int((stream.rate or 0) * stream.settings.max_s * 1.5))
    _raise_fd_limit(wanted + 256)

    now = time.perf_counter
    records: list[Optional[RequestRecord]] = [None] * n
    progress = _Progress(on_progress, n)
    # One session for the window: unlimited connections (the cap, if any, is ours), no
    # session-wide timeout (each request has its own), no cookies carried between requests.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                                     timeout=aiohttp.ClientTimeout(total=None),
                                     cookie_jar=aiohttp.DummyCookieJar()) as session:
        warm: list[RequestRecord] = []
        tw = now()
        if requests.warmup:
            warm = list(await asyncio.gather(*(
                send_request(session, endpoint, r, clock=lambda: now() - tw, timeout_s=timeout_s,
                             ignore_eos=ignore_eos, scheduled_s=0.0)
                for r in requests.warmup)))
            warm.sort(key=lambda r: r.index)
        reason = None
        if requests.warmup_stream is not None:
            steady, reason = await _warm_until_steady(session, endpoint, requests.warmup_stream,
                                                      clock=lambda: now() - tw, timeout_s=timeout_s,
                                                      ignore_eos=ignore_eos, max_concurrency=max_concurrency)
            warm += steady
        if warmup_report is not None:
            warmup_report.seconds, warmup_report.requests = (now() - tw) if warm else 0.0, len(warm)
            warmup_report.converged = None if reason is None else reason == "converged"
            warmup_report.reason = reason
        if on_measure_start is not None:
            on_measure_start(warm)
        # Objects that exist now are not garbage of this window: keep full collections from
        # walking them (a big process can otherwise pause the loop for 100+ ms mid-load).
        gc.freeze()
        tasks: list[asyncio.Task] = []
        aborting = AbortFlag()  # set once the monitor stops the load: no new sends, in-flight aborted
        watcher: Optional[asyncio.Task] = None
        try:
            t0 = now()
            if warmup_report is not None and warm:
                # To the start of the measured window, the wait in on_measure_start included (a busy
                # engine's /metrics can take a while): the warm-up's first send is at -seconds.
                warmup_report.seconds = t0 - tw
            for rec in warm:  # onto the measured clock
                _shift(rec, tw - t0)

            def clock() -> float:
                return now() - t0

            async def one(pos: int, scheduled_s: Optional[float], sem: Optional[asyncio.Semaphore]) -> None:
                req = measured[pos]
                try:
                    if sem is None:
                        rec = await send_request(session, endpoint, req, clock=clock, timeout_s=timeout_s,
                                                 ignore_eos=ignore_eos, scheduled_s=scheduled_s, aborting=aborting)
                    else:
                        async with sem:
                            rec = await send_request(session, endpoint, req, clock=clock, timeout_s=timeout_s,
                                                     ignore_eos=ignore_eos, scheduled_s=scheduled_s,
                                                     aborting=aborting)
                except asyncio.CancelledError:
                    if not aborting.on:
                        raise
                    task = asyncio.current_task()
                    if task is not None and hasattr(task, "uncancel"):
                        task.uncancel()
                    # Aborted while waiting for a concurrency slot: never sent.
                    rec = RequestRecord(index=req.index, scheduled_s=req.arrival_s, warmup=req.warmup,
                                        finished_s=clock(), error="aborted before it was sent (load stopped)",
                                        error_kind=RequestErrorKind.ABORTED)
                except Exception as e:  # pragma: no cover - send_request does not raise
                    rec = RequestRecord(index=req.index, scheduled_s=req.arrival_s, warmup=req.warmup,
                                        error=f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS],
                                        error_kind=RequestErrorKind.CLIENT)
                records[pos] = rec
                if monitor is not None and rec.error_kind is not RequestErrorKind.ABORTED:
                    monitor.on_finish(rec.finished_s if rec.finished_s is not None else clock(), rec)
                progress()

            dispatched_pos: list[int] = []

            def dispatched(pos: int) -> None:
                dispatched_pos.append(pos)
                if monitor is not None:
                    monitor.on_send(clock())

            async def watch() -> None:
                while True:
                    await asyncio.sleep(check_interval_s)
                    if monitor.should_stop(clock()):
                        aborting.on = True
                        for task in tasks:
                            if not task.done():
                                task.cancel()
                        return

            if monitor is not None:
                watcher = asyncio.create_task(watch())
            if requests.sessions:
                sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
                step = check_interval_s if monitor is not None else float("inf")

                async def play_session(chain: list[int]) -> None:
                    due = t0 + measured[chain[0]].arrival_s
                    for pos in chain:
                        while (delay := due - now()) > 0 and not aborting.on:
                            await asyncio.sleep(min(delay, step))
                        if aborting.on:
                            return
                        dispatched(pos)
                        await one(pos, due - t0, sem)
                        rec = records[pos]
                        ended = rec.end_s if rec.end_s is not None else rec.finished_s
                        # The next turn: think time after this answer ended (closed loop within a session).
                        due = t0 + (ended if ended is not None else clock())
                        if pos + 1 < n:
                            due += measured[pos + 1].think_s

                tasks = [asyncio.create_task(play_session(chain)) for chain in _session_chains(measured)]
            elif closed:
                positions = iter(range(n))

                async def worker() -> None:
                    for pos in positions:  # shared iterator: each worker takes the next request
                        if aborting.on:
                            return
                        dispatched(pos)
                        await one(pos, clock(), None)

                tasks = [asyncio.create_task(worker()) for _ in range(min(in_flight, n))]
            else:
                sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
                # With a monitor, sleep in short steps so that a stop is seen without waiting a long gap.
                step = check_interval_s if monitor is not None else float("inf")
                for pos in sorted(range(n), key=lambda i: measured[i].arrival_s):
                    due = t0 + measured[pos].arrival_s
                    while (delay := due - now()) > 0 and not aborting.on:  # sleep until due: lag never adds up
                        await asyncio.sleep(min(delay, step))
                    if aborting.on:
                        break
                    dispatched(pos)
                    tasks.append(asyncio.create_task(one(pos, None, sem)))
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for res in results:
                if isinstance(res, BaseException) and not (aborting.on and isinstance(res, asyncio.CancelledError)):
                    raise res
            for pos in dispatched_pos:
                if records[pos] is None:  # cancelled by the stop before its task ever ran: never sent
                    req = measured[pos]
                    records[pos] = RequestRecord(index=req.index, scheduled_s=req.arrival_s, warmup=req.warmup,
                                                 finished_s=clock(), error_kind=RequestErrorKind.ABORTED,
                                                 error="aborted before it was sent (load stopped)")
        finally:
            gc.unfreeze()
            if watcher is not None:
                watcher.cancel()
            for task in tasks:  # only unfinished if we were cancelled
                task.cancel()

    done = [r for r in records if r is not None]
    assert len(done) == n or aborting.on, "a measured request has no record"
    done.sort(key=lambda r: r.index)
    return warm + done


async def _warm_until_steady(session: aiohttp.ClientSession, endpoint: Endpoint, stream, *, clock: Clock,
                             timeout_s: float, ignore_eos: bool,
                             max_concurrency: Optional[int]) -> tuple[list[RequestRecord], str]:
    """Play the steady warm-up until its judge ends it; its records (in the order sent) and why it ended.

    Open loop: request i is sent at ``start + arrival_s`` (sleeping in short steps, so the
    end is seen at once); closed loop: ``stream.concurrency`` workers. Converged: the
    requests in flight are awaited; otherwise they are aborted (records of kind ``ABORTED``).
    """
    start = clock()
    judge = SteadyJudge(stream.settings, start)
    sent: list[RequestRecord] = []
    tasks: list[asyncio.Task] = []
    aborting = AbortFlag()
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    def on_record(rec: RequestRecord) -> None:
        sent.append(rec)
        judge.on_send(clock(), rec)

    async def one(req: Request, scheduled_s: float) -> None:
        kw = dict(clock=clock, timeout_s=timeout_s, ignore_eos=ignore_eos, scheduled_s=scheduled_s,
                  aborting=aborting, on_record=on_record)
        if sem is None:
            rec = await send_request(session, endpoint, req, **kw)
        else:
            async with sem:
                rec = await send_request(session, endpoint, req, **kw)
        judge.on_finish(rec.finished_s if rec.finished_s is not None else clock(), rec)

    async def watch() -> str:
        while True:
            await asyncio.sleep(judge.check_interval_s)
            reason = judge.check(clock())
            if reason is not None:
                return reason

    watcher = asyncio.create_task(watch())
    requests = iter(stream)
    try:
        if stream.concurrency is not None:
            async def worker() -> None:
                while not watcher.done():
                    await one(next(requests), clock())

            n = stream.concurrency if not max_concurrency else min(stream.concurrency, max_concurrency)
            tasks = [asyncio.create_task(worker()) for _ in range(n)]
            await asyncio.wait([watcher, *tasks], return_when=asyncio.FIRST_COMPLETED)
        else:
            for req in requests:
                due = start + req.arrival_s
                slept = False
                while (delay := due - clock()) > 0 and not watcher.done():
                    await asyncio.sleep(min(delay, judge.check_interval_s))
                    slept = True
                if watcher.done():
                    break
                tasks.append(asyncio.create_task(one(req, due)))
                if not slept:  # overdue: still let the watcher (and the sends) run
                    await asyncio.sleep(0)
        reason = await watcher
        if reason != "converged":
            aborting.on = True
            for task in tasks:
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                raise res
    finally:
        watcher.cancel()
        for task in tasks:  # only unfinished if we were cancelled
            task.cancel()
    log.info("steady warm-up: %s after %.2f s, %d requests", reason, clock() - start, len(sent))
    return sent, reason


def _session_chains(measured) -> list[list[int]]:
    """Positions of each session's turns, in turn order (a session's turns are consecutive)."""
    chains: list[list[int]] = []
    for pos, req in enumerate(measured):
        if chains and req.turn > 1 and measured[chains[-1][-1]].session == req.session:
            chains[-1].append(pos)
        else:
            chains.append([pos])
    return chains


def _shift(rec: RequestRecord, dt: float) -> None:
    rec.scheduled_s += dt
    if rec.sent_s is not None:
        rec.sent_s += dt
    if rec.first_token_s is not None:
        rec.first_token_s += dt
    if rec.end_s is not None:
        rec.end_s += dt
    if rec.finished_s is not None:
        rec.finished_s += dt
    rec.token_times_s = [t + dt for t in rec.token_times_s]


def run_load_sync(endpoint: Endpoint, requests: RequestSet, **kwargs: Any) -> list[RequestRecord]:
    """:func:`run_load` from synchronous code (starts and closes its own event loop)."""
    return asyncio.run(run_load(endpoint, requests, **kwargs))
