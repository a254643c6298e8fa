"""Start-up memory plan of one vLLM engine rank: how many KV blocks it gets, or why it fails.

Mirrors ``gpu_worker.determine_available_memory`` and ``kv_cache_utils``:

    requested = ceil(total * gpu_memory_utilization)
    kv_bytes  = requested - weights - activation peak - CUDA graphs - non-torch
                (or ``kv_cache_memory_bytes`` where it is set)
    num_blocks = kv_bytes // (block_size * kv_bytes_per_token)

and vLLM's two KV refusals: no bytes left for a block (``no_kv_memory``), fewer blocks
than one ``max_model_len`` sequence needs (``kv_cache_too_small``). The whole start
decision (argument refusals first, then this plan) is :func:`orchestrator.hardware.start.start_plan`.

The non-weight terms are fitted to the H200 reference (Llama-3.1-8B, 0.9, 8192
tokens, 256 seqs: 109.5 GiB of KV; 0.15 / 0.59 GiB of graphs at 16 / 256 seqs).
Errors carry vLLM's own wording so :func:`orchestrator.failures.classify_start_error`
maps them like a real engine's log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs, ceil_div
from orchestrator.hardware.gpus import GpuSpec
from orchestrator.models.shapes import DTYPE_BYTES, QUANT_WEIGHT_BITS, ModelShape

GiB = 1 << 30
MiB = 1 << 20

# Memory outside torch's allocator that appears after the start snapshot (cuBLAS
# workspaces, allocator fragmentation); NCCL adds its buffers when ranks talk.
NON_TORCH_BYTES = 512 * MiB
NCCL_BYTES = 256 * MiB
# CUDA graph pool: a fixed part per layer plus a part per captured token that
# scales with the activation size (fit: 0.15 GiB at 32 captured tokens, 0.59 at 512).
CUDAGRAPH_BYTES_PER_LAYER = 4 * MiB
CUDAGRAPH_ACT_FACTOR = 11.0


def model_dtype(model: ModelShape, args: EngineArgs, dtype: str = "auto", gpu: GpuSpec | None = None) -> str:
    """The compute dtype vLLM picks: explicit ``dtype`` > ``args.dtype`` > the checkpoint's.

    A bf16 checkpoint on a GPU without bf16 runs in float16 (same size).
    """
    d = dtype if dtype not in (None, "auto") else args.dtype
    if d in (None, "auto"):
        d = model.torch_dtype
    d = {"half": "float16", "float": "float32"}.get(d, d)
    if d == "bfloat16" and gpu is not None and not gpu.supports_bf16:
        d = "float16"
    return d


def dtype_bytes(model: ModelShape, args: EngineArgs, dtype: str = "auto") -> int:
    return int(DTYPE_BYTES.get(model_dtype(model, args, dtype), 2))


def kv_dtype_bytes(args: EngineArgs, model_bytes: int) -> int:
    """Bytes per KV element: ``auto`` follows the model dtype, any fp8 variant is 1."""
    kv = args.kv_cache_dtype or "auto"
    if kv == "auto":
        return model_bytes
    return int(DTYPE_BYTES.get(kv, 1 if kv.startswith("fp8") else 2))


def cudagraph_capture_sizes(args: EngineArgs) -> list[int]:
    """vLLM's capture sizes (``VllmConfig._set_cudagraph_sizes``); empty with enforce_eager.

    [1, 2, 4] + 8..248 step 8 + 256.. step 16, up to min(2 * max_num_seqs, 512,
    max_num_batched_tokens).
    """
    if args.enforce_eager:
        return []
    top = min(2 * int(args.max_num_seqs), 512, int(args.max_num_batched_tokens))
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
    return [s for s in sizes if s <= top] or [1]


def layers_per_rank(model: ModelShape, pp: int) -> int:
    """Layers on the busiest pipeline stage (vLLM splits layers as evenly as it can)."""
    return ceil_div(model.num_layers, max(1, pp))


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU rank's memory budget (bytes) and the KV cache it yields."""

    total_bytes: int
    requested_bytes: int
    weight_bytes_per_gpu: int
    activation_bytes: int
    cudagraph_bytes: int
    non_torch_bytes: int
    kv_bytes: int
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int
    kv_tokens: int
    max_concurrency: float

    @property
    def kv_gib(self) -> float:
        return self.kv_bytes / GiB

    @property
    def weights_gib(self) -> float:
        return self.weight_bytes_per_gpu / GiB

    def describe(self) -> str:
        """The lines vLLM logs at start-up."""
        return (f"Model loading took {self.weights_gib:.2f} GiB memory; "
                f"Available KV cache memory: {self.kv_gib:.2f} GiB; "
                f"GPU KV cache size: {self.kv_tokens:,} tokens; "
                f"Maximum concurrency: {self.max_concurrency:.2f}x")


