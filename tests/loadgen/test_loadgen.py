"""Load generator against a real local HTTP server speaking the OpenAI streaming protocol
(``fake_openai.py``: its misbehaviours and timing knobs)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time

import aiohttp
import numpy as np
import pytest

from orchestrator.loadgen import Endpoint, SSEParser, run_load_sync, send_request, wait_ready
from orchestrator.measure.metrics import summarise
from orchestrator.measure.records import RequestErrorKind
from orchestrator.measure.warmup import WarmupOutcome
from orchestrator.workload.generate import build_requests, token_ids_to_text
from orchestrator.workload.spec import WorkloadSpec
from support.fake_openai import API_KEY, CHAT_TEMPLATE_TOKENS, endpoint, fake, make_set, server  # noqa: F401 - fixtures


async def one_request(ep: Endpoint, req, timeout_s: float = 2.0):
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        return await send_request(session, ep, req, clock=lambda: time.perf_counter() - t0, timeout_s=timeout_s)


# ================================================================ SSE parser
STREAM = (b": keep-alive\n\n"
          b"data: {\"a\": 1}\n\n"
          b"event: message\nid: 7\ndata: {\"b\":\ndata: 2}\n\n"
          b"data:{\"c\": 3}\r\n\r\n"
          b"data: {\"d\": 4}\r\r"
          b"data: [DONE]\n\n"
          b"data: {\"after\": 1}\n\n")
EXPECTED = [b'{"a": 1}', b'{"b":\n2}', b'{"c": 3}', b'{"d": 4}']


def test_sse_parser_whole_stream():
    p = SSEParser()
    assert p.feed(STREAM) == EXPECTED
    assert p.done and p.invalid_lines == 0
    assert p.feed(b"data: {}\n\n") == []  # nothing after [DONE]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13])
def test_sse_parser_any_split(size):
    p = SSEParser()
    out = []
    for i in range(0, len(STREAM), size):
        out += p.feed(STREAM[i:i + size])
    assert out == EXPECTED and p.done


def test_sse_parser_every_cut_point():
    for cut in range(len(STREAM)):
        p = SSEParser()
        assert p.feed(STREAM[:cut]) + p.feed(STREAM[cut:]) == EXPECTED, cut


def test_sse_parser_flush_and_invalid_lines():
    p = SSEParser()
    assert p.feed(b"data: {\"x\": 1}\n") == []  # no blank line yet
    assert p.flush() == [b'{"x": 1}']
    p = SSEParser()
    assert p.feed(b"data: {\"x\": 1") == []
    assert p.flush() == []  # a cut line is not an event
    p = SSEParser()
    assert p.feed(b"data: [DONE]\r") == []
    assert p.flush() == [] and p.done
    p = SSEParser()
    assert p.feed(b"<html>\nnot sse\n\n") == []
    assert p.invalid_lines == 2 and p.first_invalid == b"<html>"


# ================================================================ happy paths
def test_completions_stream(fake):
    rs = make_set(4, rate=20, output_len=6, warmup=1)
    ep = endpoint(fake, fake_ttft_ms=40, fake_itl_ms=8)
    recs = run_load_sync(ep, rs, timeout_s=5)
    assert [r.index for r in recs] == [-1, 0, 1, 2, 3]
    assert recs[0].warmup and not any(r.warmup for r in recs[1:])
    assert recs[0].sent_s < 0  # warm-up happened before the load window
    for r, req in zip(recs, rs.warmup + rs.measured):
        assert r.success, r.error
        assert r.completion_tokens == 6 == len(r.token_times_s)
        assert r.prompt_tokens == req.prompt_len == r.expected_prompt_tokens
        assert r.expected_output_tokens == 6
        assert r.first_token_s == r.token_times_s[0] and r.end_s == r.token_times_s[-1]
        assert r.token_times_s == sorted(r.token_times_s)
        # Lower bounds are the server's sleeps (causal); no upper bound on this machine's time (what
        # the client adds is measured in benchmarks/loadgen_fidelity.py). The order of events is fixed:
        assert r.scheduled_s <= r.sent_s < r.first_token_s <= r.end_s <= r.finished_s
        assert 0.035 <= r.ttft_s
        # The server sleeps 40 ms, then 8 ms before each further token: token k cannot
        # arrive before sent + 40 + 8k ms (single gaps jitter around 8 ms, their sum cannot).
        assert all(t - r.sent_s >= 0.040 + 0.008 * k - 0.001 for k, t in enumerate(r.token_times_s))
        assert all(x >= 0 for x in r.itl_s) and 0.006 < sum(r.itl_s) / len(r.itl_s)
        assert 0.035 + 5 * 0.006 <= r.latency_s and 0.006 <= r.tpot_s
        assert r.latency_s == pytest.approx(r.ttft_s + sum(r.itl_s))  # one clock: the parts add up
    # Never sent early, and sent in the order due.
    assert all(r.sent_s >= r.scheduled_s for r in recs[1:])
    assert sorted(recs[1:], key=lambda r: r.sent_s) == sorted(recs[1:], key=lambda r: r.scheduled_s)
    assert [r.scheduled_s for r in recs[1:]] == [0.0, 0.05, 0.1, 0.15]

    stats = fake.stats()
    body = stats["bodies"][-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0 and body["max_tokens"] == 6
    assert body["prompt"] == list(rs.measured[-1].prompt_token_ids)
    assert stats["auth"] == [f"Bearer {API_KEY}"] * 5
    m = summarise(recs)
    assert m.completed == 4 and m.failed == 0 and m.total_output_tokens == 24
    assert gc.get_freeze_count() == 0  # frozen for the window only


def test_chat_stream_skips_the_role_chunk(fake):
    rs = make_set(3, rate=50, output_len=5, input_len=9)
    recs = run_load_sync(endpoint(fake, api="chat", fake_ttft_ms=30), rs, timeout_s=5)
    for r, req in zip(recs, rs.measured):
        assert r.success, r.error
        assert len(r.token_times_s) == 5 == r.completion_tokens
        assert r.prompt_tokens == 9 + CHAT_TEMPLATE_TOKENS  # the server's count, not ours
        assert r.ttft_s >= 0.025  # the role chunk came at once; the first token after ttft
    body = fake.stats()["bodies"][-1]
    assert body["messages"] == [{"role": "user", "content": token_ids_to_text(rs.measured[-1].prompt_token_ids)}]
    assert body["max_completion_tokens"] == 5 and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_events_split_across_reads(fake, api):
    """\\r\\n line ends, keep-alive comments and events cut across TCP writes."""
    recs = run_load_sync(endpoint(fake, api=api, fake_split=True, fake_ttft_ms=5, fake_itl_ms=2),
                         make_set(3, output_len=7), timeout_s=5)
    for r in recs:
        assert r.success, r.error
        assert len(r.token_times_s) == 7 == r.completion_tokens
        assert r.token_times_s == sorted(r.token_times_s)


def test_workload_end_to_end(fake):
    spec = WorkloadSpec(arrival={"kind": "poisson", "rate": 100}, num_requests=20, warmup_requests=2,
                        input_len={"kind": "uniform", "min": 4, "max": 30}, output_len={"kind": "uniform", "min": 1, "max": 6},
                        shared_prefix={"groups": 2, "length": 3})
    rs = build_requests(spec, 0, 1000)
    progress = []
    report = WarmupOutcome()
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=5, fake_itl_ms=1), rs, timeout_s=5,
                         on_progress=lambda done, total: progress.append((done, total)), warmup_report=report)
    # The burst (-2, -1), then the steady warm-up (-3, -4, ... in the order sent), then the measured ones.
    k = len(recs) - 22
    assert k > 0 and [r.index for r in recs] == [-2, -1] + [-3 - j for j in range(k)] + list(range(20))
    assert report.requests == k + 2 and report.converged and report.seconds >= spec.warmup.min_s
    assert progress == [(i, 20) for i in range(1, 21)]
    stream = tuple(itertools.islice(rs.warmup_stream, k))
    for r, req in zip(recs, rs.warmup + stream + rs.measured):
        assert r.success and r.completion_tokens == req.output_len == len(r.token_times_s)
        assert r.prefix_group == req.prefix_group
        assert r.scheduled_s == req.arrival_s if not r.warmup else r.scheduled_s < 0
    assert max(r.finished_s for r in recs if r.warmup) <= 0  # converged: drained before the window
    m = summarise(recs, requested_rate=100)
    assert m.num_requests == 20 and m.completed == 20
    assert m.total_output_tokens == sum(r.output_len for r in rs.measured)
    # Lag is measured, not bounded here: never negative (nothing sent early), and sends in due order.
    assert m.sched_lag_p50_ms >= 0 and all(r.sent_s >= r.scheduled_s for r in recs if not r.warmup)
    measured = [r for r in recs if not r.warmup]
    assert [r.index for r in sorted(measured, key=lambda r: r.sent_s)] == list(range(20))


# ================================================================ failures
@pytest.mark.parametrize("mode, kind, text", [
    ("http500", RequestErrorKind.HTTP_STATUS, "HTTP 500"),
    ("garbage", RequestErrorKind.BAD_RESPONSE, "payload"),
    ("json", RequestErrorKind.BAD_RESPONSE, "not an event stream"),
    ("stall", RequestErrorKind.TIMEOUT, "no end of stream within 0.5 s"),
    ("close", RequestErrorKind.CONNECTION, ""),
    ("nodone", RequestErrorKind.CONNECTION, "before [DONE]"),
    ("notokens", RequestErrorKind.BAD_RESPONSE, "without any token"),
    ("streamerror", RequestErrorKind.HTTP_STATUS, "engine died"),
    ("stallmid", RequestErrorKind.TIMEOUT, "2 token chunks received"),
    ("garbagemid", RequestErrorKind.BAD_RESPONSE, "payload"),
])
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_error_kinds(fake, mode, kind, text, api):
    req = make_set(1, output_len=5).measured[0]
    rec = asyncio.run(one_request(endpoint(fake, mode, api=api, fake_ttft_ms=5, fake_itl_ms=1), req, timeout_s=0.5))
    assert not rec.success
    assert rec.error_kind == kind, rec.error
    assert text in rec.error
    assert len(rec.error) <= 500 and API_KEY not in rec.error
    if mode == "stall":  # the client gave up at its timeout, on the record's own clock
        assert rec.finished_s - rec.sent_s >= 0.5
    if mode in ("close", "streamerror", "stallmid", "garbagemid"):  # tokens before the failure are kept
        assert len(rec.token_times_s) == 2 and rec.first_token_s is not None
    if mode == "http500":
        assert "***" in rec.error  # the echoed key was scrubbed


def test_missing_usage_falls_back_to_chunks(fake):
    req = make_set(1, output_len=4).measured[0]
    rec = asyncio.run(one_request(endpoint(fake, "nousage", fake_ttft_ms=1, fake_itl_ms=1), req))
    assert rec.success and rec.completion_tokens is None and rec.output_tokens == 4


def test_connection_refused():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    ep = Endpoint(f"http://127.0.0.1:{port}", "m", api_key=API_KEY)
    recs = run_load_sync(ep, make_set(3), timeout_s=2)
    assert [r.error_kind for r in recs] == [RequestErrorKind.CONNECTION] * 3
    assert all(r.sent_s is not None and r.first_token_s is None for r in recs)


def test_long_error_text_is_truncated(fake):
    ep = endpoint(fake, "http500", padding="x" * 5000)  # echoed into the error body
    req = make_set(1).measured[0]
    rec = asyncio.run(one_request(ep, req))
    assert rec.error_kind == RequestErrorKind.HTTP_STATUS
    assert len(rec.error) == 500 and rec.error.endswith("x") and API_KEY not in rec.error


# ================================================================ scheduling
def test_open_loop_a_stalled_request_does_not_delay_later_ones(fake):
    # Request 0 stalls until its timeout; 1..9 are due every 20 ms behind it.
    rs = make_set(10, rate=50, output_len=4, first_tokens={0: 1})
    recs = run_load_sync(endpoint(fake, "script", fake_ttft_ms=10, fake_itl_ms=2), rs, timeout_s=0.8)
    assert recs[0].error_kind == RequestErrorKind.TIMEOUT
    assert all(r.success for r in recs[1:])
    # Nobody waited for request 0: every later one was sent, and served, while it was stuck.
    stuck_until = recs[0].sent_s + 0.8
    assert all(r.sent_s < stuck_until and r.end_s < stuck_until for r in recs[1:]), \
        [(r.sent_s, r.end_s) for r in recs]
    assert all(r.finished_s < recs[0].finished_s for r in recs[1:])  # all done before request 0 gave up
    m = summarise(recs)
    assert m.failed_timeout == 1 and m.completed == 9


def test_max_concurrency_caps_in_flight(fake):
    rs = make_set(12, output_len=5)  # a burst: all due at 0
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=20, fake_itl_ms=3), rs, timeout_s=5, max_concurrency=3)
    assert all(r.success for r in recs)
    assert fake.stats()["peak"] == 3
    assert all(r.scheduled_s == 0.0 for r in recs)
    lags = sorted(r.sent_s - r.scheduled_s for r in recs)
    assert lags[3] >= 0.03  # the 4th waited for a slot: the first answer takes >= 20 + 4 * 3 ms
    assert lags[-1] >= 0.09  # four rounds of three
    assert summarise(recs).max_concurrency <= 3


def test_open_loop_burst_without_cap(fake):
    rs = make_set(40, output_len=3)
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=100, fake_itl_ms=1), rs, timeout_s=5)
    assert all(r.success for r in recs)
    assert fake.stats()["peak"] == 40  # nothing held them back (connector unlimited)


def test_closed_loop_concurrency(fake):
    rs = make_set(15, output_len=3, concurrency=4)
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=15, fake_itl_ms=2), rs, timeout_s=5)
    assert [r.index for r in recs] == list(range(15))
    assert all(r.success for r in recs)
    assert fake.stats()["peak"] == 4
    assert all(0 <= r.sent_s - r.scheduled_s < 0.5 for r in recs)  # sent when its worker was free
    assert max(r.scheduled_s for r in recs) > 0.03  # later requests waited for a free worker


def test_closed_loop_respects_max_concurrency(fake):
    rs = make_set(8, output_len=2, concurrency=6)
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=10, fake_itl_ms=1), rs, timeout_s=5, max_concurrency=2)
    assert all(r.success for r in recs) and fake.stats()["peak"] == 2


def test_moderate_load_keeps_up(fake):
    """300 req/s, 16 tokens each at 2 ms: ~4,800 chunks/s into the client.

    On an idle 2-core machine the lag is ~1 ms at p50 and a few ms at p99; the bounds are
    generous (a busy machine) and only catch a client that falls behind: the lag growing
    through the run reaches seconds by its end."""
    rs = make_set(300, rate=300, output_len=16)
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=10, fake_itl_ms=2), rs, timeout_s=10)
    assert all(r.success for r in recs)
    assert sum(len(r.token_times_s) for r in recs) == 300 * 16
    lags_ms = np.array([r.sent_s - r.scheduled_s for r in recs]) * 1000
    # Keeping up, by order and counts: every request sent in due order and never early, and the load
    # ran as an open loop: more requests were in flight at once than a client waiting on each would have.
    assert (lags_ms >= 0).all()
    assert [r.index for r in sorted(recs, key=lambda r: r.sent_s)] == sorted(r.index for r in recs)
    assert summarise(recs).max_concurrency > 1
    # A client falling behind has ever more requests due but not yet sent: count them at each send.
    due = np.sort([r.scheduled_s for r in recs])
    behind = [int(np.searchsorted(due, r.sent_s, side="right")) - 1 - rank
              for rank, r in enumerate(sorted(recs, key=lambda r: r.sent_s))]
    assert max(behind) < 150, max(behind)  # never half the load waiting to be sent


# ================================================================ readiness
def test_wait_ready_polls_until_200(fake):
    ep = Endpoint(fake.url("/slow"), "m", api_key=API_KEY)
    asyncio.run(wait_ready(ep, timeout_s=5, interval_s=0.02))
    assert fake.stats()["models_calls"] == 3


def test_wait_ready_times_out_with_last_error():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ep = Endpoint(f"http://127.0.0.1:{port}", "m", api_key=API_KEY)
    with pytest.raises(TimeoutError, match="not ready after 0.3 s; last error: .*Connect"):
        asyncio.run(wait_ready(ep, timeout_s=0.3, interval_s=0.05))


def test_endpoint_repr_hides_key():
    ep = Endpoint("http://h:1/x/", "m", api_key=API_KEY)
    assert API_KEY not in repr(ep)
    assert ep.url == "http://h:1/x/v1/completions"
    assert Endpoint("http://h:1", "m", api="chat").url == "http://h:1/v1/chat/completions"
    with pytest.raises(ValueError):
        Endpoint("http://h:1", "m", api="embeddings")

