"""The pre-flight and the simulated engine decide "can this start" with the same function.

Over a grid of models, GPUs, parallel sizes, memory shares, context lengths, token budgets,
chunked prefill and KV dtypes (every start refusal vLLM has: weights that do not fit, no KV
memory, a KV cache below one sequence, argument refusals), the simulator's engine core starts
exactly the configurations the pre-flight passes, refuses the others with the pre-flight's
kind and message, and serves with the KV cache size the pre-flight predicts.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from conftest import sim_study
from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.search import feasibility
from orchestrator.sim.core import SimEngineCore
from orchestrator.study.spec import parse_study

GRID = {
    "tensor_parallel_size": [1, 2, 4],
    "gpu_memory_utilization": [0.3, 0.8, 0.9],
    "max_model_len": [4096, 32768],
    "max_num_batched_tokens": [2048, 8192],
    "enable_chunked_prefill": [True, False],
    "kv_cache_dtype": ["auto", "fp8"],
}


def _study(study_doc, model: str, gpu: str):
    return sim_study(study_doc, model={"name": model}, hardware={"gpu": gpu, "gpus_per_node": 4})


@pytest.mark.parametrize("model,gpu", [("llama-3.1-8b", "L40S"), ("qwen2.5-32b", "L40S"),
                                       ("llama-3.1-70b", "H100-80GB"), ("qwen2.5-72b", "A100-80GB")])
def test_simulator_starts_exactly_what_the_preflight_passes(study_doc, model, gpu):
    study = _study(study_doc, model, gpu)
    shape, spec = ModelShape.load(model), get_gpu(gpu)
    kinds: Counter = Counter()
    for values in itertools.product(*GRID.values()):
        args = feasibility.resolve_args(study, EngineArgs(**dict(zip(GRID, values))))
        verdict = feasibility.check(study, args)
        try:
            core = SimEngineCore(shape, spec, args, dtype=study.model.dtype)
        except EngineStartError as e:
            assert not verdict.ok, (args, e.message)
            assert (verdict.kind, verdict.reason) == (e.kind, e.message), args
            kinds[e.kind] += 1
            continue
        assert verdict.ok, (args, verdict)
        assert verdict.kv_cache_tokens == core.memory.kv_tokens, args
        kinds["started"] += 1
    # The grid reaches the refusals it is meant to compare (else agreement proves little).
    reached = {FailureKind.INVALID_ARGS, "started"}
    assert reached <= set(kinds), kinds
    assert kinds[FailureKind.WEIGHTS_OOM] + kinds[FailureKind.NO_KV_MEMORY] + kinds[FailureKind.KV_CACHE_TOO_SMALL] \
        > 0, kinds


def test_the_simulator_has_no_margin_and_a_real_engine_has_one(study_doc):
    """Against the simulator nothing is uncertain: a configuration just past the boundary is pruned.
    Against vLLM the same configuration is let try (it misses by less than PREFLIGHT_MARGIN)."""
    sim = _study(study_doc, "llama-3.1-8b", "H100-80GB")
    vllm = parse_study(dict(study_doc, engine={"kind": "vllm"}, model={"name": "llama-3.1-8b"},
                            hardware={"gpu": "H100-80GB", "gpus_per_node": 2}))
    shape, gpu = ModelShape.load("llama-3.1-8b"), get_gpu("H100-80GB")
    # The smallest memory share (in steps of 0.005) that holds one 131072-token sequence.
    share = next(u / 1000 for u in range(100, 1000, 5)
                 if feasibility.check(sim, feasibility.resolve_args(sim, EngineArgs(
                     gpu_memory_utilization=u / 1000, max_model_len=131072))).ok)
    below = EngineArgs(gpu_memory_utilization=share - 0.005, max_model_len=131072)
    sim_verdict = feasibility.check(sim, feasibility.resolve_args(sim, below))
    assert not sim_verdict.ok and sim_verdict.kind == FailureKind.KV_CACHE_TOO_SMALL
    with pytest.raises(EngineStartError):
        SimEngineCore(shape, gpu, feasibility.resolve_args(sim, below))
    assert feasibility.check(vllm, feasibility.resolve_args(vllm, below)).ok
    far = EngineArgs(gpu_memory_utilization=share * 0.8, max_model_len=131072)
    assert not feasibility.check(vllm, feasibility.resolve_args(vllm, far)).ok


def test_preflight_is_on_by_default_for_engines_the_orchestrator_starts(study_doc):
    for kind, on in (("sim", True), ("vllm", True), ("external", False)):
        doc = dict(study_doc, engine={"kind": kind, **({"base_url": "http://127.0.0.1:1"} if kind == "external"
                                                       else {})})
        assert feasibility.preflight_on(parse_study(doc)) is on, kind
    off = parse_study(dict(study_doc, search={"preflight": False}))
    assert not feasibility.preflight_on(off) and not feasibility.survey_applies(off)
