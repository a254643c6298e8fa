"""Load generator: text prompts, its own cost per token, and a monitor that stops a load window
(aborting what is in flight) — against the real local fake server of test_loadgen."""

from __future__ import annotations

import time

import pytest

from orchestrator.loadgen import run_load_sync
from orchestrator.measure.metrics import summarise
from orchestrator.measure.records import RequestErrorKind
from orchestrator.measure.saturation import SaturationDetector
from orchestrator.study.spec import SaturationSettings
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request
from support.fake_openai import API_KEY, endpoint, fake, make_set, server  # noqa: F401 - fixtures


def test_text_prompts_go_out_as_text(fake):
    reqs = RequestSet(warmup=(), measured=(
        Request(index=0, arrival_s=0, prompt_token_ids=(1, 2), output_len=3, prompt_text="hello there"),
        Request(index=1, arrival_s=0, prompt_token_ids=(5, 6, 7), output_len=3)))
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=1, fake_itl_ms=1), reqs, timeout_s=5)
    assert all(r.success for r in recs)
    prompts = sorted((b["prompt"] for b in fake.stats()["bodies"]), key=str)
    assert prompts == [[5, 6, 7], "hello there"]
    fake.reset()
    run_load_sync(endpoint(fake, api="chat", fake_ttft_ms=1, fake_itl_ms=1),
                  RequestSet(warmup=(), measured=(Request(index=0, arrival_s=0, prompt_token_ids=(1,),
                                                          output_len=2, prompt_text="t4 t5"),)), timeout_s=5)
    assert fake.stats()["bodies"][0]["messages"] == [{"role": "user", "content": "t4 t5"}]


def test_client_cost_per_token_is_measured(fake):
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=2, fake_itl_ms=1), make_set(20, rate=200, output_len=10),
                         timeout_s=5)
    assert all(r.client_s > 0 for r in recs)
    m = summarise(recs, max_sched_lag_ms=1e6)
    assert 0 < m.client_us_per_token < 5000  # microseconds per token on any machine, never milliseconds
    assert m.loadgen_overloaded == 0.0
    assert summarise(recs, max_sched_lag_ms=1e-9).loadgen_overloaded == 1.0


class StopAt:
    """A monitor that stops the load at ``t_stop`` and counts what it saw. ``block_s``: the first
    finish after ``t_stop - 0.1`` holds the event loop that long, as a busy machine does."""

    def __init__(self, t_stop: float, block_s: float = 0.0):
        self.t_stop, self.block_s, self.sends, self.finishes = t_stop, block_s, 0, 0
        self.stopped_at = None  # the clock when it first said stop

    def on_send(self, t):
        self.sends += 1

    def on_finish(self, t, record):
        self.finishes += 1
        if self.block_s and t >= self.t_stop - 0.1:
            time.sleep(self.block_s)
            self.block_s = 0.0

    def should_stop(self, t):
        if t >= self.t_stop and self.stopped_at is None:
            self.stopped_at = t
        return t >= self.t_stop


@pytest.mark.parametrize("block_s", [0.0, 0.15])
@pytest.mark.parametrize("concurrency", [None, 4])
def test_a_monitor_stops_sending_and_aborts_what_is_in_flight(fake, concurrency, block_s):
    # 100 requests due over 2 s, each streaming for ~0.5 s; stop after 0.6 s.
    rs = make_set(100, rate=50, output_len=25, concurrency=concurrency)
    mon = StopAt(0.6, block_s)
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=10, fake_itl_ms=20), rs, timeout_s=10, monitor=mon,
                         check_interval_s=0.05)
    # Neither the remaining sends nor the in-flight streams were waited for: nothing was sent after
    # the monitor said stop, and every aborted stream was cut then, short of its 25 tokens.
    sent = [r for r in recs if r.sent_s is not None]
    assert mon.stopped_at is not None and sent and all(r.sent_s <= mon.stopped_at for r in sent)
    assert 0 < len(recs) < 100 and len(recs) == mon.sends  # requests not yet due get no record
    # Dispatched, but the stop came before its task ran (a loop held past both the sender's and the
    # watcher's wake-up, as on a busy machine, or by block_s): aborted, never on the wire.
    assert all(r.error_kind == RequestErrorKind.ABORTED for r in recs if r.sent_s is None)
    aborted = [r for r in recs if r.error_kind == RequestErrorKind.ABORTED]
    done = [r for r in recs if r.success]
    assert aborted and len(done) + len(aborted) == len(recs) and mon.finishes == len(done)
    assert all(mon.stopped_at <= r.finished_s and len(r.token_times_s) < 25 for r in aborted), \
        [(mon.stopped_at, r.sent_s, r.finished_s, len(r.token_times_s)) for r in aborted]
    assert all(r.token_times_s for r in aborted if r.first_token_s is not None)  # partial streams kept
    assert summarise(recs).failed_aborted == len(aborted)


