"""Start-up memory plan: the H200 calibration and vLLM's start failures (through ``start_plan``)."""

from __future__ import annotations

import pytest

from orchestrator.apps.cold_runs import load_cold_runs
from orchestrator.failures import EngineStartError, FailureKind, classify_start_error
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.hardware.memory import GiB, cudagraph_capture_sizes, plan_memory
from orchestrator.hardware.start import start_plan
from orchestrator.models.shapes import ModelShape


def resolved(gpu, **kw) -> EngineArgs:
    return EngineArgs(**kw).resolved(device_memory_gib=gpu.memory_gib, device_name=gpu.name, model_max_len=4096)


@pytest.fixture(scope="module")
def llama8b():
    return ModelShape.load("llama-3.1-8b")


# What vLLM logged at the cold runs' starts (results/examples/h200-cold-runs).
COLD = load_cold_runs()
MEMORY = COLD.memory


def _near(value: float, logged, rel: float) -> bool:
    """Within ``rel`` of the range vLLM logged over its starts."""
    return logged.low * (1 - rel) <= value <= logged.high * (1 + rel)


def test_h200_llama8b_matches_reference(llama8b):
    gpu = get_gpu(COLD.setup.gpu)
    for seqs in MEMORY.kv_serve_gib.max_num_seqs:
        args = resolved(gpu, gpu_memory_utilization=COLD.setup.gpu_memory_utilization,
                        max_model_len=COLD.setup.max_model_len, max_num_seqs=seqs)
        assert args.max_num_batched_tokens == MEMORY.serve_budget
        plan = plan_memory(llama8b, gpu, args)
        assert _near(plan.kv_bytes / GiB, MEMORY.kv_serve_gib, 0.02), (seqs, plan.kv_bytes / GiB)
        assert _near(plan.kv_tokens, MEMORY.kv_serve_tokens, 0.02), (seqs, plan.kv_tokens)
        assert plan.weight_bytes_per_gpu / GiB == pytest.approx(MEMORY.weights_gib, abs=0.01)
        assert plan.cudagraph_bytes / GiB == pytest.approx(MEMORY.cudagraph_gib[seqs], rel=0.08, abs=0.03)
    assert plan.kv_bytes_per_token == 131072
    assert plan.num_blocks == plan.kv_bytes // (16 * 131072)
    assert plan.max_concurrency == pytest.approx(plan.kv_tokens / 4096)
    assert plan.requested_bytes == -(-plan.total_bytes * 9 // 10)


def test_offline_budget_leaves_less_kv(llama8b):
    # LLM class: its larger profile run (16,384 tokens) leaves less KV than the server's.
    gpu = get_gpu(COLD.setup.gpu)
    for seqs in MEMORY.kv_offline_tokens.max_num_seqs:
        args = EngineArgs(gpu_memory_utilization=COLD.setup.gpu_memory_utilization,
                          max_model_len=COLD.setup.max_model_len, max_num_seqs=seqs).resolved(
            device_memory_gib=gpu.memory_gib, device_name=gpu.name, server=False)
        assert args.max_num_batched_tokens == MEMORY.offline_budget
        plan = plan_memory(llama8b, gpu, args)
        assert _near(plan.kv_tokens, MEMORY.kv_offline_tokens, 0.02), (seqs, plan.kv_tokens)


def test_enforce_eager_has_no_graph_memory(llama8b):
    gpu = get_gpu("H200")
    eager = plan_memory(llama8b, gpu, resolved(gpu, enforce_eager=True))
    graphs = plan_memory(llama8b, gpu, resolved(gpu))
    assert eager.cudagraph_bytes == 0 and eager.kv_bytes > graphs.kv_bytes
    assert cudagraph_capture_sizes(resolved(gpu, enforce_eager=True)) == []
    sizes = cudagraph_capture_sizes(resolved(gpu, max_num_seqs=1024))
    assert len(sizes) == 51 and sizes[-1] == 512


def test_fp8_kv_doubles_tokens_and_is_allowed_without_fp8_hardware(llama8b):
    for name in ("H100-80GB", "A100-80GB"):  # A100: no FP8 units, vLLM still stores fp8 KV
        gpu = get_gpu(name)
        auto = plan_memory(llama8b, gpu, resolved(gpu))
        fp8 = plan_memory(llama8b, gpu, resolved(gpu, kv_cache_dtype="fp8"))
        assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
        assert fp8.kv_tokens == pytest.approx(2 * auto.kv_tokens, rel=0.01)
    a100 = get_gpu("A100-80GB")
    quant = plan_memory(llama8b, a100, resolved(a100, quantization="fp8"))
    assert quant.weight_bytes_per_gpu < 0.6 * plan_memory(llama8b, a100, resolved(a100)).weight_bytes_per_gpu


def test_tp_splits_weights_and_kv_heads(llama8b):
    gpu = get_gpu("H100-80GB")
    one = plan_memory(llama8b, gpu, resolved(gpu))
    two = plan_memory(llama8b, gpu, resolved(gpu, tensor_parallel_size=2))
    assert two.weight_bytes_per_gpu == pytest.approx(one.weight_bytes_per_gpu / 2, rel=0.01)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token


def test_float32_doubles_weights(llama8b):
    gpu = get_gpu("H200")
    bf16 = plan_memory(llama8b, gpu, resolved(gpu))
    fp32 = plan_memory(llama8b, gpu, resolved(gpu), dtype="float32")
    assert fp32.weight_bytes_per_gpu == pytest.approx(2 * bf16.weight_bytes_per_gpu, rel=0.001)
    assert fp32.kv_bytes_per_token == 2 * bf16.kv_bytes_per_token


def _start_error(model, gpu, args) -> EngineStartError:
    with pytest.raises(EngineStartError) as info:
        start_plan(model, gpu, args)
    err = info.value
    assert classify_start_error(err.message) == err.kind  # reads like the real engine's log
    return err


def test_weights_larger_than_gpu_is_cuda_oom():
    model = ModelShape.load("llama-3.1-70b")
    gpu = get_gpu("H100-80GB")
    err = _start_error(model, gpu, resolved(gpu))
    assert err.kind == FailureKind.WEIGHTS_OOM
    assert "CUDA out of memory. Tried to allocate" in err.message
    # TP=2 puts half the weights on each GPU: it starts.
    assert plan_memory(model, gpu, resolved(gpu, tensor_parallel_size=2)).num_blocks > 0


def test_no_memory_left_for_kv(llama8b):
    gpu = get_gpu("H200")
    err = _start_error(llama8b, gpu, resolved(gpu, gpu_memory_utilization=0.1))
    assert err.kind == FailureKind.NO_KV_MEMORY
    assert "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when " \
           "initializing the engine." in err.message


def test_kv_cache_too_small_for_max_model_len(llama8b):
    gpu = get_gpu("H200")
    err = _start_error(llama8b, gpu, resolved(gpu, gpu_memory_utilization=0.2, max_model_len=131072))
    assert err.kind == FailureKind.KV_CACHE_TOO_SMALL
    assert "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, " \
           "which is larger than the available KV cache memory (" in err.message
    assert "the estimated maximum model length is " in err.message
    assert "Try increasing `gpu_memory_utilization` or decreasing `max_model_len`" in err.message
    est = int(err.message.split("estimated maximum model length is ")[1].split(".")[0])
    assert 0 < est < 131072 and est % 16 == 0
    # The estimate itself fits.
    assert plan_memory(llama8b, gpu, resolved(gpu, gpu_memory_utilization=0.2, max_model_len=est)).num_blocks > 0


def test_tp_must_divide_heads(llama8b):
    gpu = get_gpu("H200")
    err = _start_error(llama8b, gpu, resolved(gpu, tensor_parallel_size=3))
    assert err.kind == FailureKind.INVALID_ARGS
    assert "Total number of attention heads (32) must be divisible by tensor parallel size (3)." in err.message
