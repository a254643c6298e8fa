"""Step-time predictor: monotone in work, graph modes, fp8 KV, TP, calibration multipliers."""

from __future__ import annotations

import pytest

from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.hardware.memory import plan_memory
from orchestrator.models.shapes import ModelShape
from orchestrator.sim import cost
from orchestrator.sim.cost import StepCostModel
from orchestrator.sim.scheduler import BatchShape
from orchestrator.study.spec import SimCalibration


def cost_model(model="llama-3.1-8b", gpu="H200", calibration=None, **kw) -> StepCostModel:
    g = get_gpu(gpu)
    args = EngineArgs(max_model_len=8192, **kw).resolved(device_memory_gib=g.memory_gib, device_name=g.name)
    return StepCostModel(ModelShape.load(model), g, args, calibration)


def mixed(decodes: int, context: int, prefill: int = 0, prefix: int = 0) -> BatchShape:
    n = prefill
    return BatchShape(num_tokens=decodes + n, num_reqs=decodes + (1 if n else 0), num_decodes=decodes,
                      decode_context=decodes * context, prefill_tokens=n,
                      prefill_attn_pairs=n * prefix + n * (n + 1) // 2, prefill_context=prefix + n,
                      num_sampled=decodes + (1 if n else 0))


def test_more_work_is_never_faster():
    c = cost_model()
    prev = 0.0
    for seqs in (1, 2, 8, 16, 17, 64, 100, 256, 511, 512, 513, 1024):
        t = c.decode_step_time(seqs, 1000)
        assert t >= prev
        prev = t
    prev = 0.0
    for tokens in (1, 16, 100, 512, 513, 2048, 8192, 16384):
        t = c.prefill_step_time(tokens)
        assert t >= prev
        prev = t
    prev = 0.0
    for ctx in (10, 100, 1000, 10_000, 100_000):
        t = c.decode_step_time(64, ctx)
        assert t >= prev
        prev = t
    assert c.step_time(mixed(64, 1000, 512)) >= c.step_time(mixed(64, 1000))
    assert c.prefill_step_time(512, prefix=4096) > c.prefill_step_time(512)


def test_decode_is_memory_bound_prefill_compute_bound():
    c = cost_model()
    # Weights dominate small decodes: 1 and 16 sequences cost about the same.
    assert c.decode_step_time(16, 500) < 1.2 * c.decode_step_time(1, 500)
    # Prefill cost grows about linearly in prompts once GEMMs are large...
    assert c.prefill_step_time(512, num_seqs=32) == pytest.approx(2 * c.prefill_step_time(512, num_seqs=16), rel=0.1)
    # ...and faster than linearly in one prompt's length (causal attention).
    assert c.prefill_step_time(32768) > 2.1 * c.prefill_step_time(16384)


def test_enforce_eager_adds_its_launches_to_every_step():
    graphs, eager = cost_model(), cost_model(enforce_eager=True)
    for b in (mixed(1, 100), mixed(32, 1000), mixed(16, 500, 512), mixed(0, 0, 8192)):
        assert eager.step_time(b) > graphs.step_time(b)
    # Small steps replay a graph (or launch only attention) with graphs; eager launches every layer.
    for b in (mixed(1, 100), mixed(32, 1000), mixed(16, 500, 64)):
        assert eager.step_time(b) > 1.5 * graphs.step_time(b)
    # Eager launches do not hide behind the GPU work, even on an 8,192-token prefill where
    # a compiled forward pass without a graph would (test below): the GPU idles between the
    # launch-bound small kernels, so the launch time adds to the GPU time.
    big = mixed(0, 0, 8192)
    b = eager.breakdown(big)
    assert b.total_s == pytest.approx(b.linear_s + b.attention_s + eager.eager_s + eager.step_overhead_s
                                      + eager.per_seq_overhead_s)
    assert b.launch_s == pytest.approx(eager.eager_s)
    assert eager.step_time(big) - graphs.step_time(big) == pytest.approx(eager.eager_s, rel=0.05)
    assert eager.graph_mode(mixed(8, 100)) == "eager"
    assert graphs.graph_mode(mixed(8, 100)) == "full"
    assert graphs.graph_mode(mixed(8, 100, 64)) == "piecewise"
    assert graphs.graph_mode(mixed(8, 100, 600)) == "none"


def test_decode_batches_are_padded_to_capture_sizes():
    c = cost_model(max_num_seqs=256)
    assert c.padded_rows(mixed(9, 100), "full") == 16
    assert c.padded_rows(mixed(257, 100), "full") == 272
    assert c.padded_rows(mixed(9, 100, 64), "piecewise") == 73


