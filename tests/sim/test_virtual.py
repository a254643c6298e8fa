"""Virtual-time simulation: records, arrivals, closed loop, warm-up, determinism, and the H200 calibration."""

from __future__ import annotations

import math

import pytest
from sim_reference import OFFLINE, ONLINE, WARM_RUNS, engine, run_offline, run_online, run_warm, warm_point, workload

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.core import SimEngineCore, SimRequest
from orchestrator.sim.virtual import simulate
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request


def small_core(**kw) -> SimEngineCore:
    gpu = get_gpu("H100-80GB")
    args = EngineArgs(max_model_len=2048, **kw).resolved(device_memory_gib=gpu.memory_gib, device_name=gpu.name)
    return SimEngineCore(ModelShape.load("llama-3.1-8b"), gpu, args)


def test_records_are_what_an_ideal_client_sees():
    recs = simulate(small_core(), workload(40, rate=20, prompt_len=100, output_len=12))
    assert len(recs) == 40 and [r.index for r in recs] == list(range(40))
    for r in recs:
        assert r.success and not r.warmup
        assert r.sent_s == r.scheduled_s
        assert r.sent_s < r.first_token_s <= r.end_s
        assert r.token_times_s[0] == r.first_token_s and r.token_times_s[-1] == r.end_s
        assert r.token_times_s == sorted(r.token_times_s)
        assert r.completion_tokens == r.expected_output_tokens == 12 == len(r.token_times_s)
        assert r.prompt_tokens == r.expected_prompt_tokens == 100
        assert r.tpot_s > 0


def test_simulation_is_deterministic():
    def run():
        return [(r.first_token_s, r.end_s, tuple(r.token_times_s))
                for r in simulate(small_core(), workload(60, rate=30, prompt_len=300, output_len=20))]

    assert run() == run()


def test_core_step_contract():
    core = small_core()
    core.add_request(SimRequest("a", list(range(40)), 3))
    assert core.has_work()
    first = core.step()
    assert first.duration_s > 0 and first.num_scheduled_tokens == 40
    assert [(o.request_id, o.new_tokens, o.finished, o.num_prompt_tokens) for o in first.outputs] == [("a", 1, False, 40)]
    tokens = 1
    while core.has_work():
        res = core.step()
        tokens += sum(o.new_tokens for o in res.outputs)
    assert tokens == 3 and res.outputs[-1].finished
    s = core.stats()
    assert s.generation_tokens_total == 3 and s.prompt_tokens_total == 40 and s.steps_total == 3
    assert s.num_requests_running == 0 and s.kv_cache_usage == 0.0 and s.busy_time_s > 0


def test_too_long_request_is_rejected_like_vllm():
    core = small_core()
    with pytest.raises(ValueError, match="This model's maximum context length is 2048 tokens. However, you "
                                         "requested 2100 tokens"):
        core.add_request(SimRequest("x", [1] * 2000, 100))
    rs = RequestSet(warmup=(), measured=(Request(0, 0.0, (1,) * 2000, 100), Request(1, 0.0, (1,) * 10, 5)))
    bad, good = simulate(core, rs)
    assert not bad.success and "maximum context length" in bad.error
    assert good.success and good.completion_tokens == 5


def test_abort_frees_the_request():
    core = small_core()
    core.add_request(SimRequest("a", list(range(100)), 50))
    core.step()
    assert core.abort_request("a") and not core.abort_request("a")
    while core.has_work():
        assert all(o.request_id != "a" for o in core.step().outputs)
    assert core.stats().kv_cache_usage == 0.0


def test_warmup_runs_first_one_at_a_time():
    warm = tuple(Request(i, 0.0, tuple(range(50 + i, 150 + i)), 8, warmup=True) for i in range(3))
    measured = workload(10, rate=10, prompt_len=100, output_len=8).measured
    recs = simulate(small_core(), RequestSet(warmup=warm, measured=measured))
    w, m = recs[:3], recs[3:]
    assert all(r.warmup for r in w) and not any(r.warmup for r in m)
    assert all(r.end_s <= 0 for r in w) and w[-1].end_s == pytest.approx(0.0, abs=1e-12)
    for a, b in zip(w, w[1:]):
        assert b.sent_s >= a.end_s  # sequential
    assert all(r.sent_s >= 0 for r in m)


