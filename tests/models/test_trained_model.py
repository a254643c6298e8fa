"""``make-model --weights trained``: the generated corpus, deterministic training, the recipes,
and the probe's held-out perplexity (its texts, its parsing of vLLM's prompt_logprobs, its columns)."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from orchestrator.measure.metrics import PROBE_METRIC_NAMES
from orchestrator.models.corpus import Grammar, corpus_hash, heldout_sequences, training_sequences
from orchestrator.models.modelgen import make_model_dir, model_config, special_token_count, trained_model_dir
from orchestrator.models.shapes import ModelShape
from orchestrator.models.training import RECIPES, Recipe, recipe_hash
from orchestrator.study.probe import ProbeSpec
from orchestrator.trial.probe_perplexity import Scored, perplexity, perplexity_columns, perplexity_texts, score
from orchestrator.workload.tokens import MIN_TOKEN_ID

# Small enough to train twice in a test: what is checked is that the bytes repeat, not quality.
MICRO = Recipe("micro", steps=4, batch=2, seq_len=32, lr=1e-3, warmup=1)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_grammar_text_is_seeded_in_range_and_peaked():
    g = Grammar(4096, 4096 - special_token_count(4096))
    x, ok = training_sequences(g, 64, 129, seed=0)
    again, _ = training_sequences(g, 64, 129, seed=0)
    other, _ = training_sequences(g, 64, 129, seed=1)
    held = heldout_sequences(g)
    assert corpus_hash(x, ok, held) == corpus_hash(again, ok, held) != corpus_hash(other, ok, held)
    assert not any((held[:, :8] == row[:8]).all(axis=1).any() for row in x)  # held out: not a training row
    # Training text jumps anywhere in the workload's id range (masked out of the loss); held-out text never does.
    assert x.min() >= MIN_TOKEN_ID and x.max() < 4096 - MIN_TOKEN_ID and 0.85 < ok[:, 1:].mean() < 0.97
    assert held.min() >= MIN_TOKEN_ID and held.max() < g.ordinary_ids
    # Peaked: the favourite successor's probability is above a half for most ids; some are near-ties.
    _, cum = g.tables()
    assert np.median(cum[:, 0]) > 0.5 and (cum[:, 0] < 0.4).mean() > 0.05


def test_same_recipe_same_bytes_and_a_trained_directory_is_kept(tmp_path):
    a = make_model_dir("tiny-llama", tmp_path / "a", weights="trained", recipe=MICRO, log=lambda _: None)
    b = make_model_dir("tiny-llama", tmp_path / "b", weights="trained", recipe=MICRO, log=lambda _: None)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    c = make_model_dir("tiny-llama", tmp_path / "c", weights="trained", recipe=Recipe(**{**MICRO.as_dict(), "seed": 1}),
                       log=lambda _: None)
    assert _sha(c / "model.safetensors") != _sha(a / "model.safetensors")

    record = json.loads((a / "training.json").read_text())
    assert record["recipe"] == MICRO.as_dict() and record["steps"] == 4 and record["params"] == 3_278_080
    assert record["recipe_hash"] == recipe_hash(model_config("tiny-llama", recipe=MICRO), MICRO)
    assert record["seconds"] > 0 and record["cpu_seconds"] > 0
    assert record["determinism_warnings"] == []  # torch ran no op it calls non-deterministic (same bytes above)
    assert record["train_tokens"] == 4 * 2 * 33
    assert record["heldout_perplexity"] == pytest.approx(_heldout_perplexity(a, MICRO), rel=1e-3)  # the saved model's
    assert record["corpus_hash"] == json.loads((b / "training.json").read_text())["corpus_hash"]
    cfg = json.loads((a / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (3840, 3841)

    said: list[str] = []
    before = (a / "model.safetensors").stat().st_mtime_ns
    make_model_dir("tiny-llama", a, weights="trained", recipe=MICRO, log=said.append)
    assert (a / "model.safetensors").stat().st_mtime_ns == before and "already trained" in said[0]


def test_the_cache_names_the_directory_by_recipe_hash(tmp_path):
    path = trained_model_dir("tiny-llama", MICRO, root=tmp_path, log=lambda _: None)
    digest = json.loads((path / "training.json").read_text())["recipe_hash"]
    assert path == tmp_path / f"tiny-llama-micro-{digest}"
    assert trained_model_dir("tiny-llama", MICRO, root=tmp_path, log=lambda _: None) == path
    assert list(tmp_path.iterdir()) == [path]


def _make_micro(out: str, log_path: str) -> None:
    with open(log_path, "w") as log:
        make_model_dir("tiny-llama", out, weights="trained", recipe=MICRO, log=lambda line: print(line, file=log))


def test_two_processes_asking_for_one_model_at_once_train_it_once(tmp_path):
    """Two studies starting together on one model cache: one trains, the other waits and finds it."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    logs = [tmp_path / f"log{i}" for i in range(2)]
    procs = [ctx.Process(target=_make_micro, args=(str(tmp_path / "m"), str(log))) for log in logs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    said = sorted(log.read_text() for log in logs)
    assert sum("already trained" in text for text in said) == 1, said  # the other one trained
    assert sum("step 4/4" in text for text in said) == 1, said


def test_the_tiny_recipe_model_predicts_and_is_found_again(tiny_trained_model):
    """The tests' trained model (the suite trains it once, in pytest's cache, for the CPU vLLM
    test of the probe): its record, and a second request that finds it instead of training."""
    record = json.loads((tiny_trained_model / "training.json").read_text())
    assert record["recipe"] == RECIPES["tiny"].as_dict() and record["device"] == "cpu"
    assert record["seconds"] > 0 and record["loss_last"] < 0.5 * record["loss_first"]
    assert record["heldout_perplexity"] < 0.01 * record["uniform_perplexity"]  # peaked: far from uniform
    said: list[str] = []
    again = trained_model_dir("tiny-llama", "tiny", root=tiny_trained_model.parent, log=said.append)
    assert again == tiny_trained_model and "already trained" in said[0]


def test_base_recipe_is_over_100m_parameters_and_builds():
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = model_config("tiny-llama", recipe=RECIPES["base"])
    shape = ModelShape.from_config(config, name="base")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**config))
    params = sum(p.numel() for p in model.parameters())
    assert params == shape.num_params and 100e6 <= params <= 150e6
    assert RECIPES["base"].device == "auto" and RECIPES["tiny"].device == "cpu"


