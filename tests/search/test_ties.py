"""Noise-aware ranking on measured trials: a tie is called a tie, a real difference is ranked.

The served simulator (real Ray Serve, real HTTP load, real time): the same configuration measured
twice with different workload seeds (equal by construction) must come out tied in
``best_under_slos``, the noise-aware front and ``recommend``; another configuration on an engine
60% slower must be ranked below, beyond the noise. The capacity search's intervals are checked the
same way on the virtual simulator, where they are cheap: three seeds of one configuration tied, an
engine 30% slower ranked below.
"""

from __future__ import annotations

import itertools
import json

import pandas as pd
import pytest

from conftest import shared_serve
from orchestrator.apps.recommend import recommend
from orchestrator.results.analysis import best_under_slos
from orchestrator.results.schema import trial_row_to_table, trials_schema
from orchestrator.results.ties import combine_repeats, front_with_ties, noise_front, tie_mask
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import sim_doc

PARAMS = {"max_num_seqs": 64}
# At 8 req/s about ten requests run at once: these bounds are never reached, so these
# configurations perform the same on the same engine.
OTHER_PARAMS = {"max_num_seqs": 48}
SLOW_PARAMS = {"max_num_seqs": 32}


@pytest.fixture(scope="module")
def ray_serve():
    return shared_serve()  # the port Serve's proxy listens on


def served_study(tmp_path, slowdown: float = 1.0):
    return parse_study(sim_doc(
        name="ties", seed=5, engine={"mode": "served", "calibration": {"slowdown": slowdown}},
        workload={"arrival": {"kind": "poisson", "rate": 8}, "num_requests": 96, "warmup_requests": 2,
                  "input_len": {"kind": "uniform", "min": 100, "max": 600}, "output_len": 48, "timeout_s": 30},
        space={"max_num_seqs": [32, 48, 64]}, objectives=["minimize tpot_p50_ms"], output=str(tmp_path / "out")))


def _frame(study, outcomes) -> pd.DataFrame:
    schema = trials_schema(study.space.column_types())
    return pd.concat([trial_row_to_table(o.row, schema).to_pandas() for o in outcomes], ignore_index=True)


@pytest.mark.slow
def test_equal_configurations_are_tied_and_a_slower_one_is_ranked(ray_serve, tmp_path):
    ctx = TrialContext("r1", serve_port=ray_serve)
    study = served_study(tmp_path)
    # The same configuration, measured twice with other arrivals, lengths and prompts.
    a = run_trial(study, PARAMS, trial_id="r1-0000", trial_number=0, ctx=ctx)
    b = run_trial(study, PARAMS, trial_id="r1-0001", trial_number=1, ctx=ctx, measurement=1)
    # Another configuration on an engine 60% slower (another configuration: recommend pools the
    # measurements of one configuration, and this one must stay a row of its own).
    slow_study = served_study(tmp_path, slowdown=1.6)
    c = run_trial(slow_study, SLOW_PARAMS, trial_id="r1-0002", trial_number=2, ctx=ctx)
    rows = _frame(study, [a, b, c])
    assert list(rows["status"]) == ["completed"] * 3, rows[["status", "failure_message"]]
    assert list(rows["measurement"]) == [0, 1, 0]
    sent = [[r.prompt_tokens for r in o.records if not r.warmup] for o in (a, b)]
    assert sent[0] != sent[1]  # another draw of the workload
    for _, r in rows.iterrows():
        assert r["tpot_p50_ms_low"] <= r["tpot_p50_ms"] <= r["tpot_p50_ms_high"] and r["confidence"] == 0.9

    # The equal pair: tied, whichever measured the lower value.
    pair = rows.iloc[:2].reset_index(drop=True)
    assert tie_mask(pair, 0, "tpot_p50_ms").all()
    ranked = best_under_slos(pair, "tpot_p50_ms", "minimize")
    assert ranked["tied_with_best"].all()
    front = noise_front(pair, [("tpot_p50_ms", "minimize")])
    # Both stay: neither is better by a decided comparison (tied, or equivalent within the margin).
    assert len(front) == 2 and list(front["tied_with"] + front["equivalent_with"]) == [1, 1]
    assert front["strict_front"].sum() == 1  # the point values alone would have named one

    # 60% slower: ranked below both, beyond the noise, off the front. (In real time on two busy
    # cores a 30% slower engine came out tied once: the client's own delays widen the intervals.
    # The 30% case is the virtual capacity test below, where nothing but the engine differs.)
    ranked = best_under_slos(rows, "tpot_p50_ms", "minimize")
    assert ranked["trial_id"].iloc[-1] == "r1-0002" and not ranked["tied_with_best"].iloc[-1]
    # The engine's steps take 60% longer; the served loop's own time per step does not (on a busy
    # 2-core machine a 30% slowdown measured 17%).
    assert rows["tpot_p50_ms"].iloc[2] > 1.2 * rows["tpot_p50_ms"].iloc[:2].max()
    front = front_with_ties(rows, ["minimize tpot_p50_ms"])  # one configuration measured twice: one candidate
    assert list(front["trial_id"]) == ["r1-0001"] and list(front["measurements"]) == [2]

    # The pair is one configuration measured twice: pooled into one row, which recommend chooses
    # with the pooled value (nothing else is equivalent to it or undecided against it: nothing to pick among).
    pooled = combine_repeats(rows, ["tpot_p50_ms"])
    assert len(pooled) == 2 and sorted(pooled["measurements"]) == [1, 2]  # the slow configuration alone
    both = pooled[pooled["measurements"] == 2].iloc[0]
    assert rows["tpot_p50_ms"].iloc[:2].min() <= both["tpot_p50_ms"] <= rows["tpot_p50_ms"].iloc[:2].max()
    rec = recommend(rows, study)
    assert rec.trial_id in {"r1-0000", "r1-0001"} and rec.choice is None
    assert rec.metrics["tpot_p50_ms"] == pytest.approx(both["tpot_p50_ms"])

    # Another configuration that performs the same: equivalent to the pair within 5% (or, where real time's
    # noise widens the paired interval past the margin, not yet told apart), and recommend says so and
    # chooses among equivalent ones by its stated rule.
    d = run_trial(study, OTHER_PARAMS, trial_id="r1-0003", trial_number=3, ctx=ctx)
    rows = _frame(study, [a, b, c, d])
    assert rows["status"].iloc[3] == "completed", rows["failure_message"].iloc[3]
    rec = recommend(rows, study)
    assert rec.trial_id in {"r1-0000", "r1-0001", "r1-0003"}
    assert rec.choice is not None, rec
    assert "equivalent on tpot_p50_ms within ±5% to 1 other" in rec.choice or "not yet told apart" in rec.choice
    assert "fewer GPUs" in rec.choice or "equivalent" not in rec.choice


