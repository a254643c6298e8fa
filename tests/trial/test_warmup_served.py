"""The steady warm-up and fresh level prompts on the served simulator (Ray Serve, real time, one engine).

* a steady load: the warm-up lasts at least its floor, converges, runs at the trial's rate,
  and is over (every warm-up request finished) before the first measured request is sent;
  the trials and requests tables say so;
* an overload (a drifting stream: the backlog and TTFT grow every window): the warm-up
  does not converge, ends within ``max_s``, and its requests in flight are aborted;
* a capacity search with shared prefixes on one engine with prefix caching: the engine's
  prefix-cache hit rate over all levels is what the shared prefixes explain, not the
  replayed prompts of earlier levels.
"""

from __future__ import annotations

import pytest

from conftest import shared_serve
from orchestrator.results import ResultsStore, load_requests, load_trials
from orchestrator.results.levels import levels_to_table, load_levels
from orchestrator.results.schema import requests_to_table
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import sim_doc

pytestmark = pytest.mark.slow

PREFIX = 64  # shared-prefix tokens: four 16-token blocks of the simulated engine


@pytest.fixture(scope="module")
def ray_serve():
    return shared_serve()  # the port Serve's proxy listens on


def run(port, tmp_path, name, workload, max_num_seqs=32, **extra):
    study = parse_study(sim_doc(name=name, seed=5, engine={"mode": "served"}, workload={"timeout_s": 30, **workload},
                                space={"max_num_seqs": max_num_seqs}, output=str(tmp_path / "out"), **extra))
    out = run_trial(study, {"max_num_seqs": max_num_seqs}, trial_id=name, trial_number=0,
                        ctx=TrialContext("r1", serve_port=port))
    assert out.row["status"] == "completed", out.row.get("failure_message")
    kw = dict(study=study.name, run_id="r1", trial_id=name)
    ResultsStore(study.output, study.name).write_trial(
        out.row, requests_to_table(out.records, **kw), param_types=study.space.column_types(),
        levels=levels_to_table(out.levels, **kw) if out.levels else None)
    study_dir = tmp_path / "out" / study.name
    return out, load_trials(study_dir).iloc[0], load_requests(study_dir, include_warmup=True), study_dir


def test_a_steady_load_warms_up_past_its_floor_then_measures(tmp_path, ray_serve):
    _, row, requests, _ = run(ray_serve, tmp_path, "steady", {
        "arrival": {"kind": "poisson", "rate": 8}, "num_requests": 16, "warmup_requests": 1,
        "input_len": 200, "output_len": 8, "warmup": {"min_s": 3, "window_s": 0.5, "max_s": 15}})
    assert row["warmup_converged"] == 1 and 3.0 <= row["warmup_s_used"] < 16
    warm, measured = requests[requests["warmup"]], requests[~requests["warmup"]]
    assert len(warm) == row["warmup_requests_used"] > 1 + 3 * 8 * 0.5
    assert len(measured) == 16 == row["num_requests"] == row["completed"]
    # Measured window excludes the warm-up: every warm-up request ended before the first measured send.
    assert warm["success"].all() and warm["end_s"].max() <= 0 <= measured["sent_s"].min()
    assert warm["sent_s"].min() == pytest.approx(-row["warmup_s_used"], abs=0.05)
    # The steady warm-up ran at the trial's rate, with prompts of its own lengths.
    stream = warm[warm["request_index"] < -1].sort_values("sent_s")
    span = stream["sent_s"].iloc[-1] - stream["sent_s"].iloc[0]
    assert (len(stream) - 1) / span == pytest.approx(8, rel=0.4)
    assert (warm["expected_prompt_tokens"] == 200).all()


def test_an_overload_does_not_converge_and_ends_within_max_s(tmp_path, ray_serve):
    out, row, requests, _ = run(ray_serve, tmp_path, "overload", {
        "arrival": {"kind": "poisson", "rate": 40}, "num_requests": 10, "warmup_requests": 0,
        "input_len": {"kind": "uniform", "min": 200, "max": 1200}, "output_len": 32,
        "warmup": {"min_s": 1, "window_s": 0.5, "max_s": 4}}, max_num_seqs=2)
    assert row["warmup_converged"] == 0
    warm = requests[requests["warmup"]]
    assert len(warm) == row["warmup_requests_used"] > 40
    # Nothing due after max_s was sent (the judge looks every 0.125 s; a busy machine sends late).
    assert warm["scheduled_s"].max() - warm["scheduled_s"].min() <= 4.0 + 0.3
    assert (warm["error_kind"] == "aborted").sum() > 0  # in flight when it gave up: aborted, not awaited
    assert row["num_requests"] == 10 and (requests.loc[~requests["warmup"], "sent_s"] >= 0).all()


def test_capacity_levels_hit_the_prefix_cache_only_for_the_shared_prefixes(tmp_path, ray_serve):
    out, row, requests, study_dir = run(ray_serve, tmp_path, "prefix-levels", {
        "arrival": {"kind": "poisson", "rate": 4}, "warmup_requests": 1,
        "input_len": {"kind": "uniform", "min": 100, "max": 300}, "output_len": 8,
        "shared_prefix": {"groups": 2, "length": PREFIX},
        "warmup": {"min_s": 1, "window_s": 0.5, "max_s": 5}},
        capacity={"start_rate": 4, "growth": 1.5, "max_levels": 3, "level_duration_s": 2, "min_requests": 8},
        constraints=["ttft_p99_ms <= 5000"])
    levels = load_levels(study_dir)
    assert list(levels["level"]) == [0, 1, 2] and levels["slo_met"].all()
    # Warm-up before level 0 only; the row carries level 0's.
    assert levels.loc[0, "warmup_requests_used"] == row["warmup_requests_used"] > 1
    assert levels.loc[0, "warmup_converged"] == row["warmup_converged"] == 1
    assert list(levels.loc[1:, "warmup_requests_used"]) == [0, 0] == list(levels.loc[1:, "warmup_s_used"])
    assert levels.loc[1:, "warmup_converged"].isna().all()
    assert set(requests.loc[requests["warmup"], "level"]) == {0}
    # Every request (warm-ups included) was admitted once: what prefix caching could hit is the shared
    # prefix of each request behind one, nothing of the prompts' own parts, whatever the level.
    assert requests["success"].all()
    explained = PREFIX * requests["prefix_group"].notna().sum() / requests["prompt_tokens"].sum()
    assert 0.5 * explained < row["prefix_cache_hit_rate"] <= explained, (row["prefix_cache_hit_rate"], explained)
