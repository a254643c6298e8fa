"""orchestrator.measure.metrics.summarise against records written by hand, with the arithmetic spelled out.

Percentiles are numpy's linear interpolation: for sorted values v[0..n-1], pN sits at
position (n - 1) * N / 100, between v[floor] and v[ceil].
"""

from __future__ import annotations

import pytest

from orchestrator.measure.metrics import RequestSLO, peak_concurrency, summarise
from orchestrator.measure.records import RequestErrorKind as K
from orchestrator.measure.records import RequestRecord


def ok(index, sent, tokens, *, completion=None, prompt=None, expected_prompt=0, lag=0.0, warmup=False):
    return RequestRecord(index=index, scheduled_s=sent - lag, sent_s=sent, first_token_s=tokens[0], end_s=tokens[-1],
                         token_times_s=list(tokens), completion_tokens=completion, prompt_tokens=prompt,
                         expected_prompt_tokens=expected_prompt, warmup=warmup)


def failed(index, sent, kind, tokens=(), lag=0.0):
    return RequestRecord(index=index, scheduled_s=sent - lag, sent_s=sent,
                         first_token_s=tokens[0] if tokens else None, end_s=tokens[-1] if tokens else None,
                         token_times_s=list(tokens), error=f"{kind.value} failure", error_kind=kind)


# R0: sent 0.00, tokens 0.10 0.15 0.20 0.30 -> ttft 100 ms, e2el 300, tpot (300-100)/3 = 66.67, itl 50 50 100
# R1: sent 0.05, tokens 0.25 0.30 0.35      -> ttft 200, e2el 300, tpot (300-200)/2 = 50, itl 50 50
# R2: sent 0.10, token  0.20                -> ttft 100, e2el 100, one token: no tpot, no itl
# R3: sent 0.20, tokens 0.60 0.70, no usage -> ttft 400, e2el 500, tpot 100, itl 100; 2 tokens from chunks
RECORDS = [
    ok(0, 0.00, [0.10, 0.15, 0.20, 0.30], completion=4, prompt=10),
    ok(1, 0.05, [0.25, 0.30, 0.35], completion=3, prompt=20, lag=0.01),
    ok(2, 0.10, [0.20], completion=1, prompt=5),
    ok(3, 0.20, [0.60, 0.70], expected_prompt=8, lag=0.02),  # no usage: expected prompt, chunk count
    failed(4, 0.30, K.TIMEOUT),
    failed(5, 0.35, K.HTTP_STATUS),
    failed(6, 0.40, K.CONNECTION, tokens=(0.50,)),  # streamed a token, then the connection broke
    failed(7, 0.45, K.BAD_RESPONSE),
    failed(8, 0.50, K.CLIENT, lag=0.03),
    # Warm-up: would change every number if it were counted.
    ok(-1, -1.0, [-0.9, 5.0], completion=2, prompt=1000, warmup=True),
]
DURATION = 0.70 - 0.00  # first send (R0) to the last end (R3); failed sends and ends count too


def test_counts_and_throughputs():
    m = summarise(RECORDS, gpus=2, requested_rate=12.0)
    assert m.num_requests == 9 and m.completed == 4 and m.failed == 5
    assert m.duration_s == pytest.approx(DURATION)
    assert m.total_input_tokens == 10 + 20 + 5 + 8
    assert m.total_output_tokens == 4 + 3 + 1 + 2
    assert m.request_throughput == pytest.approx(4 / 0.7)
    assert m.input_throughput == pytest.approx(43 / 0.7)
    assert m.output_throughput == pytest.approx(10 / 0.7)
    assert m.total_token_throughput == pytest.approx(53 / 0.7)
    assert m.output_throughput_per_gpu == pytest.approx(10 / 0.7 / 2)
    assert m.requested_rate == 12.0
    assert m.achieved_rate == pytest.approx((9 - 1) / (0.50 - 0.00))  # 9 sends over 0.5 s


def test_failures_by_kind():
    m = summarise(RECORDS)
    assert (m.failed_timeout, m.failed_http, m.failed_connection) == (1, 1, 1)
    assert m.failed_bad_response == 2  # BAD_RESPONSE and CLIENT together


def test_ttft():
    m = summarise(RECORDS)
    # sorted: 100 100 200 400
    assert m.ttft_mean_ms == pytest.approx((100 + 200 + 100 + 400) / 4)
    assert m.ttft_p50_ms == pytest.approx(100 + 0.5 * (200 - 100))  # position 1.5
    assert m.ttft_p90_ms == pytest.approx(200 + 0.7 * (400 - 200))  # position 2.7
    assert m.ttft_p95_ms == pytest.approx(200 + 0.85 * (400 - 200))  # position 2.85
    assert m.ttft_p99_ms == pytest.approx(200 + 0.97 * (400 - 200))  # position 2.97


def test_tpot():
    m = summarise(RECORDS)
    r0 = (300 - 100) / 3
    # sorted: 50, 66.67, 100 (R2 has one token: no TPOT)
    assert m.tpot_mean_ms == pytest.approx((r0 + 50 + 100) / 3)
    assert m.tpot_p50_ms == pytest.approx(r0)  # position 1
    assert m.tpot_p90_ms == pytest.approx(r0 + 0.8 * (100 - r0))  # position 1.8
    assert m.tpot_p99_ms == pytest.approx(r0 + 0.98 * (100 - r0))  # position 1.98


