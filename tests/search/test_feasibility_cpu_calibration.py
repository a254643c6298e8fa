"""Hook: the CPU pre-flight model against KV cache sizes measured with real vLLM-CPU.

``orchestrator.search.feasibility.cpu_kv_tokens`` predicts the "GPU KV cache size: N tokens"
line vLLM-CPU logs for a model, dtype, block size and ``VLLM_CPU_KVCACHE_SPACE``. The
measured numbers, read off real vLLM-CPU logs (each entry says where), are in
``tests/data/cpu_kv_reference.json`` (:data:`orchestrator.search.feasibility.CPU_KV_REFERENCE`)
as a list of::

    {"model": "tiny-llama", "dtype": "float32", "kv_cache_dtype": "auto", "block_size": 128,
     "kv_space_gib": 1, "max_model_len": 2048, "kv_cache_tokens": 123456}

and this test checks the model against every entry.
(The GPU side is checked against the H200 reference in tests/sim/test_memory.py.)
"""

from __future__ import annotations

import json

import pytest

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.models.shapes import ModelShape
from orchestrator.search.feasibility import CPU_KV_REFERENCE, cpu_kv_tokens


def _reference() -> list[dict]:
    refs = json.loads(CPU_KV_REFERENCE.read_text())
    assert refs, CPU_KV_REFERENCE
    return refs


def test_cpu_kv_tokens_match_vllm_cpu_reference():
    for ref in _reference():
        args = EngineArgs(dtype=ref.get("dtype", "float32"), kv_cache_dtype=ref.get("kv_cache_dtype", "auto"),
                          block_size=ref.get("block_size", 128), max_model_len=ref.get("max_model_len"))
        got = cpu_kv_tokens(ModelShape.load(ref["model"]), args, ref["kv_space_gib"], ref.get("dtype", "auto"))
        assert got == pytest.approx(ref["kv_cache_tokens"], rel=0.02), ref
