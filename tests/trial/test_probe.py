"""The probe's comparison, its study section, its SLOs, and the quantization pre-flight."""

from __future__ import annotations

import json

import pytest

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.results.probe_store import ProbeStore
from orchestrator.study.judge import judge
from orchestrator.study.probe import ProbeSpec
from orchestrator.study.spec import StudyFileError, parse_study
from orchestrator.trial.probe import ProbeAnswer, compare, is_baseline, probe_fingerprint, probe_prompts


def _a(tokens, logprobs=None):
    return ProbeAnswer(tuple(tokens), tuple(logprobs if logprobs is not None else [-1.0] * len(tokens)))


def test_compare_against_itself_is_full_agreement():
    ref = [_a("abcd", [-0.5, -1, -2, -0.1]), _a("xyz", [-3, -2, -1])]
    got = compare(ref, ref)
    assert got == {"token_agreement": 1.0, "prefix_agreement": 1.0, "logprob_diff_mean": 0.0,
                   "logprob_diff_p95": 0.0, "first_divergence_mean": 3.5, "divergence_gap_max": None}


def test_compare_counts_divergence_and_logprobs_before_it():
    ref = [_a("abcd", [-1, -1, -1, -1]), _a("wxyz", [-1, -1, -1, -1])]
    got = [_a("abXd", [-1.5, -1, -9, -1]), _a("wxyz", [-1, -1.25, -1, -1])]
    out = compare(ref, got)
    assert out["token_agreement"] == 7 / 8  # position 2 of the first prompt differs; the rest match
    assert out["prefix_agreement"] == (2 + 4) / 8  # the first prompt agrees up to position 2 only
    assert out["first_divergence_mean"] == (2 + 4) / 2
    # |differences| before each divergence: 0.5, 0 (prompt 1), 0, 0.25, 0, 0 (prompt 2); position 2 of
    # prompt 1 and after are not compared (the contexts differ there).
    assert out["logprob_diff_mean"] == pytest.approx(0.75 / 6)
    # At the divergence itself: the baseline's token at -1, the trial's own (another) token at -9.
    assert out["divergence_gap_max"] == pytest.approx(8.0)


def test_the_divergence_gap_tells_a_near_tie_from_a_replaced_token():
    ref = [_a("abcd", [-0.1, -0.1, -0.69, -0.1]), _a("wxyz", [-0.1, -0.1, -0.1, -0.1])]
    tie = compare(ref, [_a("abXd", [-0.1, -0.1, -0.70, -0.1]), _a("wxyz", [-0.1] * 4)])
    assert tie["divergence_gap_max"] == pytest.approx(0.01)  # two tokens near p = 0.5 swapped places
    replaced = compare(ref, [_a("abcd", [-0.1] * 4), _a("wxYz", [-0.1, -0.1, -4.0, -0.1])])
    assert replaced["divergence_gap_max"] == pytest.approx(3.9)  # a confident token lost to an unlikely one
    assert tie["token_agreement"] == replaced["token_agreement"]  # agreement alone cannot tell them apart


def test_a_failed_request_is_an_empty_answer():
    ref = [_a("abcd"), _a("wxyz")]
    out = compare(ref, [_a("abcd"), ProbeAnswer(error="HTTP 500")])
    assert out["token_agreement"] == 0.5 and out["prefix_agreement"] == 0.5
    assert out["first_divergence_mean"] == 2.0


def test_probe_set_is_seeded_and_mixed():
    spec = ProbeSpec(min_input_tokens=8, max_input_tokens=300)
    a, b = probe_prompts(spec, 4096, seed=3), probe_prompts(spec, 4096, seed=3)
    assert a == b and probe_fingerprint(a) == probe_fingerprint(b)
    assert probe_fingerprint(a) != probe_fingerprint(probe_prompts(spec, 4096, seed=4))
    lengths = [len(p.token_ids) for p in a]
    assert len(a) == 64 and min(lengths) >= 8 and max(lengths) <= 300
    assert min(lengths) < 30 and max(lengths) > 100  # log-uniform: short and long prompts both
    assert all(10 <= t < 4096 - 10 for p in a for t in p.token_ids)


def test_baseline_rule():
    default = ProbeSpec()
    assert is_baseline(default, EngineArgs())
    assert not is_baseline(default, EngineArgs(kv_cache_dtype="fp8"))
    assert not is_baseline(default, EngineArgs(quantization="fp8"))
    named = ProbeSpec(baseline={"dtype": "float32"})
    assert is_baseline(named, EngineArgs(dtype="float32", kv_cache_dtype="fp8"))
    assert not is_baseline(named, EngineArgs(dtype="bfloat16"))


