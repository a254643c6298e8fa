"""One streaming request against an OpenAI-compatible server, and the readiness probe.

One request is one call of :func:`send_request`, whatever the API (the differences are
:data:`~orchestrator.loadgen.api.APIS`); the SSE parsing is
:class:`~orchestrator.loadgen.sse.SSEParser`, written once.

Records (see :mod:`orchestrator.measure.records`) are raw observations on the caller's clock.
Every request gets exactly one record and no exception escapes for a failed request.
Error kinds:

* ``HTTP_STATUS``: a non-200 answer (status, reason and the start of the body), or an
  ``error`` object sent inside a 200 stream (vLLM reports errors raised after the
  headers were sent this way; it is the server saying "failed", not a garbled reply);
* ``CONNECTION``: refused, reset, or the stream ended before ``data: [DONE]``;
* ``TIMEOUT``: no end of stream within ``timeout_s`` of starting the request;
* ``BAD_RESPONSE``: unparsable JSON, a body that is not an event stream, or a
  complete stream without a single token;
* ``CLIENT``: the load generator itself failed (e.g. a body that cannot be serialised);
* ``ABORTED``: the load generator cancelled it (a
  :class:`~orchestrator.loadgen.load_window.LoadMonitor` stopped the load, e.g. a
  capacity-search level that saturated the server).

A stream that ends with ``[DONE]`` but without a ``usage`` chunk (a server that ignores
``stream_options.include_usage``) still succeeds; its token count falls back to the
number of token-carrying chunks (:attr:`RequestRecord.output_tokens`). Tokens and
times received before a failure are kept in the record. Error texts are at most
:data:`~orchestrator.loadgen.api.MAX_ERROR_CHARS` characters, and the API key is
scrubbed from them.

:attr:`RequestRecord.client_s` sums the time spent handling each request's chunks
(timestamp, SSE parsing, JSON decoding): the generator's own per-token cost.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, Awaitable, Callable, Optional

import aiohttp

from orchestrator.loadgen.api import APIS, ApiFormat, Endpoint
from orchestrator.loadgen.sse import SSEParser
from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.workload.requests import Request

__all__ = ["AbortFlag", "Clock", "send_request", "wait_ready", "with_timeout"]

_BODY_SNIPPET_BYTES = 2048

Clock = Callable[[], float]


async def with_timeout(aw: Awaitable[Any], timeout_s: float) -> Any:
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


class AbortFlag:
    """Set once the load generator stops a load: a cancellation then is its own abort."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint, req: Request, *, clock: Clock,
                       timeout_s: float, ignore_eos: bool = True,
                       scheduled_s: Optional[float] = None, aborting: Optional[AbortFlag] = None,
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
        session=req.session,
        turn=req.turn,
        expected_cached_tokens=req.history_len,
    )
    if on_record is not None:
        on_record(rec)
    fmt = APIS[endpoint.api]
    parser = SSEParser()
    try:
        body = json.dumps(fmt.build_body(endpoint, req, ignore_eos), separators=(",", ":")).encode()
        await with_timeout(_exchange(session, endpoint.url, body, endpoint.headers(), fmt, rec, parser, clock),
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

                last = await with_timeout(probe(), min(remaining, 10.0))
                if last is None:
                    return
            except asyncio.TimeoutError:
                last = "no answer within the probe timeout"
            except (aiohttp.ClientError, OSError) as e:
                last = f"{type(e).__name__}: {e}"
            await asyncio.sleep(max(0.0, min(interval_s, deadline - time.perf_counter())))
