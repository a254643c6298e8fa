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
from orchestrator.loadgen.request import AbortFlag, send_request
from orchestrator.loadgen.warmup_load import warm_up
from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.measure.warmup import WarmupOutcome
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
    in_flight = _in_flight(requests, max_concurrency)
    _raise_fd_limit(_sockets_wanted(requests, in_flight) + 256)
    # One session for the window: unlimited connections (the cap, if any, is ours), no
    # session-wide timeout (each request has its own), no cookies carried between requests.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                                     timeout=aiohttp.ClientTimeout(total=None),
                                     cookie_jar=aiohttp.DummyCookieJar()) as session:
        warm, tw = await warm_up(session, endpoint, requests, timeout_s=timeout_s, ignore_eos=ignore_eos,
                                 max_concurrency=max_concurrency, report=warmup_report)
        if on_measure_start is not None:
            on_measure_start(warm)
        # Objects that exist now are not garbage of this window: keep full collections from
        # walking them (a big process can otherwise pause the loop for 100+ ms mid-load).
        gc.freeze()
        window = _Window(session, endpoint, requests.measured, timeout_s=timeout_s, ignore_eos=ignore_eos,
                         monitor=monitor, progress=_Progress(on_progress, len(requests.measured)))
        watcher: Optional[asyncio.Task] = None
        try:
            if warmup_report is not None and warm:
                # To the start of the measured window, the wait in on_measure_start included (a busy
                # engine's /metrics can take a while): the warm-up's first send is at -seconds.
                warmup_report.seconds = window.t0 - tw
            for rec in warm:  # onto the measured clock
                _shift(rec, tw - window.t0)
            if monitor is not None:
                watcher = asyncio.create_task(window.watch(check_interval_s))
            await _dispatch(window, requests, workers=in_flight, max_concurrency=max_concurrency,
                            check_interval_s=check_interval_s)
            await window.drain()
        finally:
            gc.unfreeze()
            if watcher is not None:
                watcher.cancel()
            for task in window.tasks:  # only unfinished if we were cancelled
                task.cancel()
    return warm + window.measured_records()


def _in_flight(requests: RequestSet, max_concurrency: Optional[int]) -> int:
    """How many measured requests may be in flight at once: the closed loop's workers, else all of
    them; at most ``max_concurrency``."""
    in_flight = requests.closed_loop_concurrency or len(requests.measured)
    return min(in_flight, max_concurrency) if max_concurrency else in_flight


def _sockets_wanted(requests: RequestSet, in_flight: int) -> int:
    """Sockets the load may hold open at once: the measured window's, the warm-up burst's, and the
    steady warm-up's (at most what its ``max_s`` sends)."""
    wanted = max(in_flight, len(requests.warmup))
    stream = requests.warmup_stream
    if stream is not None:
        wanted = max(wanted, stream.concurrency or int((stream.rate or 0) * stream.settings.max_s * 1.5))
    return wanted


def _never_sent(req: Request, finished_s: float) -> RequestRecord:
    """The record of a measured request the stop caught before it was on the wire."""
    return RequestRecord(index=req.index, scheduled_s=req.arrival_s, warmup=req.warmup, finished_s=finished_s,
                         error="aborted before it was sent (load stopped)", error_kind=RequestErrorKind.ABORTED)