def test_itl_pooled_over_requests():
    m = summarise(RECORDS)
    # R0: 50 50 100; R1: 50 50; R3: 100 -> sorted 50 50 50 50 100 100
    assert m.itl_mean_ms == pytest.approx((50 * 4 + 100 * 2) / 6)
    assert m.itl_p50_ms == pytest.approx(50)  # position 2.5, between 50 and 50
    assert m.itl_p90_ms == pytest.approx(100)  # position 4.5, between 100 and 100
    assert m.itl_p99_ms == pytest.approx(100)


def test_e2el():
    m = summarise(RECORDS)
    # sorted: 100 300 300 500
    assert m.e2el_mean_ms == pytest.approx((300 + 300 + 100 + 500) / 4)
    assert m.e2el_p50_ms == pytest.approx(300)  # position 1.5
    assert m.e2el_p90_ms == pytest.approx(300 + 0.7 * (500 - 300))  # position 2.7
    assert m.e2el_p99_ms == pytest.approx(300 + 0.97 * (500 - 300))  # position 2.97


def test_goodput_and_slo_attainment():
    no_slo = summarise(RECORDS)
    assert no_slo.goodput == pytest.approx(4 / 0.7) and no_slo.slo_attainment == pytest.approx(4 / 9)

    # ttft <= 250 and tpot <= 80: R0 (100, 66.7) yes, R1 (200, 50) yes, R2 (100, one token: no tpot) yes,
    # R3 (ttft 400) no -> 3 good requests.
    m = summarise(RECORDS, slo=RequestSLO(ttft_ms=250, tpot_ms=80))
    assert m.goodput == pytest.approx(3 / 0.7)
    assert m.slo_attainment == pytest.approx(3 / 9)  # failed requests count against attainment
    # tpot <= 60 leaves R1 and R2 (R0 66.7 and R3 100 are over).
    assert summarise(RECORDS, slo=RequestSLO(tpot_ms=60)).goodput == pytest.approx(2 / 0.7)
    # e2el <= 250: only R2 (100).
    assert summarise(RECORDS, slo=RequestSLO(e2el_ms=250)).goodput == pytest.approx(1 / 0.7)
    # A limit equal to the value is met (<=): ttft <= 100 keeps R0 and R2.
    assert summarise(RECORDS, slo=RequestSLO(ttft_ms=100)).goodput == pytest.approx(2 / 0.7)
    # A strict limit (<) at the value is not met: ttft < 100 keeps none (R0 and R2 sit at 100).
    assert summarise(RECORDS, slo=RequestSLO(ttft_ms=100, strict=frozenset({"ttft"}))).goodput == 0.0


def test_a_one_token_request_has_no_tpot_and_a_tpot_limit_does_not_apply_to_it():
    # tpot <= 1 ms: R0 (66.7), R1 (50) and R3 (100) miss; R2, one token, has no TPOT: good.
    assert summarise(RECORDS, slo=RequestSLO(tpot_ms=1)).goodput == pytest.approx(1 / 0.7)
    assert summarise(RECORDS, slo=RequestSLO(tpot_ms=1, strict=frozenset({"tpot"}))).goodput == pytest.approx(1 / 0.7)
    # ...but it must still meet the other limits: ttft < 100 fails it.
    assert summarise(RECORDS, slo=RequestSLO(ttft_ms=100, tpot_ms=1, strict=frozenset({"ttft"}))).goodput == 0.0


def test_scheduling_lag():
    m = summarise(RECORDS)
    # lags (ms), measured only: 0 10 0 20 0 0 0 0 30 -> sorted 0 0 0 0 0 0 10 20 30
    assert m.sched_lag_p50_ms == pytest.approx(0)  # position 4
    assert m.sched_lag_p99_ms == pytest.approx(20 + 0.92 * 10)  # position 7.92
    assert m.sched_lag_max_ms == pytest.approx(30)


def test_peak_concurrency_is_over_half_open_intervals():
    # Successful requests: R0 [0, .3), R1 [.05, .3), R2 [.1, .2), R3 [.2, .7).
    # At 0.1: R0 R1 R2 = 3. At 0.2 R2 ends as R3 starts: still 3 (4 with closed intervals).
    assert summarise(RECORDS).max_concurrency == 3
    assert peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1
    assert peak_concurrency([(0, 1), (0.5, 1.5), (1, 2)]) == 2
    assert peak_concurrency([(0, 3), (1, 2), (1, 2), (2, 3)]) == 3
    assert peak_concurrency([]) == 0


def test_warmup_is_excluded():
    measured_only = summarise([r for r in RECORDS if not r.warmup])
    assert summarise(RECORDS) == measured_only


def test_nothing_to_summarise():
    m = summarise([])
    assert (m.num_requests, m.completed, m.failed, m.duration_s) == (0, 0, 0, 0.0)
    assert m.request_throughput == 0.0 and m.goodput == 0.0 and m.slo_attainment == 0.0
    assert m.ttft_mean_ms is None and m.itl_p99_ms is None and m.achieved_rate is None
    assert m.sched_lag_p50_ms is None and m.max_concurrency == 0


def test_all_failed():
    m = summarise([failed(0, 0.0, K.TIMEOUT), failed(1, 0.5, K.HTTP_STATUS)])
    assert m.completed == 0 and m.failed == 2 and m.duration_s == pytest.approx(0.5)
    assert m.output_throughput == 0.0 and m.ttft_p50_ms is None and m.tpot_mean_ms is None
    assert m.achieved_rate == pytest.approx(1 / 0.5)
