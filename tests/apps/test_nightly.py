"""``orchestrator nightly``: re-measure last night's front, compare, flag a slower engine (and only that)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import yaml

from conftest import REPO
from orchestrator.apps.nightly import (NightlyPolicy, NightlySummary, compare_nights, front_points, load_summaries,
                                       previous_run, summarise_night)
from orchestrator.results.schema import trial_row_to_table, trials_schema
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import sim_doc


def _study(slowdown: float = 1.0, **over):
    """The nightly study; ``over``: sections replaced whole."""
    return parse_study(sim_doc(
        name="nightly", seed=1, engine={"calibration": {"slowdown": slowdown}}, hardware={"gpus_per_node": 2},
        workload={"arrival": {"kind": "poisson", "rate": 20}, "num_requests": 60,
                  "input_len": {"kind": "uniform", "min": 200, "max": 800}, "output_len": 64},
        space={"max_num_seqs": [16, 128], "max_num_batched_tokens": [2048, 8192]},
        objectives=["maximize output_throughput_per_gpu", "minimize ttft_p99_ms"],
        constraints=["ttft_p99_ms <= 5000"]) | over)


def _night(study, run_id: str, points) -> pd.DataFrame:
    """Trials of one night, measured by the real virtual-time engine and stored through the real schema."""
    tables = []
    for i, params in enumerate(points):
        outcome = run_trial(study, params, trial_id=f"{run_id}-{i:04d}", trial_number=i,
                                ctx=TrialContext(run_id=run_id))
        tables.append(trial_row_to_table(outcome.row, trials_schema(study.space.column_types())))
    return pd.concat([t.to_pandas() for t in tables], ignore_index=True)


POINTS = [{"max_num_seqs": 128, "max_num_batched_tokens": 8192}, {"max_num_seqs": 16, "max_num_batched_tokens": 2048}]


def test_same_engine_no_regression_slower_engine_regression():
    base = _night(_study(), "r1", POINTS)
    configs = front_points(base, _study(), limit=5)
    assert configs and all(set(c) == {"max_num_seqs", "max_num_batched_tokens"} for c in configs)
    policy = NightlyPolicy(threshold=0.1)

    same = _night(_study(), "r2", configs)
    changes, reasons = compare_nights(base, same, _study(), policy, configs)
    assert reasons == []
    assert {c.metric for c in changes} >= {"output_throughput_per_gpu", "ttft_p99_ms", "tpot_p99_ms"}
    assert all(c.change == pytest.approx(0, abs=1e-9) for c in changes if c.change is not None)  # deterministic sim

    slow = _study(slowdown=1.6)
    slower = _night(slow, "r3", configs)
    changes, reasons = compare_nights(base, slower, slow, policy, configs)
    assert reasons, "a 1.6x slower engine must be flagged"
    flagged = [c for c in changes if c.regression]
    assert any(c.metric in ("ttft_p99_ms", "tpot_p99_ms") and c.change > 0.1 for c in flagged)
    # Everything flagged got worse by more than the threshold, or stopped meeting the SLOs / starting.
    assert all((c.change or 0) > 0.1 or c.note for c in flagged)

    summary = summarise_night(slow, run_id="r3", current=slower, previous=base, previous_run_id="r1",
                              configs=configs, policy=policy)
    again = NightlySummary.from_dict(json.loads(summary.to_json()))
    assert again.regression and again.reasons == summary.reasons and again.changes == summary.changes
    assert "compared with run r1" in again.headline()


def test_previous_run_is_the_latest_on_the_same_workload():
    study = _study()
    a = _night(study, "a", POINTS[:1])
    b = _night(study, "b", POINTS[:1])
    other = _night(_study(workload={"arrival": {"kind": "poisson", "rate": 5}, "num_requests": 10, "output_len": 8}),
                   "c", POINTS[:1])
    both = pd.concat([a, b, other], ignore_index=True)
    assert previous_run(both, study) == "b"
    assert previous_run(both, study, before="b") == "a"
    assert previous_run(both.iloc[0:0], study) is None

    # Written by an older tuner that lacked a workload field (now defaulted): still the same workload.
    from orchestrator.workload.spec import WorkloadSpec

    defaults = WorkloadSpec().model_dump(mode="json")
    older = json.loads(a["workload_json"].iloc[0])
    dropped = next(k for k, v in older.items() if defaults.get(k) == v)
    a_old = a.assign(workload_json=json.dumps({k: v for k, v in older.items() if k != dropped}))
    assert previous_run(pd.concat([a_old, other], ignore_index=True), study) == "a"


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError, match="threshold"):
        NightlyPolicy(threshold=0)
    assert NightlyPolicy().remeasure_limit(16) == 8 and NightlyPolicy().remeasure_limit(1) == 1


# ------------------------------------------------------------------ the command, on a real Ray
@pytest.mark.slow
def test_nightly_command_flags_a_slower_engine_only(unit_ray, tmp_path_factory, tmp_path, capsys):
    from support.quickstart_dataset import shared_quickstart

    from orchestrator.cli import main
    from orchestrator.results import load_trials

    baseline = shared_quickstart(tmp_path_factory).parent
    output = tmp_path / "results"
    shutil.copytree(baseline, output, symlinks=True)  # the quickstart run is "last night"
    doc = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    doc["engine"] = {**doc["engine"], "mode": "virtual"}
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(doc))
    doc["engine"]["calibration"] = {"slowdown": 1.6}
    slower = tmp_path / "slower.yaml"
    slower.write_text(yaml.safe_dump(doc))
    args = ["--output", str(output), "--trials", "3", "--remeasure", "2", "--quiet"]
    baseline_trials = load_trials(output / "quickstart")
    first_run = baseline_trials["run_id"].iloc[0]
    from orchestrator.study.load import load_study

    expected = front_points(baseline_trials, load_study(same), limit=2)  # what night 1 must re-measure first
    assert expected

    code = main(["nightly", str(same), "--no-report", "--summary", str(tmp_path / "same.json"), *args])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "no regression" in out
    night1 = NightlySummary.from_dict(json.loads((tmp_path / "same.json").read_text()))
    assert night1.previous_run_id == first_run and night1.remeasured == len(expected) and not night1.regression
    trials = load_trials(output / "quickstart", run=night1.run_id).sort_values("trial_number")
    trials = trials[trials["status"] != "pruned"]  # the pre-flight's rows took no trial of the budget
    assert len(trials) == 3
    # The previous front was measured first, and the deterministic sim reproduced it exactly.
    first = [{k: v for k, v in json.loads(p).items() if k in expected[0]} for p in trials["params_json"]]
    assert first[:len(expected)] == expected
    remeasured = [c for c in night1.changes if c.metric == "ttft_p99_ms" and c.what != "best under SLOs"]
    assert len(remeasured) == len(expected) and all(c.change == pytest.approx(0, abs=1e-9) for c in remeasured)
    assert {c.current_trial for c in remeasured} == set(trials["trial_id"][:len(expected)])

    code = main(["nightly", str(slower), "--summary", str(tmp_path / "slower.json"), *args])
    out = capsys.readouterr().out
    assert code == 3, out
    assert "REGRESSION" in out
    night2 = NightlySummary.from_dict(json.loads((tmp_path / "slower.json").read_text()))
    assert night2.regression and night2.previous_run_id == night1.run_id and night2.reasons
    assert any("ttft_p99_ms" in r or "tpot_p99_ms" in r for r in night2.reasons)

    # The summaries are in the dataset, oldest first, and the report has a nightly section.
    assert [s.run_id for s in load_summaries(str(output / "quickstart"))] == [night1.run_id, night2.run_id]
    page = (output / "quickstart" / "report" / "index.html").read_text()
    assert 'id="nightly"' in page and "Regression flagged" in page


def test_a_change_inside_the_noise_is_reported_not_flagged():
    """Tonight measured the same engine with another draw of the workload: its changes are the
    workload's noise, inside the two nights' intervals, so nothing is flagged, whatever its size."""
    base = _night(_study(), "r1", POINTS)
    configs = front_points(base, _study(), limit=5)
    policy = NightlyPolicy(threshold=0.03)
    study = _study()
    tonight = []
    for i, params in enumerate(configs):
        out = run_trial(study, params, trial_id=f"r2-{i:04d}", trial_number=i, ctx=TrialContext(run_id="r2"),
                        measurement=1)
        tonight.append(trial_row_to_table(out.row, trials_schema(study.space.column_types())).to_pandas())
    tonight = pd.concat(tonight, ignore_index=True)
    changes, reasons = compare_nights(base, tonight, study, policy, configs)
    assert reasons == [], reasons
    moved = [c for c in changes if c.change is not None and c.change > policy.threshold]
    assert moved, "a change beyond the threshold happened, inside the noise"
    assert all(not c.regression and "within the noise" in c.note for c in moved)
