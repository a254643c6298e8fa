"""Warm up until steady: the judge on streams of known shape, and the trial in virtual time.

The served simulator runs the same judge in real time: tests/trial/test_warmup_served.py.
"""

from __future__ import annotations

import math

import pytest

from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.measure.warmup import SteadyJudge
from orchestrator.workload.spec import WarmupSpec


def play(settings: WarmupSpec, *, rate: float = 20.0, ttft=lambda t: 0.05, decode_s: float = 0.2,
         tokens: int = 10, service_s=None, fail: bool = False) -> tuple[str, float, int]:
    """Feed the judge a stream of requests sent every 1/rate s; check it as the load generator does.

    ``ttft(t)``: the TTFT of a request sent at t. ``service_s``: requests end one after another
    this far apart (a server that falls behind), instead of each after ttft + decode.
    Returns (why it ended, when, requests sent)."""
    judge = SteadyJudge(settings, start=0.0)
    events = []
    last_end = 0.0
    for i in range(int(rate * settings.max_s) + 1):
        sent = i / rate
        first = sent + ttft(sent)
        end = first + decode_s
        if service_s is not None:
            end = last_end = max(last_end, sent) + service_s
            first = end - decode_s / 2
        times = [first + k * (end - first) / (tokens - 1) for k in range(tokens)]
        rec = RequestRecord(index=-1 - i, scheduled_s=sent, sent_s=sent, warmup=True)
        if fail:
            rec.error, rec.error_kind, rec.finished_s = "HTTP 500", RequestErrorKind.HTTP_STATUS, sent + 0.01
            end = rec.finished_s
        else:
            rec.first_token_s, rec.end_s, rec.finished_s = first, end, end
            rec.token_times_s, rec.completion_tokens = times, tokens
        events += [(sent, 0, rec), (end, 1, rec)]
    events.sort(key=lambda e: (e[0], e[1]))
    t, k, sent_n = 0.0, 0, 0
    while True:
        t += judge.check_interval_s
        while k < len(events) and events[k][0] <= t:
            at, kind, rec = events[k]
            if kind == 0:
                judge.on_send(at, rec)
                sent_n += 1
            else:
                judge.on_finish(at, rec)
            k += 1
        reason = judge.check(t)
        if reason is not None:
            return reason, t, sent_n


@pytest.mark.parametrize("min_s, expected", [(0.0, 2.0), (3.0, 3.0), (5.5, 5.5)])
def test_a_steady_stream_converges_at_the_floor_or_after_two_windows(min_s, expected):
    reason, t, _ = play(WarmupSpec(min_s=min_s, window_s=1.0, max_s=10))
    assert reason == "converged" and expected <= t < expected + 0.26


def test_windows_stretch_at_low_rates():
    # 1 request/s: about four requests a window (sends so far / time so far), so windows of ~3.5 s.
    reason, t, _ = play(WarmupSpec(min_s=1, window_s=1.0, max_s=12), rate=1.0)
    assert reason == "converged" and 6.5 <= t < 8.6


def test_a_noisy_but_steady_stream_converges():
    # TTFT alternating between 30 and 90 ms: the medians of 20 requests agree within their noise.
    reason, t, _ = play(WarmupSpec(min_s=2, window_s=1.0, max_s=10, tolerance=0.1),
                        ttft=lambda s: 0.03 if int(s * 20) % 3 else 0.09)
    assert reason == "converged" and t < 3.0


def test_a_drifting_stream_does_not_converge_within_max_s():
    # TTFT growing 40% a second (an engine slowing down): successive windows never agree.
    settings = WarmupSpec(min_s=1, window_s=1.0, max_s=6, tolerance=0.2)
    reason, t, sent = play(settings, ttft=lambda s: 0.05 * 1.4 ** s)
    assert reason == "max_s" and t == pytest.approx(6.0, abs=0.01) and sent >= 6 * 20
    # A slower drift does converge: the tolerance is what "steady" means.
    assert play(settings, ttft=lambda s: 0.05 * 1.05 ** s)[0] == "converged"


def test_a_saturated_stream_ends_the_warmup_early():
    # Requests sent at 20/s, served at 10/s: the backlog grows every window.
    reason, t, _ = play(WarmupSpec(min_s=1, window_s=1.0, max_s=20), service_s=0.1)
    assert reason == "saturated" and t < 6


def test_a_failing_engine_ends_the_warmup_at_once():
    reason, t, _ = play(WarmupSpec(min_s=2, window_s=1.0, max_s=10), fail=True)
    assert reason == "failing" and t <= 0.5


