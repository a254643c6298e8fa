"""Pre-flight check: can this configuration start at all on the study's hardware?

The arithmetic is the simulator's memory model (vLLM's own accounting: weights per
GPU, profile-run activations, CUDA graphs, KV blocks for one ``max_model_len``
sequence), plus cluster-shape rules. A configuration rejected here never costs a
GPU start; it is recorded as ``pruned`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from orchestrator.engine_args import EngineArgs
from orchestrator.failures import EngineStartError, FailureKind

# Real engines use a little memory the model cannot see; only reject configurations
# that miss by more than this margin, and let borderline ones try.
PREFLIGHT_MARGIN = 0.03


@dataclass(frozen=True)
class Verdict:
    ok: bool
    kind: Optional[FailureKind] = None
    reason: str = ""
    kv_cache_tokens: Optional[int] = None


def check(study, args: EngineArgs, *, cluster_units: Optional[int] = None,
          units_per_node: Optional[int] = None) -> Verdict:
    """Judge ``args`` (already resolved) against the study's model and GPU."""
    from orchestrator.sim.hardware import get_gpu
    from orchestrator.sim.memory import plan_memory
    from orchestrator.sim.models import ModelShape

    model = ModelShape.load(study.model.name, study.base_dir)
    need = args.gpus
    if cluster_units is not None and need > cluster_units:
        return Verdict(False, FailureKind.PREFLIGHT,
                       f"needs {need} GPUs (TP {args.tensor_parallel_size} x PP {args.pipeline_parallel_size}) "
                       f"but the cluster has {cluster_units}")
    if units_per_node is not None and args.tensor_parallel_size > units_per_node:
        return Verdict(False, FailureKind.PREFLIGHT,
                       f"tensor_parallel_size {args.tensor_parallel_size} exceeds the {units_per_node} GPUs of a node")
    if model.num_attention_heads % args.tensor_parallel_size:
        return Verdict(False, FailureKind.PREFLIGHT,
                       f"Total number of attention heads ({model.num_attention_heads}) must be divisible by "
                       f"tensor parallel size ({args.tensor_parallel_size}).")
    if model.num_layers < args.pipeline_parallel_size:
        return Verdict(False, FailureKind.PREFLIGHT,
                       f"pipeline_parallel_size {args.pipeline_parallel_size} exceeds the model's "
                       f"{model.num_layers} layers")
    if args.max_model_len and args.max_model_len > model.max_position_embeddings:
        return Verdict(False, FailureKind.PREFLIGHT,
                       f"max_model_len {args.max_model_len} is larger than the model's maximum "
                       f"({model.max_position_embeddings})")
    if study.hardware.gpu == "CPU":
        return Verdict(True)
    gpu = get_gpu(study.hardware.gpu)
    try:
        plan = plan_memory(model, gpu, args, study.model.dtype)
    except EngineStartError as e:
        if e.kind == FailureKind.KV_CACHE_TOO_SMALL and _within_margin(model, gpu, args, study.model.dtype):
            return Verdict(True)
        return Verdict(False, e.kind, e.message)
    return Verdict(True, kv_cache_tokens=plan.kv_tokens)


def _within_margin(model, gpu, args: EngineArgs, dtype: str) -> bool:
    """Would the configuration fit with ``PREFLIGHT_MARGIN`` more memory? (then let it try)"""
    from dataclasses import replace

    from orchestrator.sim.memory import plan_memory

    try:
        plan_memory(model, gpu, replace(args, gpu_memory_utilization=min(1.0, args.gpu_memory_utilization
                                                                         * (1 + PREFLIGHT_MARGIN))), dtype)
        return True
    except EngineStartError:
        return False
