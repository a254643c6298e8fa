"""Model directories built locally, with no hub download.

``make_model_dir`` writes a Hugging Face model directory from a catalog shape (or
any ``config.json``): the config, a tokenizer built with the ``tokenizers`` library
whose vocabulary size equals the config's, a chat template, and either no weights
(for vLLM's ``load_format="dummy"``: random weights of the real shape) or tiny
random weights saved as safetensors (small models only).

The tokenizer is word-level: the word ``t123`` is token 123, words are split on
whitespace, and the last ids are special tokens. A prompt of N such words is
exactly N tokens, so workloads control prompt lengths exactly on any model.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal, Optional

from orchestrator.models import training
from orchestrator.models.shapes import ModelShape, find_model_config

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% if not loop.last %} {% endif %}{% endfor %}"
)
TOKENIZER_SUBDIR = "tokenizer"
# Random weights are for small test models; a real shape should use load_format=dummy.
MAX_RANDOM_WEIGHT_PARAMS = 200_000_000


def special_token_count(vocab_size: int) -> int:
    return max(4, min(256, vocab_size // 16))


def build_tokenizer(vocab_size: int):
    """WordLevel tokenizer: ``t{i}`` for ordinary ids, special tokens at the top of the vocabulary."""
    # deferred: tokenizers is optional (the [train] and [cpu] extras)
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    n_special = special_token_count(vocab_size)
    first_special = vocab_size - n_special
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "[UNK]"] + [
        f"<|reserved_special_token_{i}|>" for i in range(n_special - 3)]
    vocab = {f"t{i}": i for i in range(first_special)}
    for j, s in enumerate(specials):
        vocab[s] = first_special + j
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"tokenizer has {tok.get_vocab_size()} ids, config says {vocab_size}")
    return tok, specials, first_special


def model_config(shape: str, *, max_position_embeddings: Optional[int] = None, recipe=None,
                 base_dir: Optional[Path] = None) -> dict:
    """The ``config.json`` a model directory of ``shape`` gets: the tokenizer's special token ids,
    an optional context length, and a training recipe's architecture overrides."""
    src = find_model_config(shape, base_dir)
    config = json.loads(Path(src).read_text())
    if recipe is not None:
        config = training.apply_arch(config, recipe)
    first_special = ModelShape.from_config(config, name=Path(src).stem).vocab_size
    first_special -= special_token_count(first_special)
    config["bos_token_id"], config["eos_token_id"] = first_special, first_special + 1
    config.pop("pad_token_id", None)
    if max_position_embeddings:
        config["max_position_embeddings"] = int(max_position_embeddings)
        config.pop("rope_scaling", None)
    return config


