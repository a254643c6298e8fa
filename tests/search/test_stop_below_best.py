"""A capacity trial that is decided below the best trial so far stops measuring: the comparison it feeds
is decided, and the windows left would only say by how much (a real local Ray, Tune and Optuna, the
simulator in virtual time). The same study with ``capacity.stop_below_best: false`` is the baseline:
the same configurations on the same requests, measured to the end."""

from __future__ import annotations

import copy
import json

from orchestrator.study.spec import parse_study
from support.studies import run_printed


def _study(study_doc, tmp_path, stop_below_best: bool):
    doc = copy.deepcopy(study_doc)
    doc.update(name=f"beat-{str(stop_below_best).lower()}", seed=5)
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["hardware"] = {"gpu": "H100-80GB"}
    doc["workload"] = {"arrival": {"kind": "poisson", "rate": 8}, "num_requests": 160,
                       "input_len": {"kind": "uniform", "min": 200, "max": 800}, "output_len": 64}
    # 256 sequences first (an initial point), then 2: at 8 req/s and above, two at a time cannot keep TTFT
    # in bounds, so its search misses its first level, below the first trial's capacity.
    doc["space"] = {"max_num_seqs": [2, 256]}
    doc["objectives"] = ["maximize capacity_rps"]
    doc["constraints"] = ["ttft_p99_ms <= 500"]
    doc["capacity"] = {"start_rate": 8, "growth": 1.5, "tolerance": 0.05, "max_levels": 8,
                       "level_duration_s": 8, "min_requests": 60, "stop_below_best": stop_below_best}
    doc["search"] = {"sampler": "grid", "initial_points": [{"max_num_seqs": 256}]}
    doc["budget"] = {"trials": 2, "max_concurrent_trials": 1}
    doc["output"] = str(tmp_path / "out")
    return parse_study(doc)


def _capacity(row) -> dict:
    return json.loads(row["extra_json"])["capacity"]


def test_a_trial_decided_below_the_best_stops_and_says_why(study_doc, tmp_path, unit_ray):
    rows = {}
    for on in (True, False):
        trials, _ = run_printed(_study(study_doc, tmp_path, on), serve_port=8139)
        assert list(trials.sort_values("trial_number")["max_num_seqs"]) == [256, 2]
        rows[on] = {int(r["max_num_seqs"]): r for _, r in trials.iterrows()}
    best, cut, full = rows[True][256], rows[True][2], rows[False][2]
    assert "below the best trial's capacity" in _capacity(cut)["stop_reason"]
    assert "below the best" not in _capacity(full)["stop_reason"]
    assert "below the best" not in _capacity(best)["stop_reason"]  # nothing to beat yet
    # Fewer windows for the same decision: the cut trial's capacity still lies below the best's lower bound.
    assert _capacity(cut)["windows"] < _capacity(full)["windows"]
    assert cut["capacity_rps_high"] <= best["capacity_rps_low"] or cut["capacity_rps"] < best["capacity_rps_low"]
    # The first trial is measured alike either way (nothing to beat yet, the same requests).
    assert _capacity(best)["windows"] == _capacity(rows[False][256])["windows"]