def test_closed_loop_keeps_concurrency():
    reqs = tuple(Request(i, 0.0, tuple(range(i, i + 200)), 16) for i in range(30))
    recs = simulate(small_core(), RequestSet(warmup=(), measured=reqs, closed_loop_concurrency=4))
    assert all(r.success for r in recs)
    events = sorted([(r.sent_s, 1) for r in recs] + [(r.end_s, -1) for r in recs], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak == 4
    assert sum(1 for r in recs if r.sent_s == 0.0) == 4


def test_shared_prefix_hits_show_in_stats():
    prefix = tuple(range(1000, 1512))
    reqs = tuple(Request(i, i * 0.5, prefix + tuple(range(5000 + 64 * i, 5064 + 64 * i)), 4, prefix_group=0)
                 for i in range(6))
    core = small_core()
    recs = simulate(core, RequestSet(warmup=(), measured=reqs))
    s = core.stats()
    assert s.prefix_cache_hits_total == 5 * 512 and s.prefix_cache_queries_total == 6 * 576
    assert s.prompt_tokens_computed_total == 576 + 5 * 64
    assert all(r.prefix_group == 0 for r in recs)
    # Cached prompts reach their first token sooner.
    assert recs[1].ttft_s < recs[0].ttft_s


def test_preemption_under_kv_pressure_completes_everything():
    core = small_core(extra={"num_gpu_blocks_override": 80})  # 79 usable blocks = 1264 tokens
    reqs = tuple(Request(i, 0.0, tuple(range(i * 1000, i * 1000 + 200)), 300) for i in range(8))
    recs = simulate(core, RequestSet(warmup=(), measured=reqs))
    assert core.stats().num_preemptions_total > 0
    assert all(r.success and r.completion_tokens == 300 == len(r.token_times_s) for r in recs)


# ---------------------------------------------------------------- H200 calibration
# Reference: vLLM 0.26 on one H200 (docs/simulator.md). Loose bounds: throughput
# 15%, TPOT p50 25%; TTFT p50 only within 35% where no queue forms or the queue dominates
# (near saturation it swings with the arrival seed), else a factor of 2.5.
TTFT_TIGHT = {(16, 256, 320), (64, 16, 640)}


@pytest.mark.parametrize("case", list(ONLINE), ids=lambda c: f"rate{c[0]}-S{c[1]}")
def test_online_calibration(case):
    ttft, tpot, tok = ONLINE[case]
    r = run_online(*case)
    assert r["output_tok_s"] == pytest.approx(tok, rel=0.15)
    assert r["tpot_p50_ms"] == pytest.approx(tpot, rel=0.25)
    if case in TTFT_TIGHT:
        assert r["ttft_p50_ms"] == pytest.approx(ttft, rel=0.35)
    else:
        assert abs(math.log(r["ttft_p50_ms"] / ttft)) < math.log(2.5)


@pytest.mark.parametrize("seqs", list(OFFLINE))
def test_offline_calibration(seqs):
    assert run_offline(seqs)["output_tok_s"] == pytest.approx(OFFLINE[seqs], rel=0.15)


@pytest.mark.parametrize("name", WARM_RUNS)
def test_warm_calibration(name):
    # Warm engine, fresh prompts (results/examples/h200-ingress): the acceptance bounds,
    # 10% on request throughput and TTFT p50. TPOT p50 is looser: at rate inf the simulated
    # requests of the first 256 all see the same ~15 prefill steps (TPOT p50 +13%) where the
    # real ones spread (their p90 / p99 match, and the mean is within 5%).
    real, _ = warm_point(name)
    sim = run_warm(name)
    assert sim["req_s"] == pytest.approx(real["request_throughput"], rel=0.10)
    assert sim["ttft_p50_ms"] == pytest.approx(real["median_ttft_ms"], rel=0.10)
    assert sim["tpot_p50_ms"] == pytest.approx(real["median_tpot_ms"], rel=0.15)
    assert sim["tpot_mean_ms"] == pytest.approx(real["mean_tpot_ms"], rel=0.10)


def test_saturation_with_16_sequences():
    # At 64 req/s, 16 sequences cap the server near 18 req/s.
    assert run_online(64, 16, 640)["req_s"] == pytest.approx(18.4, rel=0.15)
    assert engine(16).memory.kv_tokens > 800_000


def test_capacity_study_levels(repo):
    # docs/simulator.md, "Against the H200 capacity study": every completed level of the capacity
    # reference and study replayed with its own requests (aborted levels left out). Request
    # throughput within 10% on every scored level but the two enforce_eager + FP8 KV levels the
    # doc explains; TTFT p50 a regression guard on the doc's table (median |err| 16%, max 45% over
    # these levels: run-to-run noise near the knee alone is 15-25%).
    import numpy as np

    from orchestrator.apps.measured_replay import load_points, run

    datasets = [("study", str(repo / "results/examples/llama3-8b-h200-reference")),
                ("study", str(repo / "results/examples/llama3-8b-h200"))]
    points = run(load_points(datasets))
    assert sum(1 for p in points if p.mark == "aborted") == 11
    misses = {p.label for p in points if p.scored("req_s") and abs(p.err("req_s")) > 0.10}
    assert misses == {"S=40 B=8192 kv=fp8 eager nochunk, 11.9 req/s", "S=451 B=4096 kv=fp8 eager, 40.0 req/s"}
    ttft = [abs(p.err("ttft_p50_ms")) for p in points if p.scored("ttft_p50_ms")]
    assert len(ttft) == 27 and float(np.median(ttft)) < 0.2 and max(ttft) < 0.5