class _Window:
    """The measured window: its clock (t0 is now), one record slot per measured request, the
    requests dispatched, their tasks, and the stop flag the monitor's watcher sets."""

    def __init__(self, session: aiohttp.ClientSession, endpoint: Endpoint, measured: list[Request], *,
                 timeout_s: float, ignore_eos: bool, monitor: Optional[LoadMonitor], progress: _Progress):
        self.session, self.endpoint, self.measured = session, endpoint, measured
        self.timeout_s, self.ignore_eos, self.monitor, self.progress = timeout_s, ignore_eos, monitor, progress
        self.records: list[Optional[RequestRecord]] = [None] * len(measured)
        self.dispatched_pos: list[int] = []
        self.tasks: list[asyncio.Task] = []
        self.aborting = AbortFlag()  # set once the monitor stops the load: no new sends, in-flight aborted
        self.t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def dispatched(self, pos: int) -> None:
        self.dispatched_pos.append(pos)
        if self.monitor is not None:
            self.monitor.on_send(self.clock())

    async def send(self, pos: int, scheduled_s: Optional[float], sem: Optional[asyncio.Semaphore]) -> None:
        """Send measured request ``pos`` (after a concurrency slot, with ``sem``) and keep its record."""
        req = self.measured[pos]
        kw = dict(clock=self.clock, timeout_s=self.timeout_s, ignore_eos=self.ignore_eos, scheduled_s=scheduled_s,
                  aborting=self.aborting)
        try:
            if sem is None:
                rec = await send_request(self.session, self.endpoint, req, **kw)
            else:
                async with sem:
                    rec = await send_request(self.session, self.endpoint, req, **kw)
        except asyncio.CancelledError:
            if not self.aborting.on:
                raise
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
            rec = _never_sent(req, self.clock())  # aborted while waiting for a concurrency slot
        except Exception as e:  # pragma: no cover - send_request does not raise
            rec = RequestRecord(index=req.index, scheduled_s=req.arrival_s, warmup=req.warmup,
                                error=f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS], error_kind=RequestErrorKind.CLIENT)
        self.records[pos] = rec
        if self.monitor is not None and rec.error_kind is not RequestErrorKind.ABORTED:
            self.monitor.on_finish(rec.finished_s if rec.finished_s is not None else self.clock(), rec)
        self.progress()

    async def watch(self, check_interval_s: float) -> None:
        """Ask the monitor every ``check_interval_s``; once it says stop, abort what is in flight."""
        while True:
            await asyncio.sleep(check_interval_s)
            if self.monitor.should_stop(self.clock()):
                self.aborting.on = True
                for task in self.tasks:
                    if not task.done():
                        task.cancel()
                return

    async def drain(self) -> None:
        """Await every request's task; a request dispatched but cancelled before its task ran gets
        its never-sent record."""
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not (self.aborting.on and isinstance(res, asyncio.CancelledError)):
                raise res
        for pos in self.dispatched_pos:
            if self.records[pos] is None:
                self.records[pos] = _never_sent(self.measured[pos], self.clock())

    def measured_records(self) -> list[RequestRecord]:
        """The measured records by index (without the requests a stop left unsent)."""
        done = [r for r in self.records if r is not None]
        assert len(done) == len(self.measured) or self.aborting.on, "a measured request has no record"
        done.sort(key=lambda r: r.index)
        return done


async def _dispatch(window: _Window, requests: RequestSet, *, workers: int, max_concurrency: Optional[int],
                    check_interval_s: float) -> None:
    """Start the measured requests: multi-turn sessions, closed-loop workers, or open loop (sent
    from here, at their arrival times)."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    # With a monitor, sleep in short steps so that a stop is seen without waiting a long gap.
    step = check_interval_s if window.monitor is not None else float("inf")
    if requests.sessions:
        window.tasks.extend(asyncio.create_task(_play_session(window, chain, sem, step))
                            for chain in _session_chains(window.measured))
    elif requests.closed_loop_concurrency:
        positions = iter(range(len(window.measured)))
        window.tasks.extend(asyncio.create_task(_closed_loop_worker(window, positions))
                            for _ in range(min(workers, len(window.measured))))
    else:
        await _play_open_loop(window, sem, step)


async def _play_open_loop(window: _Window, sem: Optional[asyncio.Semaphore], step: float) -> None:
    """Each request started at ``t0 + arrival_s``, whatever happened to the earlier ones."""
    measured = window.measured
    for pos in sorted(range(len(measured)), key=lambda i: measured[i].arrival_s):
        due = window.t0 + measured[pos].arrival_s
        while (delay := due - time.perf_counter()) > 0 and not window.aborting.on:  # sleep until due: lag never adds up
            await asyncio.sleep(min(delay, step))
        if window.aborting.on:
            break
        window.dispatched(pos)
        window.tasks.append(asyncio.create_task(window.send(pos, None, sem)))


async def _play_session(window: _Window, chain: list[int], sem: Optional[asyncio.Semaphore], step: float) -> None:
    """One multi-turn session: its first turn at ``t0 + arrival_s``, each next one ``think_s`` after
    the previous answer ended."""
    measured = window.measured
    due = window.t0 + measured[chain[0]].arrival_s
    for pos in chain:
        while (delay := due - time.perf_counter()) > 0 and not window.aborting.on:
            await asyncio.sleep(min(delay, step))
        if window.aborting.on:
            return
        window.dispatched(pos)
        await window.send(pos, due - window.t0, sem)
        rec = window.records[pos]
        ended = rec.end_s if rec.end_s is not None else rec.finished_s
        # The next turn: think time after this answer ended (closed loop within a session).
        due = window.t0 + (ended if ended is not None else window.clock())
        if pos + 1 < len(measured):
            due += measured[pos + 1].think_s


async def _closed_loop_worker(window: _Window, positions) -> None:
    """Send the next request as soon as the previous one ended."""
    for pos in positions:  # shared iterator: each worker takes the next request
        if window.aborting.on:
            return
        window.dispatched(pos)
        await window.send(pos, window.clock(), None)


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
