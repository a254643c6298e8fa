"""Speculative decoding (n-gram lookup or a draft model) as searchable knobs: the engine arguments
it becomes, what vLLM refuses, and the acceptance columns read from the engine's counters over a
window. vLLM's own parser reads the speculative config back from a recommended command in
tests/apps/test_recommend.py; test_vllm_cpu_trained.py runs both methods on vLLM."""

from __future__ import annotations

import json

import pytest

from orchestrator.hardware.engine_args import EngineArgs, engine_args_from_params, validate_engine_arg, vllm_refusal
from orchestrator.measure.engine_window import engine_snapshot, engine_window_metrics
from orchestrator.measure.metrics import ENGINE_WINDOW_METRIC_NAMES, default_direction
from orchestrator.measure.prometheus_text import iter_samples
from orchestrator.study.spec import parse_study


def test_three_knobs_become_one_speculative_config():
    args = engine_args_from_params({"num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2})
    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    assert args.to_engine_kwargs()["speculative_config"] == config
    assert not {"num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"} & set(args.explicit())
    words = args.to_cli_args()
    assert json.loads(words[words.index("--speculative-config") + 1]) == config
    # Off by default and at 0: no speculative_config at all (the lookup bounds alone do nothing).
    assert "speculative_config" not in EngineArgs().explicit()
    assert "speculative_config" not in EngineArgs(prompt_lookup_max=3).explicit()
    assert EngineArgs(num_speculative_tokens=2).speculative_config() == {"method": "ngram", "num_speculative_tokens": 2}


def test_a_draft_model_replaces_the_prompt_lookup():
    args = engine_args_from_params({"num_speculative_tokens": 3, "speculative_model": "/models/draft",
                                    "prompt_lookup_max": 3, "prompt_lookup_min": 2})
    config = {"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 3}
    assert args.to_engine_kwargs()["speculative_config"] == config  # the lookup bounds are n-gram's only
    assert "speculative_model" not in args.explicit()
    words = args.to_cli_args()
    assert json.loads(words[words.index("--speculative-config") + 1]) == config
    assert "speculative_config" not in EngineArgs(speculative_model="/models/draft").explicit()  # 0 tokens: off
    # The lookup bounds are not checked for a draft model, which ignores them.
    base = dict(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=1024)
    assert vllm_refusal(EngineArgs(**base, num_speculative_tokens=3, speculative_model="/models/draft",
                                   prompt_lookup_min=4, prompt_lookup_max=2)) is None


def test_a_draft_model_is_searched_against_the_lookup(study_doc):
    study_doc["space"] = {"num_speculative_tokens": 3, "speculative_model": [None, "/models/draft"]}
    study = parse_study(study_doc)
    assert [p["speculative_model"] for p in study.space.grid()] == [None, "/models/draft"]
    assert study.space.column_types()["speculative_model"] == "string"
    for bad in (3, "", ["/models/draft", 7]):
        study_doc["space"] = {"speculative_model": bad}
        with pytest.raises(Exception, match="speculative_model.*a model directory or name, or null"):
            parse_study(study_doc)


def test_what_vllm_refuses():
    assert validate_engine_arg("num_speculative_tokens", 17) and validate_engine_arg("prompt_lookup_min", 0)
    base = dict(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=1024)
    assert vllm_refusal(EngineArgs(**base, num_speculative_tokens=3, prompt_lookup_min=4, prompt_lookup_max=2)) == (
        "prompt_lookup_min=4 must be <= prompt_lookup_max=2")  # vLLM's SpeculativeConfig, word for word
    assert vllm_refusal(EngineArgs(**base, num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=4)) is None


def test_the_knobs_are_searchable_in_a_study(study_doc):
    study_doc["space"] = {"num_speculative_tokens": [0, 2, 4], "prompt_lookup_max": {"type": "int", "low": 1,
                                                                                       "high": 5}}
    study = parse_study(study_doc)
    assert set(study.space.params) == {"num_speculative_tokens", "prompt_lookup_max"}
    study_doc["space"] = {"num_speculative_tokens": [0, 32]}
    with pytest.raises(Exception, match="num_speculative_tokens"):
        parse_study(study_doc)


def _counters(drafts: float, drafted: float, accepted: float, tokens: float) -> str:
    lab = 'model_name="m",engine="0"'
    return "".join(f"# TYPE vllm:{n} counter\nvllm:{n}_total{{{lab}}} {v}\n" for n, v in (
        ("spec_decode_num_drafts", drafts), ("spec_decode_num_draft_tokens", drafted),
        ("spec_decode_num_accepted_tokens", accepted), ("generation_tokens", tokens)))


def _snap(text: str, t: float):
    return engine_snapshot(iter_samples(text, {"model_name": "m"}, "vllm:"), "vllm:", t)


def test_acceptance_over_the_window_from_the_engines_counters():
    start, end = _snap(_counters(10, 40, 20, 100), 0.0), _snap(_counters(60, 240, 170, 500), 2.0)
    cols = engine_window_metrics(start, end)
    # In the window: 50 proposals of 200 tokens, 150 accepted.
    assert cols["engine_spec_acceptance_rate"] == pytest.approx(150 / 200)
    assert cols["engine_spec_accepted_per_draft"] == pytest.approx(150 / 50)
    assert cols["engine_spec_token_share"] == pytest.approx(150 / 400)  # of the window's 400 output tokens
    assert {"engine_spec_acceptance_rate", "engine_spec_accepted_per_draft",
            "engine_spec_token_share"} <= set(ENGINE_WINDOW_METRIC_NAMES)
    assert default_direction("engine_spec_acceptance_rate") == "maximize"
    assert default_direction("engine_spec_token_share") == "maximize"
    # Without speculation vLLM exports no such counters: null, not 0.
    plain = 'vllm:generation_tokens_total{model_name="m",engine="0"} 5\n'
    none = engine_window_metrics(_snap(plain, 0.0), _snap(plain.replace(" 5", " 9"), 1.0))
    assert none["engine_spec_acceptance_rate"] is None and none["engine_spec_accepted_per_draft"] is None
    assert none["engine_spec_token_share"] is None
    # A counter that went down (the engine restarted): null.
    assert engine_window_metrics(end, start)["engine_spec_acceptance_rate"] is None