def test_saturation_detector_as_a_monitor_leaves_a_keeping_up_load_alone(fake):
    rs = make_set(60, rate=60, output_len=5)
    det = SaturationDetector(SaturationSettings(window_s=0.2, check_interval_s=0.05, min_growth=3))
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=5, fake_itl_ms=2), rs, timeout_s=5, monitor=det,
                         check_interval_s=0.05)
    assert len(recs) == 60 and all(r.success for r in recs) and det.saturated_at is None


def test_saturation_detector_leaves_a_slow_but_parallel_server_alone(fake):
    # Every response takes 0.6 s, all in parallel: a backlog of ~24 that does not grow.
    rs = make_set(100, rate=40, output_len=2)
    det = SaturationDetector(SaturationSettings(window_s=0.5, check_interval_s=0.1, min_growth=5))
    recs = run_load_sync(endpoint(fake, fake_ttft_ms=600, fake_itl_ms=1), rs, timeout_s=30, monitor=det,
                         check_interval_s=0.1)
    assert det.saturated_at is None and len(recs) == 100 and all(r.success for r in recs)


def test_saturation_detector_stops_a_server_that_falls_behind(fake):
    # One request at a time, 40 ms each (capacity 25/s), offered 60/s for 5 s: the backlog grows ~35/s.
    rs = make_set(300, rate=60, output_len=2)
    det = SaturationDetector(SaturationSettings(window_s=0.5, check_interval_s=0.1, min_growth=5))
    recs = run_load_sync(endpoint(fake, "serial", fake_ttft_ms=30, fake_itl_ms=10), rs, timeout_s=30,
                         monitor=det, check_interval_s=0.1)
    # Unstopped, the sends alone take 5 s and draining the backlog 12 s more: stopped before the last
    # request was due, nothing sent after, and the backlog aborted rather than drained.
    assert det.saturated_at is not None and det.saturated_at < rs.measured[-1].arrival_s
    sent = [r for r in recs if r.sent_s is not None]
    assert len(recs) < 300 and all(r.sent_s <= det.saturated_at for r in sent)
    # Due but still waiting for a busy event loop when the stop came: aborted, never on the wire.
    assert all(r.error_kind == RequestErrorKind.ABORTED for r in recs if r.sent_s is None)
    assert any(r.error_kind == RequestErrorKind.ABORTED for r in recs)


def test_warmup_length_reaches_the_start_of_the_measured_window(fake):
    """A slow ``on_measure_start`` (the engine's /metrics snapshot on a busy machine) is part of the
    warm-up: its first send is at exactly ``-warmup_s_used`` on the measured clock."""
    import time as _time

    from orchestrator.loadgen import run_load_sync
    from orchestrator.measure.warmup import WarmupOutcome

    report = WarmupOutcome()
    recs = run_load_sync(endpoint(fake), make_set(4, warmup=2), timeout_s=5,
                         on_measure_start=lambda warm: _time.sleep(0.4), warmup_report=report)
    warm = [r for r in recs if r.warmup]
    assert len(warm) == 2 and report.seconds >= 0.4
    assert min(r.sent_s for r in warm) == pytest.approx(-report.seconds, abs=0.02)