def test_fp8_kv_is_cheaper_for_long_contexts():
    auto, fp8 = cost_model(), cost_model(kv_cache_dtype="fp8")
    long = mixed(64, 32_000)
    # Half the bytes, read at the fp8 path's lower achieved bandwidth (dequantization per layer).
    ratio = 0.5 * cost.HBM_EFFICIENCY / cost.FP8_KV_READ_EFFICIENCY
    assert ratio < 0.9
    decode_attn = {m: m.breakdown(long).attention_s - long.num_tokens * m.kv_bytes_per_token / m.bw for m in (auto, fp8)}
    assert decode_attn[fp8] == pytest.approx(ratio * decode_attn[auto])
    assert fp8.step_time(long) < 0.9 * auto.step_time(long)
    short = mixed(4, 100)
    assert fp8.step_time(short) == pytest.approx(auto.step_time(short), rel=0.02)


def test_fp8_weights_are_cheaper_where_the_gpu_has_fp8():
    h100 = cost_model(gpu="H100-80GB")
    h100_fp8 = cost_model(gpu="H100-80GB", quantization="fp8")
    assert h100_fp8.decode_step_time(16, 500) < 0.7 * h100.decode_step_time(16, 500)  # half the weight bytes
    assert h100_fp8.prefill_step_time(8192) < 0.7 * h100.prefill_step_time(8192)  # fp8 tensor cores
    a100 = cost_model(gpu="A100-80GB")
    a100_fp8 = cost_model(gpu="A100-80GB", quantization="fp8")  # W8A16: bytes shrink, FLOP/s do not
    assert a100_fp8.prefill_step_time(8192) == pytest.approx(a100.prefill_step_time(8192), rel=0.05)


def test_70b_needs_two_h100s_and_tp_splits_the_work():
    model = ModelShape.load("llama-3.1-70b")
    gpu = get_gpu("H100-80GB")

    def args(tp):
        return EngineArgs(max_model_len=8192, tensor_parallel_size=tp).resolved(
            device_memory_gib=gpu.memory_gib, device_name=gpu.name)

    with pytest.raises(EngineStartError) as info:
        plan_memory(model, gpu, args(1))
    assert info.value.kind == FailureKind.WEIGHTS_OOM
    tp2 = StepCostModel(model, gpu, args(2))
    tp4 = StepCostModel(model, gpu, args(4))
    b = mixed(32, 2000)
    assert tp4.step_time(b) < tp2.step_time(b)
    assert tp2.breakdown(b).comm_s > 0
    # 8B: TP=2 halves the per-GPU work but adds all-reduces; still faster for big prefills.
    assert cost_model(tensor_parallel_size=2).prefill_step_time(8192) < cost_model().prefill_step_time(8192)


def test_pipeline_parallel_counts_one_stage():
    pp1, pp2 = cost_model(), cost_model(pipeline_parallel_size=2)
    assert pp2.prefill_step_time(8192) < pp1.prefill_step_time(8192)
    assert pp2.breakdown(mixed(8, 100)).comm_s > 0


def test_calibration_multipliers():
    base = cost_model()
    b = mixed(0, 0, 8192)
    assert cost_model(calibration=SimCalibration(slowdown=2.0)).step_time(b) == pytest.approx(2 * base.step_time(b))
    assert cost_model(calibration=SimCalibration(compute_efficiency=0.5)).step_time(b) > 1.8 * base.step_time(b)
    d = mixed(16, 500)
    assert cost_model(calibration=SimCalibration(bandwidth_efficiency=0.5)).step_time(d) > 1.5 * base.step_time(d)
    assert cost_model(calibration=SimCalibration(step_overhead=3.0)).step_time(d) > base.step_time(d)
    assert cost_model(calibration=SimCalibration()).step_time(d) == base.step_time(d)


def test_sync_scheduling_exposes_cpu_overhead():
    sync = cost_model(extra={"async_scheduling": False})
    assert sync.decode_step_time(64, 500) > cost_model().decode_step_time(64, 500)


def test_launches_above_the_capture_sizes_hide_behind_gpu_work():
    c = cost_model(max_num_seqs=16)  # graphs capture at most 32 tokens
    small, big = mixed(16, 500, 40), mixed(16, 500, 4096)
    assert c.graph_mode(small) == c.graph_mode(big) == "none"
    launch = c.nograph_s
    # A small step is launch-bound: it costs the Python launches, not its GPU work...
    b = c.breakdown(small)
    assert b.linear_s + b.attention_s < launch
    assert b.total_s == pytest.approx(launch + c.step_overhead_s + c.per_seq_overhead_s * 17)
    assert b.launch_s == pytest.approx(launch)
    # ...a big one is GPU-bound: the launches run ahead of the GPU and cost nothing extra.
    b = c.breakdown(big)
    assert b.overhead_s == pytest.approx(c.step_overhead_s + c.per_seq_overhead_s * 17)
    # A decode batch inside the capture sizes replays a graph: nothing to launch layer by layer.
    assert c.breakdown(mixed(16, 500)).launch_s == 0.0
