"""The reference-agreement probe on real vLLM (the CPU build), through Tune, Serve and the results writer.

Two trials of a tiny random model, the baseline named in the study file (``dtype: float32``):
* the baseline agrees with itself exactly (agreement 1.0, logprob difference 0);
* ``dtype: bfloat16`` changes the numerics: lower agreement, non-zero logprob differences;
* the SLO ``token_agreement >= 0.99`` is judged like any SLO: the baseline is feasible, the
  bfloat16 trial is not, and the sampler was told so (its constraint value > 0);
* the answers are kept beside the results, the baseline's as the reference.
"""

from __future__ import annotations

import json

import pytest

from conftest import local_ray
from support.vllm_processes import own_caches

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KV_BYTES = 8 * 2**20


def test_probe_agreement_on_cpu_vllm(tmp_path, monkeypatch):
    import optuna

    from orchestrator.models.modelgen import make_model_dir
    from orchestrator.results import load_trials
    from orchestrator.search import local_state_dir, optuna_storage, optuna_study_name, run_study
    from orchestrator.study.spec import parse_study

    caches = own_caches(monkeypatch, tmp_path / "cache")
    model_dir = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights="random")
    study = parse_study({
        "name": "cpu-probe",
        "engine": {"kind": "vllm", "platform": "cpu", "model_source": str(model_dir), "start_timeout_s": 600,
                   "engine_kwargs": {"kv_cache_memory_bytes": KV_BYTES}},
        "model": {"name": "tiny-llama", "dtype": "float32"},
        "hardware": {"gpu": "CPU"},
        "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 8, "warmup_requests": 1,
                     "input_len": 64, "output_len": 8, "timeout_s": 60},
        "space": {"dtype": ["float32", "bfloat16"], "max_model_len": 1024, "enforce_eager": True},
        "objectives": ["maximize output_throughput"],
        "constraints": ["token_agreement >= 0.99"],
        "probe": {"prompts": 64, "max_input_tokens": 128, "output_tokens": 16, "baseline": {"dtype": "float32"}},
        "search": {"sampler": "random", "initial_points": [{"dtype": "bfloat16"}, {"dtype": "float32"}],
                   "preflight": False},
        "budget": {"trials": 2, "max_concurrent_trials": 1},
        "output": str(tmp_path / "out"),
    })
    with local_ray(caches):
        run = run_study(study, quiet=True, serve_port=8133)

    trials = load_trials(run.study_dir).set_index("dtype")
    assert set(trials.index) == {"float32", "bfloat16"}
    assert (trials["status"] == "completed").all(), trials[["status", "failure_message"]]
    base, bf16 = trials.loc["float32"], trials.loc["bfloat16"]
    # The baseline ran first (the study enqueues it ahead of the initial points) and is its own reference.
    assert base["trial_number"] == 0 and base["probe_baseline"] == base["trial_id"]
    assert base["token_agreement"] == 1.0 and base["prefix_agreement"] == 1.0
    assert base["logprob_diff_mean"] == 0.0 and base["first_divergence_mean"] == 16
    assert bf16["probe_baseline"] == base["trial_id"] and bf16["probe_reference"] == "weights"
    assert bf16["token_agreement"] < 1.0 and bf16["prefix_agreement"] <= bf16["token_agreement"]
    assert bf16["logprob_diff_mean"] > 0 and bf16["logprob_diff_p95"] >= bf16["logprob_diff_mean"]
    assert bf16["first_divergence_mean"] < 16
    assert base["probe_s"] > 0 and bf16["probe_s"] > 0
    # The SLO on agreement decides feasibility, for the rows and for the sampler.
    assert bool(base["feasible"]) and not bool(bf16["feasible"])
    ostudy = optuna.load_study(study_name=optuna_study_name(study), storage=optuna_storage(local_state_dir(study)))
    told = {t.params.get("dtype"): t.constraints for t in ostudy.get_trials()}
    assert max(told["float32"].values()) <= 0 < max(told["bfloat16"].values())
    # Every trial's answers are kept; the baseline's are the reference.
    (probe_set,) = (tmp_path / "out" / "cpu-probe" / "probe").iterdir()
    reference = json.loads((probe_set / "baseline.json").read_text())
    assert reference["trial_id"] == base["trial_id"] and len(reference["answers"]) == 64
    assert {p.stem for p in probe_set.glob("*.json")} == {"baseline", base["trial_id"], bf16["trial_id"]}