def test_unknown_recipe_and_too_large_a_model_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no training recipe 'huge'"):
        make_model_dir("tiny-llama", tmp_path / "x", weights="trained", recipe="huge")
    with pytest.raises(ValueError, match="training is for models of at most"):
        make_model_dir("llama-3.1-8b", tmp_path / "y", weights="trained")
    r = subprocess.run([sys.executable, "-m", "orchestrator", "make-model", "tiny-llama", str(tmp_path / "z"),
                        "--weights", "trained", "--recipe", "huge"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice: 'huge'" in r.stderr


# ---------------------------------------------------------------- held-out perplexity (pure)
def _payload(ids, logprobs):
    """A completions response with prompt_logprobs, as vLLM writes it (keys are token ids as strings)."""
    entries = [None] + [{str(t): {"logprob": lp, "rank": 1, "decoded_token": f"t{t}"}} for t, lp in
                        zip(ids[1:], logprobs)]
    return {"choices": [{"text": "t5", "prompt_logprobs": entries}]}


def test_perplexity_of_prompt_logprobs():
    ids = [11, 12, 13, 14]
    got = score(_payload(ids, [-1.0, -2.0, -3.0]), ids)
    assert got == Scored(6.0, 3)
    assert perplexity([got, Scored(0.0, 3)]) == pytest.approx(math.exp(1.0))
    assert score({"choices": [{"text": ""}]}, ids).error.startswith("the response has no prompt_logprobs")
    assert "token 14" in score(_payload([11, 12, 13, 99], [-1.0, -2.0, -3.0]), ids).error
    cols = perplexity_columns([Scored(6.0, 3)], [Scored(3.0, 3)])
    assert cols["heldout_perplexity"] == pytest.approx(math.exp(2)) and cols["perplexity_delta"] == pytest.approx(
        math.exp(2) - math.exp(1))
    assert perplexity_columns([Scored(error="HTTP 400")], [Scored(3.0, 3)]) == {
        "heldout_perplexity": None, "perplexity_delta": None}
    assert perplexity_columns([Scored(6.0, 3)], None)["perplexity_delta"] is None
    assert {"heldout_perplexity", "perplexity_delta"} <= set(PROBE_METRIC_NAMES)


def test_perplexity_texts_are_the_grammars_heldout_text():
    spec = ProbeSpec(perplexity_sequences=4, perplexity_tokens=64)
    texts = perplexity_texts(spec, 4096)
    assert len(texts) == 4 and {len(t) for t in texts} == {64}
    grammar = Grammar(4096, 4096 - special_token_count(4096))
    assert [list(t) for t in texts] == heldout_sequences(grammar, 4, 64).tolist()
    assert perplexity_texts(ProbeSpec(perplexity_sequences=0), 4096) == []


def _heldout_perplexity(model_dir, recipe: Recipe) -> float:
    """The held-out perplexity of the saved weights, computed again from the files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(model_dir))
    ids = torch.from_numpy(heldout_sequences(Grammar(cfg.vocab_size, cfg.bos_token_id, recipe.grammar_seed)))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return math.exp(float(model(input_ids=ids, labels=ids).loss))