def make_model_dir(shape: str, out_dir: str | Path, *, weights: Literal["none", "random", "trained"] = "none",
                   max_position_embeddings: Optional[int] = None, seed: int = 0, force: bool = False,
                   base_dir: Optional[Path] = None, recipe="tiny", log=print) -> Path:
    """Write the model directory; returns its path. ``base_dir``: where a relative config path
    starts (the study file's folder, ``Study.base_dir``). ``recipe``: the training recipe of
    ``weights="trained"`` (a name in :data:`orchestrator.models.training.RECIPES` or a Recipe); a
    directory that already holds that recipe's weights is kept as it is."""
    trained = None
    if weights == "trained":
        trained = training.get_recipe(recipe)
    config = model_config(shape, max_position_embeddings=max_position_embeddings, recipe=trained,
                          base_dir=base_dir)
    shape_info = ModelShape.from_config(config, name=shape)
    out = Path(out_dir)
    if trained is None:
        return _write_model_dir(out, config, shape_info, weights, seed, force, None, log)
    digest = training.recipe_hash(config, trained)
    if shape_info.num_params > training.MAX_TRAINED_PARAMS:
        raise ValueError(f"{shape} with recipe {trained.name} has {shape_info.num_params / 1e9:.1f} B parameters; "
                         f"training is for models of at most {training.MAX_TRAINED_PARAMS / 1e6:.0f} M")
    # Two studies (or trials) asking for the same model at once: one trains, the other waits and finds it.
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out / ".make-model.lock"):
        if training.is_trained(out, digest):
            log(f"{out}: already trained by recipe {trained.name} ({digest})")
            return out
        return _write_model_dir(out, config, shape_info, weights, seed, force, (trained, digest), log)


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if missing) while the block runs."""
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_model_dir(out: Path, config: dict, shape_info: ModelShape, weights: str, seed: int, force: bool,
                     trained: Optional[tuple[training.Recipe, str]], log) -> Path:
    out.mkdir(parents=True, exist_ok=True)

    tok, specials, _ = build_tokenizer(shape_info.vocab_size)
    bos, eos = config["bos_token_id"], config["eos_token_id"]
    max_len = int(config.get("max_position_embeddings", 4096))

    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos}) + "\n")
    # The tokenizer also goes into tokenizer/, beside a stub llama config: transformers picks a
    # tokenizer class by the model type, and some (qwen2) rebuild the pipeline and break a
    # word-level vocabulary. Engines point their tokenizer there (TOKENIZER_SUBDIR).
    for target in (out, out / TOKENIZER_SUBDIR):
        target.mkdir(exist_ok=True)
        _write_tokenizer(target, tok, specials, max_len)
    (out / TOKENIZER_SUBDIR / "config.json").write_text(json.dumps(
        {"model_type": "llama", "vocab_size": shape_info.vocab_size, "bos_token_id": bos, "eos_token_id": eos}) + "\n")

    if weights == "random":
        if shape_info.num_params > MAX_RANDOM_WEIGHT_PARAMS and not force:
            raise ValueError(f"{shape_info.name} has {shape_info.num_params / 1e9:.1f} B parameters; random weights "
                             "are for small test models (use weights='none' and load_format=dummy, or force=True)")
        _write_random_weights(out, seed)
    elif trained is not None:
        recipe, digest = trained
        (out / training.TRAINING_FILE).unlink(missing_ok=True)  # a half-written directory is trained again
        training.train(out, recipe, digest, log)
        _keep_token_ids(out, bos, eos)
    return out


def _write_tokenizer(target: Path, tok, specials: list[str], max_len: int) -> None:
    tok.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": specials[0], "eos_token": specials[1],
        "unk_token": "[UNK]", "pad_token": specials[1], "model_max_length": max_len,
        "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    (target / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": specials[0], "eos_token": specials[1], "unk_token": "[UNK]", "pad_token": specials[1]}) + "\n")


def tokenizer_dir(model_dir: str | Path) -> Optional[Path]:
    """The generated tokenizer of ``model_dir`` (None for other model directories)."""
    path = Path(model_dir) / TOKENIZER_SUBDIR
    return path if (path / "tokenizer.json").is_file() else None


def _write_random_weights(out: Path, seed: int) -> None:
    # deferred: torch and transformers are optional (the [train] extra) and take seconds to import
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, str(cfg.torch_dtype).replace(
        "torch.", "")) if getattr(cfg, "torch_dtype", None) else None)
    model.save_pretrained(str(out), safe_serialization=True)
    _keep_token_ids(out, cfg.bos_token_id, cfg.eos_token_id)


def _keep_token_ids(out: Path, bos: int, eos: int) -> None:
    """save_pretrained rewrites config.json; keep our token ids."""
    data = json.loads((out / "config.json").read_text())
    data["bos_token_id"], data["eos_token_id"] = bos, eos
    (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def model_cache_root() -> Path:
    """Where :func:`trained_model_dir` keeps trained models (``$ORCHESTRATOR_MODEL_CACHE``)."""
    return Path(os.environ.get("ORCHESTRATOR_MODEL_CACHE", Path.home() / ".cache" / "orchestrator" / "models"))


def trained_model_dir(shape: str, recipe="tiny", root: Optional[Path] = None, base_dir: Optional[Path] = None,
                      log=print) -> Path:
    """The trained model of ``shape`` and ``recipe`` under ``root`` (default: :func:`model_cache_root`),
    in a directory named by the recipe hash: trained once, then found."""
    recipe = training.get_recipe(recipe)
    digest = training.recipe_hash(model_config(shape, recipe=recipe, base_dir=base_dir), recipe)
    name = f"{Path(shape).name.removesuffix('.json')}-{recipe.name}-{digest}"
    return make_model_dir(shape, (root or model_cache_root()) / name, weights="trained", recipe=recipe,
                          base_dir=base_dir, log=log)
