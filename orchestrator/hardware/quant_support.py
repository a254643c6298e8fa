"""Can the study's GPU (or vLLM's CPU build) and model run a ``quantization`` / ``kv_cache_dtype``?

The pre-flight asks here before any start, so a configuration vLLM would refuse is
``pruned`` with vLLM's own message instead of costing an engine start. The rules and
messages are vLLM's (0.29; 0.26 has the same checks):

* ``VllmConfig._get_quantization_config``: the method's minimum compute capability, and
  the activation dtypes it supports;
* ``ModelConfig._verify_quantization``: a checkpoint format (AWQ, GPTQ, compressed-tensors,
  ModelOpt) needs a checkpoint quantized that way (``quantization_config.quant_method`` in
  its ``config.json``); ``fp8``, ``bitsandbytes`` and ``experts_int8`` quantize at load time;
* the CPU attention backend (``_get_attn_isa``): an fp8 KV cache needs AVX-512 or AMX and a
  head size divisible by 32.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from orchestrator.hardware.gpus import get_gpu

# QuantizationConfig.get_min_capability() of each method.
MIN_CAPABILITY = {"fp8": 75, "awq": 75, "awq_marlin": 75, "gptq": 60, "gptq_marlin": 75, "bitsandbytes": 70,
                  "compressed-tensors": 70, "modelopt": 80, "experts_int8": 80}
# QuantizationConfig.get_supported_act_dtypes() where it leaves float32 out.
HALF_ONLY = {"fp8", "modelopt", "experts_int8", "awq", "awq_marlin", "gptq_marlin"}
# The checkpoint's quant_method each checkpoint format needs (the marlin kernels read the same files).
CHECKPOINT_METHOD = {"awq": "awq", "awq_marlin": "awq", "gptq": "gptq", "gptq_marlin": "gptq",
                     "compressed-tensors": "compressed-tensors", "modelopt": "modelopt"}
_TORCH = {"float32": "torch.float32", "float": "torch.float32", "bfloat16": "torch.bfloat16",
          "float16": "torch.float16", "half": "torch.float16"}


def _capability(gpu: Optional[str]) -> Optional[int]:
    """The catalog GPU's compute capability (None: the CPU build, or a GPU outside the catalog)."""
    if gpu is None:
        return None
    try:
        return get_gpu(gpu).compute_capability
    except KeyError:
        return None


@lru_cache(maxsize=64)
def checkpoint_method(model_dir: Optional[str], config_path: Optional[Path]) -> Optional[str]:
    """``quantization_config.quant_method`` of the model's ``config.json`` (None: not a quantized checkpoint).
    Cached: the survey and the proposal loop ask once per configuration, the file does not change."""
    path = Path(model_dir).expanduser() / "config.json" if model_dir else config_path
    try:
        cfg = json.loads(Path(path).read_text()) if path is not None else {}
    except (OSError, ValueError):
        return None
    quant = cfg.get("quantization_config") or {}
    return str(quant.get("quant_method")) if quant.get("quant_method") else None


def _cpu_has_fp8_kv() -> bool:
    try:
        # deferred: torch is optional and takes ~2 s to import
        import torch
    except ImportError:  # no torch on this machine: let vLLM decide
        return True
    cpu = getattr(torch, "cpu", None)
    return bool(getattr(cpu, "_is_avx512_supported", lambda: True)() or getattr(cpu, "_is_amx_tile_supported",
                                                                                lambda: False)())


def checkpoint_refusal(quantization: Optional[str], checkpoint: Optional[str]) -> Optional[str]:
    """Why vLLM refuses ``quantization`` for a checkpoint whose ``quant_method`` is ``checkpoint``, or None."""
    q = quantization
    if checkpoint and q is not None and CHECKPOINT_METHOD.get(q, q) != checkpoint:
        return (f"Quantization method specified in the model config ({checkpoint}) does not match the "
                f"quantization method specified in the `quantization` argument ({q}).")
    if q in CHECKPOINT_METHOD and not checkpoint:
        return f"Cannot find the config file for {q}"
    return None


def hardware_refusal(args: Any, *, gpu: Optional[str], model_dtype: str, head_dim: int) -> Optional[str]:
    """Why vLLM refuses ``args.quantization`` / ``args.kv_cache_dtype`` on this device, in its words, or None.

    ``gpu``: the catalog name (None: vLLM's CPU build); ``model_dtype``: the compute dtype vLLM
    resolves (``args.dtype``, else the study's, else the checkpoint's).
    """
    q = args.quantization
    if q is not None:
        cap = _capability(gpu)
        if cap is not None and cap < MIN_CAPABILITY.get(q, 0):
            return (f"The quantization method {q} is not supported for the current GPU. Minimum capability: "
                    f"{MIN_CAPABILITY[q]}. Current capability: {cap}.")
        if q in HALF_ONLY and _TORCH.get(model_dtype) == "torch.float32":
            return (f"torch.float32 is not supported for quantization method {q}. Supported dtypes: "
                    "[torch.bfloat16, torch.float16]")
    if gpu is None and str(args.kv_cache_dtype).startswith("fp8"):
        if head_dim % 32 and head_dim % 16 == 0:
            return "FP8 KV cache requires head_size divisible by 32 on CPU."
        if not _cpu_has_fp8_kv():
            return "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    return None
