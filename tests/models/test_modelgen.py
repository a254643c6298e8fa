"""Model directories without downloads: vocabulary matches the config, exact prompt lengths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from orchestrator.models.modelgen import make_model_dir
from orchestrator.models.shapes import ModelShape


@pytest.mark.parametrize("shape", ["tiny-llama", "llama-3.1-8b", "qwen2.5-7b"])
def test_tokenizer_matches_config_vocab(tmp_path, shape):
    import transformers

    out = make_model_dir(shape, tmp_path / shape)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == ModelShape.load(shape).vocab_size
    tok = transformers.AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert len(tok) == cfg["vocab_size"]
    words = " ".join(f"t{i}" for i in range(100, 612))
    ids = tok(words)["input_ids"]
    assert ids == list(range(100, 612))  # one word, one token, no special tokens added
    chat = tok.apply_chat_template([{"role": "user", "content": words}], tokenize=True)
    chat_ids = chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat
    assert len(chat_ids) == 512
    assert cfg["eos_token_id"] == tok.eos_token_id and cfg["bos_token_id"] == tok.bos_token_id
    assert not (out / "model.safetensors").exists()


def test_random_weights_for_small_models_only(tmp_path):
    out = make_model_dir("tiny-llama", tmp_path / "tiny", weights="random")
    assert (out / "model.safetensors").stat().st_size > 1_000_000
    with pytest.raises(ValueError, match="load_format=dummy"):
        make_model_dir("llama-3.1-8b", tmp_path / "big", weights="random")


def test_make_model_cli_errors_cleanly(tmp_path):
    r = subprocess.run([sys.executable, "-m", "orchestrator", "make-model", "llama-9b", str(tmp_path / "x")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no model 'llama-9b'" in r.stderr and "llama-3.1-8b" in r.stderr