def test_the_check_interval_and_the_window_follow_the_settings():
    judge = SteadyJudge(WarmupSpec(window_s=0.4, max_s=5), start=10.0)
    assert judge.check_interval_s == pytest.approx(0.1) and math.isinf(judge.window_s(10.5))
    assert judge.check(10.1) is None and judge.check(15.0) == "max_s"


# ---------------------------------------------------------------- a trial in virtual time
def virtual_study(study_doc, **workload):
    from orchestrator.study.spec import parse_study

    study_doc.update(engine={"kind": "sim", "mode": "virtual"}, space={"max_num_seqs": 32})
    study_doc["workload"] = {"arrival": {"kind": "poisson", "rate": 8}, "num_requests": 60, "warmup_requests": 2,
                             "input_len": {"kind": "uniform", "min": 100, "max": 600}, "output_len": 32,
                             "warmup": {"min_s": 3, "max_s": 20}, **workload}
    return parse_study(study_doc)


def run(study):
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    out = run_trial(study, {"max_num_seqs": 32}, trial_id="t", trial_number=0, ctx=TrialContext("r"))
    assert out.row["status"] == "completed", out.row.get("failure_message")
    return out


def test_virtual_trial_warms_up_until_steady_and_measures_after(study_doc):
    from orchestrator.measure.metrics import summarise

    study = virtual_study(study_doc)
    out = run(study)
    row, warm = out.row, [r for r in out.records if r.warmup]
    measured = [r for r in out.records if not r.warmup]
    assert row["warmup_converged"] == 1 and 3.0 <= row["warmup_s_used"] < 20
    assert row["warmup_requests_used"] == len(warm) > 2 + 3 * 8 * 0.5
    # The warm-up ran at the trial's rate (the burst of 2 aside) and ended before the window began.
    stream = sorted(r.sent_s for r in warm[2:])
    assert (len(stream) - 1) / (stream[-1] - stream[0]) == pytest.approx(8, rel=0.35)
    assert max(r.end_s for r in warm) <= 0 <= min(r.sent_s for r in measured)
    assert -row["warmup_s_used"] == pytest.approx(min(r.sent_s for r in warm))
    # Every metric is the measured requests' alone.
    assert row["num_requests"] == 60 == len(measured)
    assert row["ttft_p99_ms"] == summarise(measured).ttft_p99_ms
    assert out.records[:len(warm)] == warm  # warm-up first, in the order sent


def test_virtual_trial_without_the_steady_warmup_sends_the_burst_only(study_doc):
    out = run(virtual_study(study_doc, warmup={"enabled": False}))
    assert out.row["warmup_requests_used"] == 2 and out.row["warmup_converged"] is None
    assert sum(r.warmup for r in out.records) == 2 and out.row["warmup_s_used"] > 0


def test_virtual_trial_that_overloads_the_engine_does_not_converge(study_doc):
    out = run(virtual_study(study_doc, arrival={"kind": "poisson", "rate": 400},
                            warmup={"min_s": 1, "max_s": 4}))
    assert out.row["warmup_converged"] == 0 and out.row["warmup_requests_used"] > 400


def test_a_virtual_warmup_whose_gaps_collapse_to_zero_still_ends(study_doc):
    """Gamma gaps of shape 1e-12 are all 0.0 s (``validate`` refuses such a study): the steady
    warm-up used to send requests at one virtual instant for ever. It sends at most a bounded
    number, and the trial is measured."""
    import dataclasses

    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.search.trial_plan import engine_for, load_plan
    from orchestrator.sim.virtual import STEADY_FLOOR
    from orchestrator.workload.spec import GammaArrival

    study = virtual_study(study_doc)
    rs = load_plan(study).requests()
    collapsed = GammaArrival.model_construct(kind="gamma", rate=8.0, burstiness=1e-12)
    rs = dataclasses.replace(rs, warmup_stream=dataclasses.replace(rs.warmup_stream, arrival=collapsed))
    engine = engine_for(study)
    got = engine.measure(engine.resolve(engine_args_from_params({"max_num_seqs": 32})), rs)
    records = got.records
    steady = got.warmup.requests - study.workload.warmup_requests
    assert 0 < steady <= max(STEADY_FLOOR, 4 * 8 * study.workload.warmup.max_s)
    assert sum(not r.warmup and r.success for r in records) == study.workload.num_requests