def test_baseline_is_claimed_once_and_kept(tmp_path):
    store = ProbeStore(str(tmp_path), "s")
    early = {"trial_id": "t0", "answers": []}
    assert store.keep("p1", "t0", early, eligible=False) is None  # not a baseline: nothing to compare with
    first = {"trial_id": "t1", "answers": [{"tokens": ["a"], "logprobs": [-1.0], "error": None}]}
    assert store.keep("p1", "t1", first, eligible=True)["trial_id"] == "t1"
    again = ProbeStore(str(tmp_path), "s")  # a resumed run: the same reference
    assert again.keep("p1", "t2", {"trial_id": "t2", "answers": []}, eligible=True)["trial_id"] == "t1"
    assert again.keep("p2", "t3", {"trial_id": "t3", "answers": []}, eligible=True)["trial_id"] == "t3"
    assert json.loads((tmp_path / "s" / "probe" / "p1" / "baseline.json").read_text())["trial_id"] == "t1"
    assert again.answers("p1", "t0") == early


def _vllm_doc(study_doc):
    return {**study_doc, "engine": {"kind": "vllm", "load_format": "dummy"}}


def test_agreement_constraint_steers_the_sampler(study_doc):
    doc = _vllm_doc(study_doc)
    doc["constraints"] = ["token_agreement >= 0.95"]
    doc["probe"] = {}
    study = parse_study(doc)
    ok, drifted, unknown = (judge(study, {"token_agreement": x}, "completed") for x in (0.97, 0.9, None))
    assert ok.feasible and ok.optuna_constraints()["slo0"] <= 0
    assert not drifted.feasible and drifted.optuna_constraints()["slo0"] == pytest.approx(0.05 / 0.95)
    assert not unknown.feasible  # no baseline yet: not known to meet it


def test_probe_metrics_need_a_probe_and_an_engine_with_numerics(study_doc):
    doc = _vllm_doc(study_doc)
    doc["constraints"] = ["token_agreement >= 0.95"]
    with pytest.raises(StudyFileError, match=r"constraints\.0: token_agreement is measured by the probe: add"):
        parse_study(doc)
    sim = {**study_doc, "constraints": ["token_agreement >= 0.95"], "probe": {}}
    with pytest.raises(StudyFileError) as e:
        parse_study(sim)
    text = str(e.value)
    assert "probe: the simulated engine (engine.kind 'sim')" in text
    assert "constraints.0: token_agreement is measured by the probe, which engine.kind 'sim' cannot run" in text


@pytest.mark.parametrize("probe, where", [({"prompts": 10}, "probe.prompts"),
                                          ({"baseline": {"kv_cache_dtype": "fp4"}}, "probe.baseline"),
                                          ({"min_input_tokens": 900, "max_input_tokens": 100}, "probe")])
def test_bad_probe_section(study_doc, probe, where):
    with pytest.raises(StudyFileError, match=rf"{where}"):
        parse_study({**_vllm_doc(study_doc), "probe": probe})


def test_a_probe_is_part_of_what_the_trials_measure(study_doc):
    with_probe = parse_study({**_vllm_doc(study_doc), "probe": {}})
    assert parse_study(_vllm_doc(study_doc)).fingerprint() != with_probe.fingerprint()


@pytest.mark.parametrize("gpu, params, message", [
    ("T4", {"quantization": "experts_int8"},
     "The quantization method experts_int8 is not supported for the current GPU. Minimum capability: 80. "
     "Current capability: 75."),
    ("H200", {"quantization": "awq"}, "Cannot find the config file for awq"),
    ("H200", {"quantization": "fp8", "dtype": "float32"}, "torch.float32 is not supported for quantization method fp8"),
])
def test_quantization_the_device_cannot_run_is_pruned_with_vllms_reason(study_doc, gpu, params, message):
    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.search import feasibility

    study = parse_study({**_vllm_doc(study_doc), "hardware": {"gpu": gpu},
                         "space": {"quantization": [None, "fp8", "awq", "experts_int8"], "dtype": ["auto", "float32"]}})
    verdict = feasibility.check(study, feasibility.resolve_args(study, engine_args_from_params(params)))
    assert not verdict.ok and verdict.kind.value == "invalid_args" and message in verdict.reason
    plain = feasibility.check(study, feasibility.resolve_args(study, engine_args_from_params({})))
    assert plain.ok or plain.kind.value == "weights_oom"  # the unquantized model is refused for memory only


