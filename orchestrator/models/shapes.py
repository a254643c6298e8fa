"""Model shapes read from Hugging Face ``config.json`` files.

The catalog is ``search_spaces/models/<name>.json``; a study may also name any
``config.json`` path. Only the shape matters here: parameter count, bytes per
token of KV cache, FLOPs per token.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "int8": 1, "int4": 0.5}

# Bits per weight of the quantised linear layers, by vLLM quantization method.
QUANT_WEIGHT_BITS = {None: None, "fp8": 8, "modelopt": 8, "experts_int8": 8, "awq": 4, "awq_marlin": 4,
                     "gptq": 4, "gptq_marlin": 4, "bitsandbytes": 4, "compressed-tensors": 8}


def catalog_dirs() -> list[Path]:
    """Where catalog names are looked up: $ORCHESTRATOR_MODELS, ./search_spaces/models, the repo's."""
    dirs = []
    if os.environ.get("ORCHESTRATOR_MODELS"):
        dirs.append(Path(os.environ["ORCHESTRATOR_MODELS"]))
    dirs.append(Path.cwd() / "search_spaces" / "models")
    dirs.append(Path(__file__).resolve().parents[2] / "search_spaces" / "models")
    return dirs


def catalog_names() -> list[str]:
    names: set[str] = set()
    for d in catalog_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.json"))
    return sorted(names)


def find_model_config(name_or_path: str, base_dir: Optional[Path] = None) -> Path:
    """Resolve a catalog name or a path (a ``config.json`` or a directory holding one)."""
    candidates = []
    p = Path(name_or_path)
    if base_dir is not None and not p.is_absolute():
        candidates.append(base_dir / p)
    candidates.append(p)
    for c in candidates:
        if c.is_dir() and (c / "config.json").is_file():
            return c / "config.json"
        if c.is_file():
            return c
    for d in catalog_dirs():
        f = d / f"{name_or_path}.json"
        if f.is_file():
            return f
    names = catalog_names()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise FileNotFoundError(
        f"no model {name_or_path!r}{hint}: not a config.json path and not in the catalog ({', '.join(names)})")


@dataclass(frozen=True)
class ModelShape:
    name: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"

    @classmethod
    def from_config(cls, cfg: dict, name: str = "model") -> "ModelShape":
        text = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM here
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        return cls(
            name=name,
            architecture=(cfg.get("architectures") or ["unknown"])[0],
            hidden_size=hidden,
            num_layers=int(text["num_hidden_layers"]),
            num_attention_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads),
            intermediate_size=int(text["intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            torch_dtype=str(text.get("torch_dtype") or cfg.get("torch_dtype") or "bfloat16"),
        )

    @classmethod
    def load(cls, name_or_path: str, base_dir: Optional[Path] = None) -> "ModelShape":
        path = find_model_config(name_or_path, base_dir)
        with open(path) as f:
            cfg = json.load(f)
        name = path.stem if path.name != "config.json" else path.parent.name
        return cls.from_config(cfg, name=name)

    # ---- parameter counts
    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_attention_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * self.hidden_size
        return q + kv + o

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    @property
    def linear_params(self) -> int:
        """Parameters in the transformer blocks' matmuls (what quantization shrinks)."""
        return self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer)

    @property
    def embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    @property
    def num_params(self) -> int:
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.linear_params + self.embedding_params + norms

    def weight_bytes(self, dtype_bytes: float = 2, quantization: Optional[str] = None) -> float:
        """Bytes of weights for the whole model (all ranks)."""
        bits = QUANT_WEIGHT_BITS.get(quantization)
        linear_bytes = self.linear_params * (bits / 8 if bits else dtype_bytes)
        if bits and bits < 8:
            linear_bytes *= 1.03  # group scales / zeros
        return linear_bytes + (self.num_params - self.linear_params) * dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2, tp: int = 1) -> float:
        """KV-cache bytes per token on one TP rank (all layers), as vLLM's page size."""
        kv_heads = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads * self.head_dim * kv_dtype_bytes

    def flops_per_token(self, context_len: int = 0) -> float:
        """Forward FLOPs for one token: 2 x matmul params + attention over ``context_len``."""
        attn = 4 * self.num_layers * self.num_attention_heads * self.head_dim * context_len
        lm_head = 2 * self.vocab_size * self.hidden_size
        return 2 * self.linear_params + attn + lm_head
