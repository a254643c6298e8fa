"""Streaming HTTP load generator for OpenAI-compatible servers (asyncio + aiohttp).

One request is one call of :func:`send_request`, whatever the API: the differences
between ``/v1/completions`` and ``/v1/chat/completions`` (request body, which chunk
carries a token) live in the small :data:`APIS` registry, and the SSE parsing is
:class:`~orchestrator.loadgen.sse.SSEParser`, written once.

:func:`run_load` plays a :class:`RequestSet`: warm-up first (the burst all at once,
awaited; then the steady warm-up at the trial's own load until the engine is steady,
see :mod:`orchestrator.warmup`), then the measured requests, open loop at their
precomputed arrival times (or closed loop with N workers when the set says so), over
one shared session.

Records (see :mod:`orchestrator.records`) are raw observations on one clock: seconds
since the start of the load window (the moment the first measured request was due;
warm-up times are therefore negative). Every request gets exactly one record and no
exception escapes for a failed request. Error kinds:

* ``HTTP_STATUS``: a non-200 answer (status, reason and the start of the body), or an
  ``error`` object sent inside a 200 stream (vLLM reports errors raised after the
  headers were sent this way; it is the server saying "failed", not a garbled reply);
* ``CONNECTION``: refused, reset, or the stream ended before ``data: [DONE]``;
* ``TIMEOUT``: no end of stream within ``timeout_s`` of starting the request;
* ``BAD_RESPONSE``: unparsable JSON, a body that is not an event stream, or a
  complete stream without a single token;
* ``CLIENT``: the load generator itself failed (e.g. a body that cannot be serialised);
* ``ABORTED``: the load generator cancelled it (a :class:`LoadMonitor` stopped the load,
  e.g. a capacity-search level that saturated the server).

A stream that ends with ``[DONE]`` but without a ``usage`` chunk (a server that ignores
``stream_options.include_usage``) still succeeds; its token count falls back to the
number of token-carrying chunks (:attr:`RequestRecord.output_tokens`). Tokens and
times received before a failure are kept in the record. Error texts are at most
:data:`MAX_ERROR_CHARS` characters, and the API key is sent only in the
``Authorization`` header: it is scrubbed from any error text and never stored.

The generator measures its own cost: ``scheduled_s`` vs ``sent_s`` is its send lag,
and :attr:`RequestRecord.client_s` sums the time spent handling each request's
chunks (timestamp, SSE parsing, JSON decoding), so a trial can show that the client
was not the bottleneck (``sched_lag_*`` and ``client_us_per_token`` metrics).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal, Optional, Protocol

import aiohttp

from orchestrator.loadgen.sse import SSEParser
from orchestrator.records import RequestErrorKind, RequestRecord
from orchestrator.warmup import SteadyJudge, WarmupOutcome
from orchestrator.workload.generate import token_ids_to_text
from orchestrator.workload.requests import Request, RequestSet

__all__ = [
    "APIS", "ApiFormat", "Endpoint", "LoadMonitor", "MAX_ERROR_CHARS", "ProgressFn",
    "run_load", "run_load_sync", "send_request", "wait_ready",
]

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 500
_BODY_SNIPPET_BYTES = 2048

ApiName = Literal["completions", "chat"]
Clock = Callable[[], float]
ProgressFn = Callable[[int, int], None]  # (measured requests finished, measured requests in all)


# ---------------------------------------------------------------- API formats
@dataclass(frozen=True)
class ApiFormat:
    """What differs between two OpenAI-style streaming APIs."""

    path: str  # appended to Endpoint.base_url
    build_body: Callable[["Endpoint", Request, bool], dict]  # (endpoint, request, ignore_eos) -> JSON body
    carries_token: Callable[[dict], bool]  # choices[0] of a chunk -> does it carry generated tokens?


def _common(endpoint: "Endpoint", req: Request, ignore_eos: bool) -> dict:
    return {
        "model": endpoint.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
        "temperature": 0,
    }


def _completions_body(endpoint: "Endpoint", req: Request, ignore_eos: bool) -> dict:
    body = _common(endpoint, req, ignore_eos)
    # Token ids (the server does not tokenize), or a trace's / dataset's own text.
    body["prompt"] = req.prompt_token_ids if req.prompt_text is None else req.prompt_text
    body["max_tokens"] = req.output_len
    body.update(endpoint.extra_body)
    return body


def _chat_body(endpoint: "Endpoint", req: Request, ignore_eos: bool) -> dict:
    body = _common(endpoint, req, ignore_eos)
    text = token_ids_to_text(req.prompt_token_ids) if req.prompt_text is None else req.prompt_text
    body["messages"] = [{"role": "user", "content": text}]
    # The chat API's name for the output limit (``max_tokens`` is deprecated there),
    # as ``vllm bench serve`` sends it.
    body["max_completion_tokens"] = req.output_len
    body.update(endpoint.extra_body)
    return body


def _completions_token(choice: dict) -> bool:
    # ``text`` may be "" for a token that detokenizes to nothing; it still is a token.
    return choice.get("text") is not None


def _chat_token(choice: dict) -> bool:
    delta = choice.get("delta")
    if not delta:
        return False
    content = delta.get("content")
    if content is not None:
        # vLLM's first chunk is {"role": "assistant", "content": ""}: no token yet.
        return content != "" or "role" not in delta
    # Reasoning parsers stream thinking tokens outside ``content``.
    return delta.get("reasoning_content") is not None or delta.get("reasoning") is not None


APIS: dict[str, ApiFormat] = {
    "completions": ApiFormat("/v1/completions", _completions_body, _completions_token),
    "chat": ApiFormat("/v1/chat/completions", _chat_body, _chat_token),
}


@dataclass
class Endpoint:
    """Where to send requests: ``base_url`` (e.g. ``http://127.0.0.1:8000/trial-3``) + API path."""

    base_url: str
    model: str
    api: ApiName = "completions"
    api_key: Optional[str] = field(default=None, repr=False)
    extra_body: dict = field(default_factory=dict)  # merged into every request body (overrides ours)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"unknown api {self.api!r}; valid: {sorted(APIS)}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + APIS[self.api].path

    @property
    def models_url(self) -> str:
        return self.base_url.rstrip("/") + "/v1/models"

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def scrub(self, text: str) -> str:
        """``text`` without the API key, cut to :data:`MAX_ERROR_CHARS`."""
        if self.api_key and self.api_key in text:
            text = text.replace(self.api_key, "***")
        return text[:MAX_ERROR_CHARS]


# ---------------------------------------------------------------- one request
async def _with_timeout(aw: Awaitable[Any], timeout_s: float) -> Any:
    """Await ``aw`` under a deadline; raises ``asyncio.TimeoutError`` when it passes."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await aw
    return await asyncio.wait_for(aw, timeout_s)  # pragma: no cover - Python 3.10


def _fail(rec: RequestRecord, kind: RequestErrorKind, text: str) -> None:
    rec.error_kind = kind
    rec.error = text or kind.value


_json_decode = json.JSONDecoder().decode  # json.loads minus its per-call type and encoding checks


def _consume(events: list[bytes], t: float, carries_token: Callable[[dict], bool], rec: RequestRecord) -> bool:
    """Apply the events of one network read (arrived at ``t``); True if one was an error.

    Raises ``ValueError`` for a payload that is not a JSON object.
    """
    decode = _json_decode
    for payload in events:
        try:
            data = decode(payload.decode())
        except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{e}; payload: {payload[:200]!r}") from None
        if not isinstance(data, dict):
            raise ValueError(f"payload is not a JSON object: {payload[:200]!r}")
        choices = data.get("choices")
        if choices and carries_token(choices[0]):
            rec.token_times_s.append(t)
        usage = data.get("usage")
        if usage:
            if usage.get("prompt_tokens") is not None:
                rec.prompt_tokens = usage["prompt_tokens"]
            if usage.get("completion_tokens") is not None:
                rec.completion_tokens = usage["completion_tokens"]
        err = data.get("error")
        if err is not None:
            if isinstance(err, dict):
                msg = f"error in stream (code {err.get('code')}, {err.get('type')}): {err.get('message')}"
            else:
                msg = f"error in stream: {err}"
            _fail(rec, RequestErrorKind.HTTP_STATUS, msg)
            return True
    return False


async def _exchange(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict,
                    fmt: ApiFormat, rec: RequestRecord, parser: SSEParser, clock: Clock) -> None:
    """POST and read the stream into ``rec``; failures are written to ``rec``, not raised."""
    carries_token = fmt.carries_token
    try:
        rec.sent_s = clock()
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                snippet = (await resp.content.read(_BODY_SNIPPET_BYTES)).decode("utf-8", "replace")
                _fail(rec, RequestErrorKind.HTTP_STATUS, f"HTTP {resp.status} {resp.reason or ''}: {snippet}")
                return
            async for chunk in resp.content.iter_any():
                if parser.done:
                    continue  # drain to the end of the body so the connection can be reused
                t = clock()  # one timestamp per network read: its events arrived together
                events = parser.feed(chunk)
                failed = bool(events) and _consume(events, t, carries_token, rec)
                rec.client_s += clock() - t
                if failed:
                    return
        if not parser.done:
            events = parser.flush()  # an event missing only its final blank line
            if events:
                _consume(events, clock(), carries_token, rec)
    except (aiohttp.ClientError, OSError) as e:
        if parser.done:
            return  # everything arrived; only the close after [DONE] went wrong
        _fail(rec, RequestErrorKind.CONNECTION, f"{type(e).__name__}: {e}")
    except ValueError as e:
        _fail(rec, RequestErrorKind.BAD_RESPONSE, str(e))


def _finish(rec: RequestRecord, parser: SSEParser) -> None:
    """Judge a stream that ended without an error of its own."""
    if not parser.done:
        if not rec.token_times_s and parser.invalid_lines:
            _fail(rec, RequestErrorKind.BAD_RESPONSE,
                  f"not an event stream ({parser.invalid_lines} invalid lines); first: {parser.first_invalid!r}")
        else:
            _fail(rec, RequestErrorKind.CONNECTION,
                  f"stream ended before [DONE] after {len(rec.token_times_s)} token chunks")
    elif not rec.token_times_s:
        _fail(rec, RequestErrorKind.BAD_RESPONSE, "complete stream without any token")


class _Flag:
    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint, req: Request, *, clock: Clock,
                       timeout_s: float, ignore_eos: bool = True,
                       scheduled_s: Optional[float] = None, aborting: Optional[_Flag] = None,
                       on_record: Optional[Callable[[RequestRecord], None]] = None) -> RequestRecord:
    """Send one streaming request and record what happened; never raises for a failed request.

    ``clock()`` gives the record's time axis (seconds). ``scheduled_s`` defaults to
    ``req.arrival_s``. ``timeout_s`` bounds the whole request, connection included.
    A cancellation while ``aborting.on`` is our own abort: the request is recorded as
    ``ABORTED`` (what arrived until then is kept); any other cancellation propagates.
    ``on_record(record)`` is called with the record as soon as it exists (before the send),
    for a watcher that reads its tokens as they arrive (the steady warm-up's judge).
    """
    rec = RequestRecord(
        index=req.index,
        scheduled_s=req.arrival_s if scheduled_s is None else scheduled_s,
        expected_prompt_tokens=req.prompt_len,
        expected_output_tokens=req.output_len,
        warmup=req.warmup,
        prefix_group=req.prefix_group,
    )
    if on_record is not None:
        on_record(rec)
    fmt = APIS[endpoint.api]
    parser = SSEParser()
    try:
        body = json.dumps(fmt.build_body(endpoint, req, ignore_eos), separators=(",", ":")).encode()
        await _with_timeout(_exchange(session, endpoint.url, body, endpoint.headers(), fmt, rec, parser, clock),
                            timeout_s)
        if rec.error is None:
            _finish(rec, parser)
    except asyncio.TimeoutError:
        if rec.error is None:
            if parser.done:  # complete, but the server did not close the stream after [DONE]
                _finish(rec, parser)
            else:
                _fail(rec, RequestErrorKind.TIMEOUT,
                      f"no end of stream within {timeout_s:g} s ({len(rec.token_times_s)} token chunks received)")
    except asyncio.CancelledError:
        if aborting is None or not aborting.on:
            raise
        task = asyncio.current_task()
        if task is not None and hasattr(task, "uncancel"):
            task.uncancel()  # the cancellation is handled here (Python 3.11+ bookkeeping)
        _fail(rec, RequestErrorKind.ABORTED,
              f"aborted by the load generator after {len(rec.token_times_s)} token chunks (load stopped)")
    except Exception as e:  # a bug of ours, not the server's
        _fail(rec, RequestErrorKind.CLIENT, f"{type(e).__name__}: {e}")
    if rec.token_times_s:
        rec.first_token_s = rec.token_times_s[0]
        rec.end_s = rec.token_times_s[-1]
    rec.finished_s = clock()
    if rec.error is not None:
        rec.error = endpoint.scrub(rec.error)
    return rec


# ---------------------------------------------------------------- a whole load window
def _raise_fd_limit(wanted: int) -> None:
    """Let the process open ``wanted`` sockets (soft RLIMIT_NOFILE up to the hard limit)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
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
    """Watches a load window and may stop it (e.g. :class:`orchestrator.capacity.SaturationDetector`).

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
    closed loop) until :class:`~orchestrator.warmup.SteadyJudge` ends it; once converged its
    requests in flight are awaited, otherwise aborted (:mod:`orchestrator.warmup`).
    Warm-up records are flagged ``warmup``; their times are negative on the measured clock.
    ``warmup_report`` (optional) receives how long the warm-up took, how many requests it
    sent and whether it converged. Then a fresh t0 starts the load window:

    * open loop: each request is started at ``t0 + arrival_s`` whatever happened to the
      earlier ones (sleep-until on ``time.perf_counter``, so lag never accumulates);
      with ``max_concurrency`` it then waits for a slot, and ``sent_s`` is when it got
      one while ``scheduled_s`` stays its due time;
    * closed loop (``requests.closed_loop_concurrency`` = N): N workers (at most
      ``max_concurrency``) each send the next request as soon as their previous one
      ends; ``scheduled_s`` is when the worker picked it.

    ``monitor`` (optional) sees every measured send and finish; once its ``should_stop``
    answers True, no further request is sent and those in flight are aborted (records
    of kind ``ABORTED``); requests never sent get no record.

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
        aborting = _Flag()  # set once the monitor stops the load: no new sends, in-flight aborted
        watcher: Optional[asyncio.Task] = None
        try:
            t0 = now()
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
            if closed:
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
    aborting = _Flag()
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


async def wait_ready(endpoint: Endpoint, timeout_s: float, *, interval_s: float = 0.5) -> None:
    """Poll ``GET {base_url}/v1/models`` until it answers 200.

    Raises ``TimeoutError`` (with the last error seen) after ``timeout_s``.
    """
    url = endpoint.models_url
    headers = {k: v for k, v in endpoint.headers().items() if k == "Authorization"}
    deadline = time.perf_counter() + timeout_s
    last = "no attempt made"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError(endpoint.scrub(f"{url} not ready after {timeout_s:g} s; last error: {last}"))
            try:
                async def probe() -> Optional[str]:
                    async with session.get(url, headers=headers) as resp:
                        if resp.status == 200:
                            return None
                        text = (await resp.content.read(_BODY_SNIPPET_BYTES)).decode("utf-8", "replace")
                        return f"HTTP {resp.status}: {text}"

                last = await _with_timeout(probe(), min(remaining, 10.0))
                if last is None:
                    return
            except asyncio.TimeoutError:
                last = "no answer within the probe timeout"
            except (aiohttp.ClientError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
            await asyncio.sleep(max(0.0, min(interval_s, deadline - time.perf_counter())))
