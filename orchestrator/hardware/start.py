"""Can this configuration start? vLLM's start-up checks, in its order, decided once.

The pre-flight (:func:`orchestrator.search.feasibility.check`) and the simulated engine
(:class:`orchestrator.sim.core.SimEngineCore`) both call :func:`start_plan`, so the
simulator refuses exactly what the pre-flight prunes and the pre-flight's KV cache size
is the one the simulator serves with. The order is vLLM's: the arguments it refuses
before loading anything (``SchedulerConfig``, ``ModelConfig``, the quantization and KV
dtype the device can run), then the memory plan (:func:`orchestrator.hardware.memory.plan_memory`:
weights per rank, the profile run's activation peak, CUDA graphs, KV blocks for one
``max_model_len`` sequence). Errors carry vLLM's own words.
"""

from __future__ import annotations

from typing import Optional

from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs, vllm_refusal
from orchestrator.hardware.gpus import GpuSpec
from orchestrator.hardware.memory import MemoryPlan, plan_memory
from orchestrator.hardware.quant_support import hardware_refusal
from orchestrator.models.shapes import ModelShape

__all__ = ["start_refusal", "start_plan", "compute_dtype"]


def compute_dtype(model: ModelShape, args: EngineArgs, dtype: Optional[str], *, cpu: bool) -> str:
    """The dtype vLLM computes in, as its quantization checks see it: explicit ``args.dtype`` >
    the study's > ``auto`` (half precision on GPUs, the checkpoint's on the CPU build)."""
    explicit = next((d for d in (args.dtype, dtype) if d not in (None, "auto")), None)
    return explicit or (model.torch_dtype if cpu else "bfloat16")


def start_refusal(model: ModelShape, args: EngineArgs, *, gpu: Optional[str],
                  dtype: Optional[str] = "auto") -> Optional[EngineStartError]:
    """Why vLLM refuses ``args`` (resolved) before it loads anything, or None.

    ``gpu``: the catalog name (None: vLLM's CPU build).
    """
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    text = vllm_refusal(args)
    if text is None and model.num_attention_heads % tp:
        text = (f"ValueError: Total number of attention heads ({model.num_attention_heads}) must be divisible by "
                f"tensor parallel size ({tp}).")
    if text is None and model.num_layers < pp:
        text = f"pipeline_parallel_size {pp} exceeds the model's {model.num_layers} layers"
    if text is None and args.max_model_len and args.max_model_len > model.max_position_embeddings:
        text = (f"ValueError: User-specified max_model_len ({args.max_model_len}) is greater than the derived "
                f"max_model_len (max_position_embeddings={model.max_position_embeddings} in model's config.json).")
    if text is None:
        text = hardware_refusal(args, gpu=gpu, model_dtype=compute_dtype(model, args, dtype, cpu=gpu is None),
                                head_dim=model.head_dim)
    return None if text is None else EngineStartError(FailureKind.INVALID_ARGS, text)


def start_plan(model: ModelShape, gpu: GpuSpec, args: EngineArgs, dtype: str = "auto") -> MemoryPlan:
    """The memory plan one rank of a configuration that starts gets; raises :class:`EngineStartError`
    (kind and vLLM's message) for one that does not. ``args`` must be resolved."""
    refused = start_refusal(model, args, gpu=gpu.name, dtype=dtype)
    if refused is not None:
        raise refused
    return plan_memory(model, gpu, args, dtype)
