"""Learned weights, made here: ``make-model --weights trained`` trains a small causal LM.

Random weights give a flat next-token distribution (every chosen logprob is -ln(vocab)), so
greedy answers never move and quality probes read 1.0 whatever a setting does. A model
trained on the generated grammar (:mod:`orchestrator.models.corpus`) predicts: its distributions
are peaked and depend on the input, so fp8 weights, an fp8 KV cache or a lower dtype show
up as token disagreement, logprob drift and held-out perplexity, and speculative decoding
has something to accept.

A :class:`Recipe` fixes everything that decides the weights (architecture overrides, steps,
batch, learning rate, seed, threads, device): the same recipe on the same software stack
writes the same ``model.safetensors`` bytes. ``training.json`` beside the weights records
the recipe, its hash, the corpus hash, the seconds it took and the held-out perplexity; a
directory whose ``training.json`` has the recipe's hash is not trained again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from orchestrator.models.corpus import Grammar, corpus_hash, heldout_sequences, training_sequences

TRAINING_FILE = "training.json"
# Bump when the corpus or the training loop changes what a recipe produces.
TRAINING_VERSION = 1
# Training is for small models: a full-size shape would take days.
MAX_TRAINED_PARAMS = 400_000_000


@dataclass(frozen=True)
class Recipe:
    name: str
    steps: int
    batch: int
    seq_len: int
    lr: float
    warmup: int = 20
    seed: int = 0
    threads: int = 2  # CPU threads: the reduction order, hence the bytes, depend on it
    device: str = "cpu"  # cpu | cuda | auto (cuda when available)
    grammar_seed: int = 0
    # config.json fields set over the shape's (a larger model of the same vocabulary)
    arch: dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be cpu, cuda or auto, not {self.device!r}")
        if min(self.steps, self.batch, self.seq_len) < 1 or not self.lr > 0:
            raise ValueError("steps, batch and seq_len must be >= 1 and lr > 0")

    def as_dict(self) -> dict:
        return asdict(self)


RECIPES: dict[str, Recipe] = {
    # A few million parameters (tiny-llama): about two minutes on two CPU cores.
    "tiny": Recipe("tiny", steps=150, batch=16, seq_len=96, lr=4e-3, warmup=15),
    # ~103 M parameters (tiny-llama's vocabulary, 8 layers of 1024): 93 s on one H200.
    "base": Recipe("base", steps=1500, batch=32, seq_len=512, lr=6e-4, warmup=100, device="auto",
                   arch={"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
                         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64}),
}


def get_recipe(name_or_recipe) -> Recipe:
    if isinstance(name_or_recipe, Recipe):
        return name_or_recipe
    try:
        return RECIPES[name_or_recipe]
    except KeyError:
        raise ValueError(f"no training recipe {name_or_recipe!r} (known: {', '.join(RECIPES)})") from None


def apply_arch(config: dict, recipe: Recipe) -> dict:
    """The shape's config with the recipe's architecture overrides."""
    return {**config, **recipe.arch}


def recipe_hash(config: dict, recipe: Recipe) -> str:
    """Names what decides the weights: the model config, the recipe, the training version."""
    blob = json.dumps({"config": config, "recipe": recipe.as_dict(), "version": TRAINING_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def is_trained(out: Path, digest: str) -> bool:
    """Whether ``out`` already holds the weights of the recipe named by ``digest``."""
    try:
        record = json.loads((out / TRAINING_FILE).read_text())
    except (OSError, ValueError):
        return False
    return record.get("recipe_hash") == digest and (out / "model.safetensors").is_file()


def _lr(recipe: Recipe, step: int) -> float:
    """Linear warm-up, then cosine down to a tenth."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    frac = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    return recipe.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def train(out: Path, recipe: Recipe, digest: str, log: Callable[[str], None] = print) -> dict:
    """Train the model whose ``config.json`` is in ``out``; write ``model.safetensors`` and
    ``training.json`` there. Returns the training record."""
    # deferred: torch and transformers are optional (the [train] extra) and take seconds to import
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(out))
    device = recipe.device if recipe.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"recipe {recipe.name} trains on CUDA, and torch sees no CUDA device here")
    if device == "cuda":  # cuBLAS is deterministic only with a fixed workspace, set before its first call
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # the tokenizer's special tokens start at bos (orchestrator.models.modelgen.model_config): never emitted
    grammar = Grammar(cfg.vocab_size, cfg.bos_token_id, recipe.grammar_seed)
    x, ok = training_sequences(grammar, recipe.steps * recipe.batch, recipe.seq_len + 1, recipe.seed)
    heldout = heldout_sequences(grammar)
    labels = np.where(ok, x, -100)  # jump targets: nothing predicts them

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # On CUDA the fused attention kernels' backward passes accumulate with atomics: two runs of one
    # recipe wrote different bytes on an H100 (docs/trained-models.md). The math kernel is exact.
    math_attention = nullcontext()
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        math_attention = sdpa_kernel(SDPBackend.MATH)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            torch.manual_seed(recipe.seed)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device)
            params = sum(p.numel() for p in model.parameters())
            opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
            data, targets = torch.from_numpy(x), torch.from_numpy(labels)
            autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda")
            losses: list[float] = []
            t0, cpu0 = time.perf_counter(), time.process_time()
            model.train()
            with math_attention:  # forward and backward passes alike
                for step in range(recipe.steps):
                    rows = slice(step * recipe.batch, (step + 1) * recipe.batch)
                    for group in opt.param_groups:
                        group["lr"] = _lr(recipe, step)
                    with autocast:
                        loss = model(input_ids=data[rows].to(device), labels=targets[rows].to(device)).loss
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    losses.append(float(loss.detach()))
                    if step % max(1, recipe.steps // 8) == 0 or step == recipe.steps - 1:
                        log(f"step {step + 1}/{recipe.steps}: loss {losses[-1]:.3f}")
            # wall seconds, and CPU seconds of this process (what a busy machine does not inflate)
            seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
            model.eval()
            with torch.no_grad():
                ids = torch.from_numpy(heldout).to(device)
                heldout_loss = float(model(input_ids=ids, labels=ids).loss)
            model.to("cpu").save_pretrained(str(out), safe_serialization=True)
        finally:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic)
    # What torch reported as non-deterministic while training: empty where the bytes can repeat.
    determinism_warnings = sorted({str(w.message).splitlines()[0][:200] for w in seen
                                   if "determinis" in str(w.message)})

    record = {
        "recipe": recipe.as_dict(), "recipe_hash": digest, "training_version": TRAINING_VERSION,
        "grammar": grammar.as_dict(), "corpus_hash": corpus_hash(x, ok, heldout),
        "train_tokens": int(x.size), "heldout_tokens": int(heldout.size), "params": int(params),
        "steps": recipe.steps, "device": device, "threads": recipe.threads,
        "seconds": round(seconds, 2), "cpu_seconds": round(cpu_seconds, 2),
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
        "heldout_perplexity": round(math.exp(heldout_loss), 4),
        # the grammar's floor is above 1; a flat model reads about the vocabulary size
        "uniform_perplexity": int(cfg.vocab_size),
        "determinism_warnings": determinism_warnings,
        "load_average": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
    }
    (out / TRAINING_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    log(f"trained {recipe.name} ({params / 1e6:.1f} M parameters, {device}) in {seconds:.1f} s "
        f"({cpu_seconds:.1f} CPU s): "
        f"held-out perplexity {record['heldout_perplexity']:.3f} (uniform: {cfg.vocab_size})")
    return record

