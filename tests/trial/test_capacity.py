"""Capacity search: saturation detection, level verdicts, the rate proposer, agreement with a
dense sweep (virtual sim), the levels table, and study validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from orchestrator.measure.metrics import summarise
from orchestrator.measure.records import RequestRecord
from orchestrator.measure.saturation import SaturationDetector, detect_saturation
from orchestrator.study.spec import CapacitySpec, Constraint, SaturationSettings, StudyFileError, parse_study
from orchestrator.trial.capacity import (LevelPoint, RateGrid, capacity_index, draw_level, judge_level, level_workload,
                                         next_rate)
from orchestrator.trial.capacity_fit import LevelMargins, fit_capacity, isotonic
from orchestrator.trial.load_phase import NEAR_LIMIT
from support.capacity_levels import contradicting, contradictions, level_bracket
from support.studies import sim_doc


# ---------------------------------------------------------------- saturation
def queue_records(rate: float, service_s: float, servers: int, n: int, seed: int = 0) -> list[RequestRecord]:
    """Poisson arrivals into a FIFO queue with ``servers`` parallel servers of fixed service time."""
    t = np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))
    free = [0.0] * servers
    out = []
    for i, a in enumerate(t):
        k = int(np.argmin(free))
        start = max(a, free[k])
        free[k] = start + service_s
        out.append(RequestRecord(index=i, scheduled_s=a, sent_s=a, first_token_s=start + service_s / 2,
                                 end_s=free[k], finished_s=free[k], token_times_s=[start + service_s / 2, free[k]],
                                 completion_tokens=2))
    return out


S = SaturationSettings(window_s=5.0)


@pytest.mark.parametrize("seed", range(5))
def test_a_stable_queue_near_capacity_is_not_saturated(seed):
    # 85% utilisation: long queues come and go, but the backlog does not grow without bound.
    assert detect_saturation(queue_records(17, 0.1, 2, 1500, seed), S) is None


@pytest.mark.parametrize("rate", [15, 30])
def test_an_overloaded_queue_is_flagged_within_a_few_windows(rate):
    recs = queue_records(rate, 0.1, 1, 60 * rate)  # capacity 10/s, 60 s of arrivals
    at = detect_saturation(recs, S)
    assert at is not None and at < 30


@pytest.mark.parametrize("seed", range(3))
def test_an_overloaded_short_level_is_flagged_before_its_sends_end(seed):
    # 3 s of 40 req/s into 4 slots of 0.6 s (capacity 6.7/s). Of the first ten requests to finish,
    # six had queued: their median latency (~1 s) made the window too long to ever fit in the level.
    recs = queue_records(40, 0.6, 4, 120, seed)
    at = detect_saturation(recs, SaturationSettings(window_s=0.5, check_interval_s=0.1, min_growth=4))
    last_send = max(r.sent_s for r in recs)
    assert at is not None and at <= last_send + 0.2, (at, last_send)


def test_detector_judges_nothing_before_a_request_finished():
    det = SaturationDetector(S)
    for i in range(200):
        det.on_send(i * 0.01)
    assert not det.should_stop(100.0)  # all in flight, none finished: could be slow, not saturated


# ---------------------------------------------------------------- verdicts and the proposer
def metrics(ttft_ms: float, failed: int = 0):
    ok = [RequestRecord(index=i, scheduled_s=i, sent_s=i, first_token_s=i + ttft_ms / 1000, end_s=i + 1,
                        token_times_s=[i + ttft_ms / 1000, i + 1], completion_tokens=2) for i in range(10)]
    bad = [RequestRecord(index=10 + i, scheduled_s=i, sent_s=i, error="x") for i in range(failed)]
    return summarise(ok + bad)


def test_judge_level():
    slo = [Constraint.model_validate("ttft_p99_ms <= 200")]
    good = judge_level(metrics(100), slo)
    assert good.ok and good.violation == pytest.approx(-0.5)
    bad = judge_level(metrics(300), slo)
    assert not bad.ok and bad.violation == pytest.approx(0.5) and "ttft_p99_ms <= 200" in bad.reasons[0]
    assert not judge_level(metrics(100, failed=1), slo).ok
    assert judge_level(metrics(100, failed=1), slo, max_error_rate=0.1).ok
    sat = judge_level(metrics(100), slo, saturated=True)
    assert not sat.ok and "saturated" in sat.reasons[0]


@pytest.mark.parametrize("limit, allowed", [(1 / 11, True), (1 / 11 - 1e-9, False), (0.0, False)])
def test_a_level_and_a_trial_read_the_error_rate_by_one_rule(limit, allowed):
    """1 of 11 requests failed: allowed at a limit of exactly 1/11, not below it, for a capacity
    level and for a trial (degraded) alike."""
    from orchestrator.failures import request_failures

    m = metrics(100, failed=1)
    assert judge_level(m, [], max_error_rate=limit).ok is allowed
    assert (request_failures(m, limit) is None) is allowed


def test_a_level_is_decided_only_when_every_interval_is_on_one_side_of_its_limit():
    from orchestrator.measure.confidence import Interval

    slo = [Constraint.model_validate("ttft_p99_ms <= 200"), Constraint.model_validate("output_throughput >= 1")]
    m = metrics(150)  # ttft p99 150 ms, met by its value
    sure = judge_level(m, slo, intervals={"ttft_p99_ms": Interval(120, 180)})
    assert sure.ok and sure.decided and sure.outcome == "met"
    maybe = judge_level(m, slo, intervals={"ttft_p99_ms": Interval(110, 240)})
    assert maybe.ok and not maybe.decided and maybe.outcome == "undecided"
    assert maybe.margin == pytest.approx(math.log(150 / 200)) and maybe.margin_sd > 0
    worse = metrics(300)
    assert judge_level(worse, slo, intervals={"ttft_p99_ms": Interval(250, 400)}).outcome == "missed"
    assert judge_level(worse, slo, intervals={"ttft_p99_ms": Interval(150, 400)}).outcome == "undecided"
    # Unbounded above: never sure to meet an upper limit; a lower limit is not surely missed.
    assert judge_level(m, slo, intervals={"ttft_p99_ms": Interval(120, None)}).outcome == "undecided"
    assert judge_level(m, slo, intervals={"output_throughput": Interval(0.5, None)}).outcome == "undecided"
    # Saturation and failed requests decide a miss whatever the intervals say.
    assert judge_level(m, slo, saturated=True, intervals={"ttft_p99_ms": Interval(1, 1e6)}).outcome == "missed"
    assert judge_level(metrics(150, failed=2), slo, intervals={"ttft_p99_ms": Interval(1, 1e6)}).outcome == "missed"


def margins(rate: float, boundary: float, noise: float = 0.0, samples: int = 200, seed: int = 0,
            slope: float = 2.0) -> LevelMargins:
    """A level of a system whose log SLO margin grows ``slope`` per unit of log rate and crosses zero at
    ``boundary``; its bootstrap draws spread ``noise`` around the value."""
    m = slope * math.log(rate / boundary)
    rng = np.random.default_rng(seed + int(rate * 1000))
    draws = m + rng.normal(0, noise, samples) if noise else np.full(samples, m)
    return LevelMargins(rate, {"ttft_p99_ms": m}, {"ttft_p99_ms": draws})


def test_the_fit_crosses_where_the_margin_does_and_its_interval_comes_from_the_draws():
    levels = [margins(r, 20.0, noise=0.05) for r in (12, 16, 19, 21, 24, 30)]
    fit = fit_capacity(levels, confidence=0.9, samples=200)
    assert fit.estimate == pytest.approx(20.0, rel=1e-6) and fit.binding == "ttft_p99_ms"
    assert fit.low < 20 < fit.high and (fit.high - fit.low) / 20 < 0.1
    assert fit.conditioned and fit.contradictions == 0
    noisier = fit_capacity([margins(r, 20.0, noise=0.3) for r in (12, 16, 19, 21, 24, 30)], confidence=0.9,
                           samples=200)
    assert noisier.high - noisier.low > 2 * (fit.high - fit.low)
    # A margin that hardly grows with the rate near its limit: ill-conditioned, and said so.
    flat = fit_capacity([margins(r, 20.0, noise=0.05, slope=0.2) for r in (12, 16, 19, 21, 24, 30)],
                        confidence=0.9, samples=200)
    assert flat.conditioned is False and flat.condition > 0.15 and flat.slope == pytest.approx(0.2, rel=0.01)
    # Every level missed, the margin flat at its limit (vLLM's defaults' ITL p99 on an H100): the capacity
    # lies below the lowest level, and the fit says how little that pins down.
    below = fit_capacity([margins(r, 15.0, noise=0.05, slope=0.2) for r in (19.2, 24, 30, 37.5)], confidence=0.9,
                         samples=200)
    assert below.estimate == 0 and below.low == 0 and below.high >= 19.2 and below.conditioned is False
    # Every level met: the capacity is at least the highest rate, unbounded above.
    above = fit_capacity([margins(r, 100.0) for r in (10, 20)], confidence=0.9, samples=200)
    assert above.estimate == 20 and above.high is None and above.conditioned is None


def test_contradictory_levels_are_counted_and_the_estimate_follows_every_level_not_the_bracket():
    """Planted: missed at 54 req/s, met at 60 and 67.5 (by their values), missed at 75. The decided
    levels would bound the capacity below 54; the fit pools 54 with the levels above it and crosses
    above it."""
    def level(rate, m, met):
        return LevelMargins(rate, {"ttft_p99_ms": m}, {"ttft_p99_ms": np.full(100, m)}, met=met)

    levels = [level(40, -0.6, True), level(54, 0.03, False), level(60, -0.05, True), level(67.5, -0.04, True),
              level(75, 0.4, False)]
    fit = fit_capacity(levels, confidence=0.9, samples=100)
    assert fit.contradictions == 2 and fit.contradicting == (1, 2, 3)
    assert 54 < fit.estimate < 75, fit  # above the level that missed: the data, not a clamp


def test_isotonic_fit_is_the_pool_adjacent_violators_answer():
    y = np.array([[0.1, -0.2, 0.3, 0.2, 0.5]])
    w = np.array([1.0, 1.0, 1.0, 3.0, 1.0])
    assert isotonic(y, w)[0] == pytest.approx([-0.05, -0.05, 0.225, 0.225, 0.5])


def test_the_rate_grid_is_shared_and_growth_is_a_whole_number_of_steps():
    grid = RateGrid.of(SPEC, 8.0)
    assert grid.rate(grid.index(16.0)) == pytest.approx(16.0) and grid.step < 1 + SPEC.tolerance
    assert {draw_level(k) for k in range(-5, 6)} == set(range(11)) and draw_level(0) == 0
    # An interval that reaches below every level measured (0) or above them (inf) snaps to the grid's ends.
    assert grid.snap(0.0) == grid.lowest and grid.snap(math.inf) == grid.highest


SPEC = CapacitySpec(min_rate=1, max_rate=100, growth=2, tolerance=0.05, max_levels=12)


def run(boundary: float, spec=SPEC, start: float = 8.0):
    """Drive the proposer against a system whose SLO margin is linear in the log rate, as a trial
    does: the fit of the levels so far steers it."""
    points: list[LevelPoint] = []
    levels: list[LevelMargins] = []
    while True:
        fit = fit_capacity(levels, confidence=0.9, samples=50, resolution=spec.tolerance) if levels else None
        rate, why = next_rate(points, spec, start, fit)
        if rate is None:
            return points, why, fit
        m = margins(rate, boundary, samples=50)
        levels.append(m)
        points.append(LevelPoint(rate, m.margins["ttft_p99_ms"] <= 0, m.margins["ttft_p99_ms"]))


@pytest.mark.parametrize("boundary", [1.7, 9.3, 31.0, 77.7])
def test_proposer_brackets_the_boundary_within_tolerance(boundary):
    points, why, fit = run(boundary)
    assert fit.estimate == pytest.approx(boundary, rel=SPEC.tolerance)
    best = points[capacity_index(points, fit.estimate)]
    assert best.ok and boundary * (1 - SPEC.tolerance) <= best.rate <= boundary
    assert why.startswith("bracketed") and len(points) <= 9


def test_proposer_stops_at_the_rate_limits():
    points, why, _ = run(500.0)
    assert why == "max_rate (100/s) met the SLOs" and max(p.rate for p in points) <= 100
    points, why, fit = run(0.5)
    assert why == "min_rate (1/s) failed the SLOs" and capacity_index(points, fit.estimate) is None
    few = SPEC.model_copy(update={"max_levels": 3})
    assert run(9.3, few)[1] == "max_levels (3) measured"


def test_proposer_splits_the_bracket_on_the_grid_without_a_fit():
    grid = RateGrid.of(SPEC, 8)
    pts = [LevelPoint(8, True, -0.2), LevelPoint(16, False, math.inf, saturated=True)]
    rate, _ = next_rate(pts, SPEC, 8)
    assert 8 < rate < 16 and rate == pytest.approx(grid.rate((grid.index(8) + grid.index(16)) // 2))


# ---------------------------------------------------------------- the search vs a dense sweep
def capacity_study(**capacity):
    return parse_study(sim_doc(
        name="cap", seed=0,
        workload={"arrival": {"kind": "poisson", "rate": 8}, "num_requests": 120, "warmup_requests": 1,
                  "input_len": {"kind": "uniform", "min": 200, "max": 1500},
                  "output_len": {"kind": "uniform", "min": 16, "max": 96}},
        space={"max_num_seqs": [8, 64]}, objectives=["maximize capacity_rps"],
        constraints=["ttft_p99_ms <= 300", "tpot_p50_ms <= 30"], capacity={"tolerance": 0.03, **capacity}))


def test_capacity_search_finds_the_dense_sweeps_boundary():
    """Same config, same level builder: a 2.5%-step sweep's boundary lies inside the search's
    interval, and its estimate within 10% of it, from fewer levels.

    (The sweep starts at 8 req/s to keep the test short; from 6 req/s, 38 levels, it finds the
    same boundary.)"""
    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.search.trial_plan import engine_for, load_plan
    from orchestrator.trial.load_phase import summarise_records as _summarise
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    study = capacity_study()
    out = run_trial(study, {"max_num_seqs": 8}, trial_id="t", trial_number=0, ctx=TrialContext("r"))
    found = out.row["capacity_rps"]

    engine = engine_for(study)
    args = engine.resolve(engine_args_from_params({"max_num_seqs": 8}))
    sweep = []
    for rate in 8 * 1.025 ** np.arange(23):  # 8 .. 13.8 req/s
        plan = load_plan(study)
        rs = plan.requests(level_workload(study.workload, rate, study.capacity, 8.0))
        recs = engine.measure(args, rs).records
        m = _summarise(plan, recs, rate)
        sat = detect_saturation(recs, study.capacity.saturation) is not None
        sweep.append(LevelPoint(rate, judge_level(m, study.capacity_slo(), saturated=sat).ok, 0.0))
    first_miss = next((i for i, p in enumerate(sweep) if not p.ok), len(sweep))
    dense = sweep[first_miss - 1].rate
    assert 8 < dense < 13.5  # the boundary lies inside the sweep
    low, high = out.row["capacity_rps_low"], out.row["capacity_rps_high"]
    assert low <= dense <= high, (low, dense, found, high)  # the interval holds the sweep's answer
    assert found == pytest.approx(dense, rel=0.10), (found, dense)
    assert len(out.levels) <= 10  # vs 23 levels for the sweep (and 38 from 6 req/s)


def test_capacity_trial_row_levels_and_records():
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    out = run_trial(capacity_study(), {"max_num_seqs": 64}, trial_id="t", trial_number=0,
                        ctx=TrialContext("r"))
    row, levels = out.row, out.levels
    assert row["status"] == "completed" and row["capacity_rps"] > 0
    # The answer is the fit of every level: where the levels' own verdicts (by their values) put the
    # crossing, contradictions or not; an interval from the bootstrap, the binding metric named.
    low, high = row["capacity_rps_low"], row["capacity_rps_high"]
    assert row["confidence"] == 0.9 and high is not None and low < row["capacity_rps"] < high
    rates, met = [lv["rate"] for lv in levels], [lv["slo_met"] for lv in levels]
    lower, upper = level_bracket(rates, met)
    assert 0 < lower <= row["capacity_rps"] <= upper < math.inf, (lower, row["capacity_rps"], upper)
    assert row["capacity_binding"] in ("ttft_p99_ms", "tpot_p50_ms") and row["start_noise"] == "none (simulator)"
    assert row["capacity_contradictions"] == contradictions(rates, met)
    assert {i for i, lv in enumerate(levels) if lv["contradicts"]} == contradicting(rates, met)
    # Every level is a point of the study's grid: another configuration measured there replays its requests.
    assert all(lv["grid_index"] is not None for lv in levels) and levels[0]["grid_index"] == 0
    # The row describes the highest level that met the SLOs at or below the estimate.
    best = max((lv for lv in levels if lv["slo_met"] and lv["rate"] <= row["capacity_rps"]), key=lambda lv: lv["rate"])
    assert row["capacity_goodput"] == best["goodput"] and row["ttft_p99_ms"] == best["ttft_p99_ms"]
    assert row["ttft_p99_ms_low"] <= row["ttft_p99_ms"] <= row["ttft_p99_ms_high"]
    assert row["capacity_rps_per_gpu_low"] == low and row["capacity_rps_per_gpu_high"] == high  # one GPU
    extra = json.loads(row["extra_json"])["capacity"]
    assert extra["levels"] == len(levels) and extra["level_of_row"] == best["level"]
    assert {r.level for r in out.records} == set(range(len(levels)))
    # An undecided level was measured again, each window with requests of its own, and pooled.
    for lv in levels:
        mine = [r for r in out.records if r.level == lv["level"] and not r.warmup]
        assert {r.window for r in mine} == set(range(lv["windows"]))
    again = [lv for lv in levels if lv["windows"] > 1]
    assert again, "the levels near the capacity were measured again"
    first, second = ([r for r in out.records if r.level == again[0]["level"] and r.window == w and not r.warmup]
                     for w in (0, 1))
    assert [r.scheduled_s for r in first] != [r.scheduled_s for r in second]  # fresh arrivals
    # Warm-up before the first level only (the burst of 1, then until steady), as its row says.
    warm = [r for r in out.records if r.warmup]
    assert {r.level for r in warm} == {0} and len(warm) == row["warmup_requests_used"] > 1
    assert row["warmup_converged"] == 1 and row["warmup_s_used"] >= capacity_study().workload.warmup.min_s
    assert [lv["warmup_requests_used"] for lv in levels] == [len(warm)] + [0] * (len(levels) - 1)
    assert levels[0]["warmup_converged"] == 1 and all(lv["warmup_converged"] is None for lv in levels[1:])
    for lv in levels:
        assert sum(1 for r in out.records if r.level == lv["level"] and not r.warmup) == lv["num_requests"]
        # capacity.repeats (1): an undecided level near its limit is measured again; one far from it is not
        # (the fit learns little more there: the window goes to the levels around the crossing).
        near = abs(math.log(max(lv["ttft_p99_ms"] / 300, lv["tpot_p50_ms"] / 30))) <= NEAR_LIMIT
        assert lv["slo_decided"] or lv["windows"] == 2 or not near, lv


def test_window_noise_widens_the_row_and_the_capacity_a_trial_reports():
    """The same trial (same seed, same requests) measured by an engine said to move between windows
    (``capacity.window_noise``): its latency intervals are wider, fewer of its levels are decided,
    and its capacity interval is no narrower than the one measured as the simulator is (no noise)."""
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    out = {}
    for name, noise in (("quiet", {}), ("noisy", {"ttft_p99_ms": 0.4})):
        out[name] = run_trial(capacity_study(window_noise=noise, repeats=0), {"max_num_seqs": 64}, trial_id="t",
                              trial_number=0, ctx=TrialContext("r"))
    quiet, noisy = out["quiet"].levels[0], out["noisy"].levels[0]
    assert quiet["rate"] == noisy["rate"] and quiet["ttft_p99_ms"] == noisy["ttft_p99_ms"]  # the same window
    assert noisy["ttft_p99_ms_low"] < quiet["ttft_p99_ms_low"] and noisy["ttft_p99_ms_high"] > quiet["ttft_p99_ms_high"]
    assert noisy["tpot_p50_ms_low"] == quiet["tpot_p50_ms_low"]  # not named: as drawn

    def decided(o):
        return sum(lv["slo_decided"] for lv in o.levels) / len(o.levels)

    assert decided(out["noisy"]) < decided(out["quiet"])
    width = {k: (o.row["capacity_rps_high"] or math.inf) - o.row["capacity_rps_low"] for k, o in out.items()}
    assert width["noisy"] >= width["quiet"], width


def test_capacity_over_a_trace_scales_its_time():
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    doc = capacity_study().model_dump(mode="json", exclude={"source_path"})
    doc["workload"] = {"trace": {"path": "chat", "max_requests": 100}, "warmup_requests": 1}
    study = parse_study(doc)
    out = run_trial(study, {"max_num_seqs": 64}, trial_id="t", trial_number=0, ctx=TrialContext("r"))
    assert out.levels[0]["rate"] == pytest.approx(out.levels[0]["requested_rate"])  # the trace's own rate
    assert all(lv["num_requests"] == 100 * lv["windows"] for lv in out.levels)
    assert out.row["capacity_rps"] > out.levels[0]["rate"]


# ---------------------------------------------------------------- the levels table
def test_levels_are_written_and_replaced_with_their_trial(tmp_path):
    from orchestrator.results import ResultsStore
    from orchestrator.results.levels import levels_to_table, load_levels
    from orchestrator.results.schema import requests_to_table
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    study = capacity_study()
    out = run_trial(study, {"max_num_seqs": 64}, trial_id="t1", trial_number=0, ctx=TrialContext("r1"))
    store = ResultsStore(tmp_path, study.name)
    kw = dict(study=study.name, run_id="r1", trial_id="t1")
    store.write_trial(out.row, requests_to_table(out.records, **kw), param_types=study.space.column_types(),
                      levels=levels_to_table(out.levels, **kw))
    df = load_levels(tmp_path / study.name)
    assert len(df) == len(out.levels) and list(df["level"]) == list(range(len(out.levels)))
    assert np.allclose(df["rate"], [lv["rate"] for lv in out.levels])
    assert df["slo_met"].tolist() == [lv["slo_met"] for lv in out.levels]
    assert store.read_levels(["t1"]).equals(df)
    store.write_trial(out.row, None, param_types=study.space.column_types())  # rewritten without levels
    assert load_levels(tmp_path / study.name).empty
    with pytest.raises(ValueError, match="unknown levels-table keys: bogus"):
        levels_to_table([{"level": 0, "bogus": 1}], **kw)


# ---------------------------------------------------------------- study validation
@pytest.mark.parametrize("workload, capacity, message", [
    ({"arrival": {"kind": "concurrency", "concurrency": 4}}, {}, "capacity: needs a workload whose rate"),
    ({}, {"slo": ["kv_cache_usage_peak <= 0.9"]}, "capacity.slo"),
    ({}, {"requests_per_level": 10, "level_duration_s": 5}, "requests_per_level or level_duration_s"),
    ({}, {"min_rate": 5, "max_rate": 1}, "min_rate (5) must be < max_rate (1)"),
    ({}, {"growth": 1.0}, "capacity.growth"),
    ({}, {"saturation": {"windo_s": 1}}, "did you mean 'window_s'"),
    ({}, {"window_noise": {"ttft_p99": 0.3}}, "capacity.window_noise: 'ttft_p99' has no interval to widen; use one of "
                                              "ttft_mean_ms, ttft_p50_ms"),
    ({}, {"window_noise": {"ttft_p99_ms": -1}}, "capacity.window_noise: ttft_p99_ms: -1 is not a log-scale standard "
                                                "deviation in [0, 2]"),
])
def test_capacity_problems_are_reported_one_line_each(study_doc, workload, capacity, message):
    study_doc["workload"].update(workload)
    study_doc["capacity"] = capacity
    with pytest.raises(StudyFileError) as e:
        parse_study(study_doc)
    assert len(e.value.problems) == 1 and message in str(e.value), str(e.value)