def test_fp8_weights_and_kv_shrink_the_memory_plan():
    from orchestrator.hardware.gpus import get_gpu
    from orchestrator.hardware.memory import plan_memory
    from orchestrator.models.shapes import ModelShape

    model, gpu = ModelShape.load("llama-3.1-8b"), get_gpu("H200")
    from orchestrator.hardware.accelerator import with_device_defaults

    base, fp8w, fp8kv = (plan_memory(model, gpu, with_device_defaults(EngineArgs(max_model_len=8192, **kw), gpu,
                                                                      model_max_len=131072))
                         for kw in ({}, {"quantization": "fp8"}, {"kv_cache_dtype": "fp8"}))
    assert fp8w.weight_bytes_per_gpu < 0.6 * base.weight_bytes_per_gpu
    assert fp8kv.kv_bytes_per_token * 2 == base.kv_bytes_per_token and fp8kv.kv_tokens > 1.9 * base.kv_tokens


def test_the_front_figure_draws_agreement_against_throughput(study_doc):
    import pandas as pd

    from orchestrator.apps.figures import pareto_figure
    from orchestrator.apps.report_tables import axes_metrics, point_categories

    study = parse_study({**_vllm_doc(study_doc), "probe": {}, "constraints": ["token_agreement >= 0.9"]})
    y, xs = axes_metrics(study)
    assert xs[-1] == "token_agreement"
    trials = pd.DataFrame({"trial_number": [0, 1, 2], "status": ["completed"] * 3, "failure_kind": [None] * 3,
                           "output_throughput_per_gpu": [100.0, 130.0, 150.0], "ttft_p99_ms": [90.0, 80.0, 70.0],
                           "tpot_p50_ms": [10.0, 9.0, 8.0], "token_agreement": [1.0, 0.96, 0.7],
                           "feasible": [True, True, False]})
    fig = pareto_figure(trials, point_categories(trials, study), study)
    ax = fig.axes[len(xs) - 1]
    assert ax.get_xlabel() == "token_agreement (higher is better)"
    # The front on these axes: more throughput or more agreement (trial 2 misses the SLO).
    (front,) = [c for c in ax.collections if c.get_label().startswith("front on these axes")]
    assert sorted(map(tuple, front.get_offsets().tolist())) == [(0.96, 130.0), (1.0, 100.0)]


def test_the_noise_floor_is_reported_and_a_guardrail_above_it_is_named(study_doc):
    import pandas as pd

    from orchestrator.commands.common import floor_lines

    study = parse_study({**_vllm_doc(study_doc), "probe": {"concurrency": 8},
                         "constraints": ["token_agreement >= 0.95", "prefix_agreement >= 0.5"]})
    assert study.probe.floor_pass_concurrency() == 1  # another batch composition than the trials'
    assert parse_study({**_vllm_doc(study_doc), "probe": {}}).probe.floor_pass_concurrency() == 8
    rows = pd.DataFrame({"floor_token_agreement": [0.93, 0.93], "floor_logprob_diff_mean": [0.002, 0.002]})
    lines = floor_lines(study, rows)
    assert lines[0].startswith("probe noise floor") and "token_agreement 0.930" in lines[0] and "0.002" in lines[0]
    # Only the guardrail the floor itself fails is named.
    assert len(lines) == 2 and lines[1].strip().startswith("token_agreement >= 0.95 asks for more agreement")
    assert floor_lines(study, rows.assign(floor_token_agreement=1.0)) == [lines[0].replace("0.930", "1.000")]
    assert floor_lines(study, rows.iloc[:0]) == [] and floor_lines(study, pd.DataFrame({"x": [1]})) == []


def test_the_floor_compares_the_baseline_with_its_second_pass():
    from orchestrator.trial.probe import noise_floor

    first = [_a("abcd", [-0.1, -0.1, -0.69, -0.1]), _a("wxyz")]
    same = noise_floor(first, first, 8)
    assert same == {"floor_token_agreement": 1.0, "floor_logprob_diff_mean": 0.0, "floor_divergence_gap_max": None,
                    "concurrency": 8}
    flipped = noise_floor(first, [_a("abXd", [-0.1, -0.1, -0.7, -0.1]), _a("wxyz")], 1)
    assert flipped["floor_token_agreement"] == 7 / 8 and flipped["floor_divergence_gap_max"] == pytest.approx(0.01)
