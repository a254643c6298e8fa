"""Racing: the last trials of a run measure again the configurations tied with the best, and the
answer pools them (a real local Ray, Tune and Optuna, the simulator in virtual time)."""

from __future__ import annotations

import json

import pandas as pd

from orchestrator.apps.recommend import recommend
from orchestrator.results.paired import decode_draws
from orchestrator.results.ties import combine_repeats
from orchestrator.search.racing import Racer
from orchestrator.study.spec import parse_study
from support.studies import run_printed, sim_doc


def _study(tmp_path, remeasure: int):
    return parse_study(sim_doc(
        name="race", seed=4,
        workload={"arrival": {"kind": "poisson", "rate": 16}, "num_requests": 160,
                  "input_len": {"kind": "uniform", "min": 100, "max": 900}, "output_len": 64},
        # Three configurations the engine cannot tell apart at this load (fewer than 60 requests run at once),
        # on an engine that moves TTFT's tail by 40% (log sd) from one start to the next: no single start
        # tells them apart, and their paired differences straddle the 5% margin.
        space={"max_num_seqs": [240, 250, 256]},
        objectives=["maximize capacity_rps"], constraints=["ttft_p99_ms <= 400"],
        capacity={"start_rate": 16, "growth": 1.5, "tolerance": 0.1, "max_levels": 5,
                  "level_duration_s": 8, "min_requests": 80, "start_noise": {"ttft_p99_ms": 0.4}},
        search={"sampler": "grid", "remeasure": remeasure},
        budget={"trials": 6, "max_concurrent_trials": 1}, output=str(tmp_path / "out")))


def test_the_last_trials_measure_the_tied_leaders_again_and_the_answer_pools_them(tmp_path, unit_ray):
    study = _study(tmp_path, remeasure=3)
    trials, printed = run_printed(study, serve_port=8137)
    trials = trials.sort_values("trial_number").reset_index(drop=True)
    assert len(trials) == 6 and (trials["status"] == "completed").all()
    first, again = trials[trials["measurement"] == 0], trials[trials["measurement"] > 0]
    assert sorted(first["max_num_seqs"]) == [240, 250, 256]  # the grid, once each
    assert len(again) == 3 and set(again["measurement"]) == {1}  # then each contender once more
    assert sorted(again["max_num_seqs"]) == [240, 250, 256]
    # A measurement again is another draw of the workload on another start: its own value, and the
    # three measured again replayed the same requests (one seed): paired with each other.
    for _, row in again.iterrows():
        before = first[first["max_num_seqs"] == row["max_num_seqs"]].iloc[0]
        assert row["capacity_rps"] != before["capacity_rps"]
    assert len({decode_draws(d)[0] for d in again["draws_json"]}) == 1
    assert "not yet told apart" in printed
    pooled = combine_repeats(trials, ["capacity_rps"])
    assert len(pooled) == 3 and set(pooled["measurements"]) == {2}
    rec = recommend(trials, study)
    assert rec.choice is not None and ("not yet told apart" in rec.choice or "equivalent" in rec.choice)


def test_racing_stops_once_the_best_is_ahead_beyond_the_noise():
    racer = Racer("capacity_rps", True, left=4, reserve=2)
    for params, value, lo, hi in (({"s": 1}, 50.0, 48.0, 52.0), ({"s": 2}, 40.0, 38.0, 42.0)):
        racer.trial_started(params)
        racer.observe(params, True, value, lo, hi)
    assert racer.next_remeasure() is None  # 48 > 42: nothing tied with the best
    racer.observe({"s": 3}, True, 47.0, 44.0, 50.0)
    racer.observe({"s": 4}, False, 60.0, 59.0, 61.0)  # misses an SLO: never a contender
    params, k = racer.next_remeasure()
    assert params == {"s": 1} and k == 1  # the best first
    racer.trial_started(params)
    params, k = racer.next_remeasure()
    assert params == {"s": 3} and k == 1  # then the tied one measured least often
    racer.left = 3
    assert racer.next_remeasure() is None and racer.next_remeasure(stopping=True) is not None


def test_a_resumed_run_races_on_the_rows_recorded_before():
    racer = Racer("ttft_p99_ms", False, left=1, reserve=1)
    rows = pd.DataFrame({"params_json": [json.dumps({"s": 1}), json.dumps({"s": 2})], "status": ["completed"] * 2,
                         "feasible": [True, True], "ttft_p99_ms": [100.0, 104.0], "ttft_p99_ms_low": [90.0, 95.0],
                         "ttft_p99_ms_high": [110.0, 120.0]})
    racer.observe_rows(rows)
    assert racer.contenders() == [json.dumps({"s": 1}), json.dumps({"s": 2})]
    assert racer.next_remeasure() == ({"s": 1}, 1)