def capacity_study(slowdown: float = 1.0):
    return parse_study(sim_doc(
        name="ties-cap", seed=1, engine={"calibration": {"slowdown": slowdown}}, hardware={"gpu": "A100-80GB"},
        workload={"arrival": {"kind": "poisson", "rate": 12}, "warmup_requests": 4,
                  "input_len": {"kind": "lognormal", "mean": 512, "sigma": 0.5, "min": 32, "max": 2048},
                  "output_len": {"kind": "uniform", "min": 64, "max": 192}},
        space={"max_num_seqs": 256}, objectives=["maximize capacity_rps"],
        constraints=["ttft_p99_ms <= 500", "tpot_p50_ms <= 50"],
        capacity={"start_rate": 12, "growth": 1.5, "tolerance": 0.08, "max_levels": 8, "level_duration_s": 12,
                  "min_requests": 500, "max_rate": 200}))


def test_capacity_intervals_tie_equal_configurations_and_rank_a_slower_engine():
    runs = [run_trial(capacity_study(), {}, trial_id=f"r-{k:04d}", trial_number=k, ctx=TrialContext("r"),
                      measurement=k) for k in range(3)]
    slow = run_trial(capacity_study(slowdown=1.3), {}, trial_id="r-0009", trial_number=9, ctx=TrialContext("r"))
    rows = _frame(capacity_study(), runs + [slow])
    cap, low, high = rows["capacity_rps"], rows["capacity_rps_low"], rows["capacity_rps_high"]
    shown = rows[["trial_id", "capacity_rps", "capacity_rps_low", "capacity_rps_high"]].to_string()
    # Each capacity says how sure it is: an interval around the estimate, not a point ...
    assert ((low < cap) & (cap < high)).all(), shown
    # ... as sure as the data allow: three measurements of one configuration (each its own requests) never
    # give disjoint intervals, and the engine 30% slower lies below every one of their estimates.
    for i, j in itertools.combinations(range(3), 2):
        assert max(low[i], low[j]) <= min(high[i], high[j]), shown
    assert (high[3] < cap[:3]).all(), shown
    same = rows.iloc[:3].reset_index(drop=True)
    for i in range(3):
        assert tie_mask(same, i, "capacity_rps").all(), same[["capacity_rps", "capacity_rps_low", "capacity_rps_high"]]
    ranked = best_under_slos(rows, "capacity_rps", "maximize")
    assert ranked["trial_id"].iloc[-1] == "r-0009" and not ranked["tied_with_best"].iloc[-1]
    assert json.loads(rows["extra_json"].iloc[0])["capacity"]["levels"] <= 8