def activation_bytes(model: ModelShape, args: EngineArgs, dbytes: int) -> int:
    """Peak of the profile run (``_dummy_run(max_num_batched_tokens)`` + dummy sampler).

    Per token at the MLP peak: gate_up output (2 * I / TP) plus residual, normed
    and attention buffers (4 * H), in the model dtype; plus float32 logits for
    ``max_num_seqs`` rows over the full vocabulary (gathered on every rank).
    """
    tp = args.tensor_parallel_size
    per_token = (2 * model.intermediate_size // tp + 4 * model.hidden_size) * dbytes
    logits = int(args.max_num_seqs) * model.vocab_size * 4
    return int(args.max_num_batched_tokens) * per_token + logits


def cudagraph_bytes(model: ModelShape, args: EngineArgs, dbytes: int) -> int:
    sizes = cudagraph_capture_sizes(args)
    if not sizes:
        return 0
    tp = args.tensor_parallel_size
    per_token = (2 * model.intermediate_size // tp + 4 * model.hidden_size) * dbytes
    layers = layers_per_rank(model, args.pipeline_parallel_size)
    return int(layers * CUDAGRAPH_BYTES_PER_LAYER + CUDAGRAPH_ACT_FACTOR * max(sizes) * per_token)


def kv_bytes_per_token(model: ModelShape, args: EngineArgs, dbytes: int) -> int:
    """Per-rank KV bytes per token: kv_heads // TP heads, this stage's layers."""
    per_layer = model.kv_bytes_per_token(kv_dtype_bytes(args, dbytes), args.tensor_parallel_size) / model.num_layers
    return int(per_layer * layers_per_rank(model, args.pipeline_parallel_size))


def _fmt_gib(b: float) -> str:
    return f"{round(b / GiB, 2)}"  # vLLM's format_gib


def plan_memory(model: ModelShape, gpu: GpuSpec, args: EngineArgs, dtype: str = "auto") -> MemoryPlan:
    """Plan one rank's memory; raise :class:`EngineStartError` where vLLM's memory would not start it
    (the argument refusals come first: :func:`orchestrator.hardware.start.start_plan`).

    ``args`` must be resolved (``EngineArgs.resolved``): max_num_seqs,
    max_num_batched_tokens, max_model_len and block_size are read as numbers.
    """
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    if args.max_model_len is None or args.block_size is None or args.max_num_seqs is None:
        raise ValueError("plan_memory needs resolved EngineArgs (call EngineArgs.resolved first)")

    dbytes = dtype_bytes(model, args, dtype)
    total = gpu.memory_bytes
    requested = math.ceil(total * args.gpu_memory_utilization)
    weights = int(model.weight_bytes(dbytes, args.quantization) / (tp * pp))
    non_torch = NON_TORCH_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)

    # Loading ignores gpu_memory_utilization: it fails only past the device's capacity.
    if weights + non_torch > total:
        bits = QUANT_WEIGHT_BITS.get(args.quantization)
        tensor = 2 * model.hidden_size * model.intermediate_size / tp * (bits / 8 if bits else dbytes)
        used = max(0, total - non_torch - int(tensor))
        raise EngineStartError(
            FailureKind.WEIGHTS_OOM,
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tensor / GiB:.2f} GiB. "
            f"GPU 0 has a total capacity of {total / GiB:.2f} GiB of which {(total - used - non_torch) / MiB:.2f} MiB "
            f"is free. Including non-PyTorch memory, this process has {(used + non_torch) / GiB:.2f} GiB memory "
            f"in use. Of the allocated memory {used / GiB:.2f} GiB is allocated by PyTorch, and 0 bytes is "
            f"reserved by PyTorch but unallocated. (model weights need {weights / GiB:.2f} GiB per GPU)")

    act = activation_bytes(model, args, dbytes)
    graphs = cudagraph_bytes(model, args, dbytes)
    kv = requested - weights - act - graphs - non_torch
    fixed_kv = args.extra.get("kv_cache_memory_bytes")
    if fixed_kv:  # vLLM takes the size as given and skips the utilization arithmetic
        kv = int(fixed_kv)
    bs = int(args.block_size)
    per_token = kv_bytes_per_token(model, args, dbytes)
    page = bs * per_token
    usable = kv - page  # 0.29 checks against the blocks left after the null block
    if usable <= 0:
        raise EngineStartError(
            FailureKind.NO_KV_MEMORY,
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
            "for more details.")

    max_len = int(args.max_model_len)
    needed = ceil_div(max_len, bs) * page
    if needed > usable:
        est = max(0, usable // page * bs)
        est_msg = f"Based on the available memory, the estimated maximum model length is {est}. " if est > 0 else ""
        raise EngineStartError(
            FailureKind.KV_CACHE_TOO_SMALL,
            f"ValueError: To serve at least one request with the model's max seq len ({max_len}), "
            f"({_fmt_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({_fmt_gib(usable)} GiB). {est_msg}Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine. "
            f"See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")

    num_blocks = kv // page
    kv_tokens = num_blocks * bs
    return MemoryPlan(
        total_bytes=total, requested_bytes=requested, weight_bytes_per_gpu=weights, activation_bytes=act,
        cudagraph_bytes=graphs, non_torch_bytes=non_torch, kv_bytes=kv, kv_bytes_per_token=per_token,
        block_size=bs, num_blocks=num_blocks, kv_tokens=kv_tokens, max_concurrency=kv_tokens / max_len)
