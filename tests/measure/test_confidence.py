"""How sure one window's measurement is (orchestrator.measure.confidence), on windows the simulator measured."""

from __future__ import annotations

import math

import pytest

from orchestrator.hardware.engine_args import engine_args_from_params
from orchestrator.measure.confidence import INTERVAL_METRICS, metric_intervals, t_of, z_of
from orchestrator.measure.metrics import summarise
from orchestrator.search.trial_plan import engine_for, load_plan
from orchestrator.study.spec import parse_study
from support.studies import sim_doc

METRICS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "e2el_p99_ms", "itl_p50_ms", "output_throughput",
           "request_throughput", "goodput")


def window(seconds: float, seed: int = 0, rate: float = 10.0, replicate_as: int = 0):
    study = parse_study(sim_doc(
        name="ci", seed=seed, hardware={"gpu": "A100-80GB"},
        workload={"arrival": {"kind": "poisson", "rate": rate}, "num_requests": int(rate * seconds),
                  "input_len": {"kind": "lognormal", "mean": 512, "sigma": 0.5, "max": 2048},
                  "output_len": {"kind": "uniform", "min": 64, "max": 192}},
        space={"max_num_seqs": 256}, objectives=["minimize ttft_p99_ms"]))
    engine = engine_for(study)
    records = engine.measure(engine.resolve(engine_args_from_params({"max_num_seqs": 256})), load_plan(study).requests()).records
    for r in records:
        r.window = replicate_as
    return [r for r in records if not r.warmup]


def test_every_interval_holds_its_value_and_more_requests_narrow_it():
    width = {12: {}, 48: {}}
    for seconds in width:
        for seed in range(4):
            recs = window(seconds, seed=seed, rate=5)
            m = summarise(recs).as_dict()
            iv = metric_intervals(recs, METRICS)
            assert set(iv) == set(METRICS)
            for name, band in iv.items():
                assert band.low <= m[name] <= band.high, (name, band, m[name])
                width[seconds][name] = width[seconds].get(name, 0.0) + (band.high - band.low) / m[name] / 4
    for name in ("ttft_p50_ms", "tpot_p50_ms", "output_throughput"):
        assert width[48][name] < width[12][name], (name, width[48][name], width[12][name])
    # The load sets how many requests arrive: with every one served, the request rate is no draw.
    assert width[12]["request_throughput"] == 0.0
    short = window(12)
    assert metric_intervals(short, METRICS, seed=3) != metric_intervals(short, METRICS, seed=4)
    assert metric_intervals(short, METRICS) == metric_intervals(short, METRICS)  # seeded: the same records, the same


def test_two_windows_of_one_level_pool_into_a_narrower_interval():
    first, again = window(12, seed=1), window(12, seed=2, replicate_as=1)
    both = metric_intervals(first + again, ["ttft_p50_ms", "tpot_p50_ms"])
    alone = metric_intervals(first, ["ttft_p50_ms", "tpot_p50_ms"])
    for name in both:
        assert both[name].high - both[name].low < alone[name].high - alone[name].low


def test_only_metrics_with_an_interval_method_get_one():
    recs = window(6)
    assert set(metric_intervals(recs, ["kv_cache_usage_peak", "ttft_p99_ms", "capacity_rps"])) == {"ttft_p99_ms"}
    assert "capacity_rps" in INTERVAL_METRICS and metric_intervals([], ["ttft_p99_ms"]) == {}


@pytest.mark.parametrize("confidence, dof, expected", [
    (0.90, 1, 6.314), (0.90, 2, 2.920), (0.90, 4, 2.132), (0.95, 3, 3.182), (0.95, 10, 2.228), (0.90, 30, 1.697)])
def test_student_t_quantiles(confidence, dof, expected):
    assert t_of(confidence, dof) == pytest.approx(expected, rel=0.01)
    assert t_of(confidence, 1e7) == pytest.approx(z_of(confidence))


def test_window_noise_widens_the_metrics_it_names_in_quadrature_and_less_when_windows_are_pooled():
    from orchestrator.measure.engine_noise import WindowNoise

    first, again = window(12, seed=1), window(12, seed=2, replicate_as=1)
    noise = WindowNoise.of({"ttft_p99_ms": 0.3})
    names = ["ttft_p99_ms", "tpot_p50_ms"]
    for recs, windows in ((first, 1), (first + again, 2)):
        bare = metric_intervals(recs, names)
        noisy = metric_intervals(recs, names, window_noise=noise)
        assert noisy["tpot_p50_ms"] == bare["tpot_p50_ms"]  # not named: as drawn
        value = summarise(recs).as_dict()["ttft_p99_ms"]
        half = z_of(0.9) * 0.3 / math.sqrt(windows)
        for side, (b, n) in {"below": (value / bare["ttft_p99_ms"].low, value / noisy["ttft_p99_ms"].low),
                             "above": (bare["ttft_p99_ms"].high / value, noisy["ttft_p99_ms"].high / value)}.items():
            assert math.log(n) == pytest.approx(math.hypot(math.log(b), half), rel=1e-9), side
