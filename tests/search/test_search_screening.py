"""The pre-flight before and inside the proposal loop: a region that cannot start costs no trial.

Real studies (local Ray, Tune, Optuna, virtual-time simulator) over spaces part of which
cannot start: ``max_model_len`` 131072 leaves no room for one sequence's KV cache at 25%
of the GPU. Where that region is a combination (131072 starts at 90%), every turned-away
proposal must be a ``pruned`` row with the reason, told to the sampler as infeasible, and
the budget counts only real trials. Where a value never starts whatever the others, it is
taken out of the space before sampling: no proposal, no row. Either way every Tune trial
that ran is a configuration that can start.
"""

from __future__ import annotations


import optuna
import pytest

from conftest import sim_study
from support.studies import run_printed, tune_trials
from orchestrator.search.state import optuna_storage, optuna_study_name
from orchestrator.study.state_dir import local_state_dir

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("unit_ray")]


def _study(study_doc, tmp_path, trials: int, memory=0.25):
    return sim_study(study_doc, name="screen", seed=3,
                     workload={"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 12, "output_len": 8},
                     space={"max_model_len": [4096, 131072], "max_num_seqs": [8, 16, 32, 64, 128, 256],
                            "gpu_memory_utilization": memory},
                     search={"sampler": "random", "preflight": True},
                     budget={"trials": trials, "max_concurrent_trials": 1}, output=str(tmp_path / "out"))


def _run(study) -> tuple:
    return run_printed(study, serve_port=8131)


def _optuna_trials(study):
    ostudy = optuna.load_study(study_name=optuna_study_name(study), storage=optuna_storage(local_state_dir(study)))
    return ostudy.get_trials(deepcopy=False)


def test_a_region_that_cannot_start_takes_no_trial(study_doc, tmp_path):
    study = _study(study_doc, tmp_path, trials=5, memory=[0.25, 0.9])
    rows, out = _run(study)
    completed, pruned = rows[rows["status"] == "completed"], rows[rows["status"] == "pruned"]
    assert len(completed) == 5 and set(rows["status"]) <= {"completed", "pruned"}, rows["status"].tolist()
    assert not ((completed["max_model_len"] == 131072) & (completed["gpu_memory_utilization"] == 0.25)).any()
    assert len(pruned) > 0
    assert ((pruned["max_model_len"] == 131072) & (pruned["gpu_memory_utilization"] == 0.25)).all()
    assert (pruned["failure_kind"] == "preflight").all()
    assert pruned["failure_message"].str.contains("kv_cache_too_small").all()

    # Tune ran exactly the five real trials: no slot went to a configuration that cannot start.
    tuned = tune_trials(study)
    assert len(tuned) == 5, tuned
    assert not any(c["max_model_len"] == 131072 and c["gpu_memory_utilization"] == 0.25 for c in tuned), tuned

    # The sampler was told: every pruned trial is COMPLETE with its start constraint violated.
    by_number = {t.number: t for t in _optuna_trials(study)}
    for number in pruned["trial_number"]:
        t = by_number[int(number)]
        assert t.state == optuna.trial.TrialState.COMPLETE and t.constraints["engine_started"] > 0, t

    assert "never starts" not in out  # each value starts with some setting of the others
    assert out.count("[pruned before start]") == len(pruned)


def test_a_value_that_never_starts_is_taken_out_of_the_space(study_doc, tmp_path):
    study = _study(study_doc, tmp_path, trials=5)
    rows, out = _run(study)
    assert len(rows) == 5 and (rows["status"] == "completed").all(), rows["status"].tolist()
    assert (rows["max_model_len"] == 4096).all()
    tuned = tune_trials(study)
    assert len(tuned) == 5 and all(c["max_model_len"] == 4096 for c in tuned), tuned
    # The sampler never saw the value: its distribution has the one choice left.
    assert {t.distributions["max_model_len"].choices for t in _optuna_trials(study)} == {(4096,)}
    assert ("never starts (taken out of the space before sampling): max_model_len=131072 (kv_cache_too_small)"
            in out), out
