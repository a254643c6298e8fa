"""Samplers: each one the study file names is built, seeded, repeatable, and told the constraints.

Optuna is driven directly (as ``benchmarks/search_efficiency.py`` does): ask, suggest the
study's space, run the trial, set its constraints, tell. The objective in the seeding
tests is plain arithmetic (what a seed controls does not depend on it); the constraint
tests run the real trial path with the virtual simulator.
"""

from __future__ import annotations

import copy

import optuna
import pytest

from orchestrator.search.optuna_search import SamplerReport, ask_distinct, tell, tell_report
from orchestrator.search.row import trial_row
from orchestrator.search.samplers import make_sampler, sampler_seed
from orchestrator.search.trial_plan import judge_result, run_trial
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.studies import merged

optuna.logging.set_verbosity(optuna.logging.WARNING)
SAMPLERS = ["tpe", "nsga2", "gp", "random", "grid"]  # gp: torch's import + first fit take ~15 s (slow)


def study_for(study_doc, sampler: str, **search):
    return parse_study(merged(
        study_doc, engine={"mode": "virtual"},
        space={"max_num_seqs": [8, 16, 32, 64], "max_num_batched_tokens": [1024, 2048, 4096],
               "gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 0.9, "step": 0.1}},
        objectives=["maximize goodput"],
        search={"sampler": sampler, "n_startup_trials": 2, **search},  # the model proposes from trial 3
        budget={"trials": 12}))


def proposals(study, n: int) -> list[dict]:
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study))
    out = []
    for _ in range(n):
        trial, params = ask_distinct(ostudy, study.space)
        # A smooth bowl with its top at 32 seqs / 2048 tokens / 0.8.
        value = -abs(params["max_num_seqs"] - 32) - abs(params["max_num_batched_tokens"] - 2048) / 512 \
            - 10 * abs(params["gpu_memory_utilization"] - 0.8)
        trial.set_constraint("slo0", -1.0)
        tell(ostudy, trial, [value])
        out.append(params)
    return out


@pytest.mark.parametrize("sampler", [pytest.param(s, marks=pytest.mark.slow) if s == "gp" else s for s in SAMPLERS])
def test_sampler_is_seeded_and_repeatable(study_doc, sampler):
    study = study_for(study_doc, sampler)
    n = 4
    first = proposals(study, n)
    assert first == proposals(study, n)
    assert len({tuple(sorted(p.items())) for p in first}) == n  # no configuration proposed twice
    other = proposals(study_for(study_doc, sampler, seed=12345), n)
    assert other != first  # search.seed changes the search, not the study
    assert study_for(study_doc, sampler, seed=12345).fingerprint() == study.fingerprint()


def test_sampler_seed_defaults_to_study_seed(study_doc):
    doc = copy.deepcopy(study_doc)
    doc["seed"] = 7
    assert sampler_seed(parse_study(doc)) == 7
    doc["search"] = {"seed": 3}
    assert sampler_seed(parse_study(doc)) == 3


def test_grid_visits_every_point_once(study_doc):
    study = study_for(study_doc, "grid")
    size = study.space.grid_size()
    seen = proposals(study, size)
    assert sorted(map(lambda p: tuple(sorted(p.items())), seen)) == \
        sorted(map(lambda p: tuple(sorted(p.items())), study.space.grid()))


def test_pruned_configuration_reaches_the_sampler_as_a_violated_constraint(study_doc):
    """Pre-flight rejects a 128k context at 0.5 memory; the sampler sees engine_started > 0."""
    doc = merged(study_doc, engine={"mode": "virtual"}, workload={"num_requests": 8, "output_len": 8},
                 search={"sampler": "grid", "preflight": True})
    study = parse_study(doc | {"space": {"max_model_len": [4096, 131072], "gpu_memory_utilization": 0.25}})
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study))
    rows = {}
    for _ in range(2):
        trial, params = ask_distinct(ostudy, study.space)
        result = run_trial(study, params, trial_id=f"t{trial.number}", trial_number=trial.number,
                               ctx=TrialContext(run_id="r"))
        row = trial_row(study, result)
        tell_report(ostudy, trial, SamplerReport.of(judge_result(study, result), row["status"]))
        rows[params["max_model_len"]] = (row, ostudy.trials[trial.number])
    pruned, pruned_trial = rows[131072]
    assert pruned["status"] == "pruned" and pruned["failure_kind"] == "preflight"
    assert "kv_cache_too_small" in pruned["failure_message"] and "max seq len" in pruned["failure_message"]
    assert pruned_trial.constraints["engine_started"] > 0
    ok, ok_trial = rows[4096]
    assert ok["status"] == "completed" and ok_trial.constraints["engine_started"] <= 0


@pytest.mark.parametrize("suggested", [0, 1], ids=["no-parameter", "first-parameter-only"])
def test_grid_goes_on_after_a_trial_a_stopped_driver_left_behind(tmp_path, study_doc, suggested):
    """A driver stopped between ask and its last suggest (killed, or its disk full in the middle
    of the journal: seen in the full-disk test) leaves a trial with none or some of its
    parameters. Resume marks it failed and queues those parameters again; the grid sampler must
    still walk the whole grid (Optuna's own takes the trial for a leaf: "param_name mismatch")."""
    import pandas as pd

    from orchestrator.search.reconcile import reconcile
    from orchestrator.search.state import optuna_storage

    study = parse_study(merged(study_doc, space={"max_num_seqs": [8, 16], "max_num_batched_tokens": [1024, 2048]},
                               search={"sampler": "grid"}))
    storage = optuna_storage(tmp_path)
    ostudy = optuna.create_study(storage=storage, study_name="s", directions=study.directions,
                                 sampler=make_sampler(study, concurrent=False))
    orphan = ostudy.ask()
    for name in study.space.ordered_names()[:suggested]:
        study.space.params[name].suggest(orphan, name)
    assert reconcile(study, storage, "s", pd.DataFrame()).retried == [orphan.number]
    seen = set()
    for _ in range(4):
        trial, params = ask_distinct(ostudy, study.space)
        seen.add(tuple(sorted(params.items())))
        tell(ostudy, trial, [1.0] * len(study.directions))
    assert len(seen) == 4
