"""The warm-up before a load window: the burst all at once, then the steady warm-up.

:func:`warm_up` plays a :class:`RequestSet`'s warm-up requests (``requests.warmup``, sent at
once and awaited) and its steady warm-up (``requests.warmup_stream``, at the trial's own load
until :class:`~orchestrator.measure.warmup.SteadyJudge` ends it). Its records are on the
warm-up's own clock; :func:`~orchestrator.loadgen.load_window.run_load` moves them onto the
measured one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

import aiohttp

from orchestrator.loadgen.api import Endpoint
from orchestrator.loadgen.request import AbortFlag, Clock, send_request
from orchestrator.measure.records import RequestRecord
from orchestrator.measure.warmup import SteadyJudge, WarmupOutcome
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request
from orchestrator.workload.warmup_stream import WarmupStream

__all__ = ["warm_up"]

log = logging.getLogger(__name__)


async def warm_up(session: aiohttp.ClientSession, endpoint: Endpoint, requests: RequestSet, *, timeout_s: float,
                  ignore_eos: bool, max_concurrency: Optional[int],
                  report: Optional[WarmupOutcome]) -> tuple[list[RequestRecord], float]:
    """The warm-up's records (the burst by index, then the steady warm-up's in the order sent) and
    the ``time.perf_counter`` their clock starts at. ``report`` (optional) receives how long it
    took, how many requests it sent and whether the steady warm-up converged."""
    tw = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - tw

    warm: list[RequestRecord] = []
    if requests.warmup:
        warm = list(await asyncio.gather(*(
            send_request(session, endpoint, r, clock=clock, timeout_s=timeout_s, ignore_eos=ignore_eos,
                         scheduled_s=0.0)
            for r in requests.warmup)))
        warm.sort(key=lambda r: r.index)
    reason = None
    if requests.warmup_stream is not None:
        steady, reason = await _warm_until_steady(session, endpoint, requests.warmup_stream, clock=clock,
                                                  timeout_s=timeout_s, ignore_eos=ignore_eos,
                                                  max_concurrency=max_concurrency)
        warm += steady
    if report is not None:
        report.seconds, report.requests = clock() if warm else 0.0, len(warm)
        report.converged = None if reason is None else reason == "converged"
        report.reason = reason
    return warm, tw


async def _warm_until_steady(session: aiohttp.ClientSession, endpoint: Endpoint, stream: WarmupStream, *,
                             clock: Clock, timeout_s: float, ignore_eos: bool,
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
