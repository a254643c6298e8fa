"""Step-time predictor: how long one forward pass of a :class:`BatchShape` takes.

A roofline per operator group, summed (the kernels run one after another):

* linear layers: max(2 * params * rows / (peak * eff(rows)), weight bytes / (HBM * eff))
  with eff(rows) rising to its maximum as GEMMs get tall enough; lm_head only for
  the rows that sample;
* attention: decode rows are memory-bound (their KV is read once per layer);
  prefill chunks are compute-bound (causal query-key pairs, cached prefix included);
  the new KV is written;
* TP: two ring all-reduces per layer of rows x hidden; PP: one activation send per
  stage boundary, layers split over stages and the pipeline treated as full (a step
  costs one stage plus a bubble share), so PP scales throughput, not token latency;
* overheads: a per-step CPU cost (scheduling, input preparation, sampling sync;
  mostly hidden by async scheduling), plus kernel launches where no CUDA graph
  covers the step: every layer with enforce_eager, attention only for a mixed
  batch within the largest capture size (piecewise graphs); above it every layer
  launches from Python, which only shows where the launches outlast the GPU work
  (max(launch, GPU) on top of the piecewise attention launches).
  Decode-only batches replay a full graph padded to the next capture size.

Constants were fitted on Llama-3.1-8B / H200 / vLLM 0.26, cold and warm runs (docs/simulator.md);
:class:`orchestrator.study.SimCalibration` multiplies them (1.0 = as fitted).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Optional

from orchestrator.engine_args import EngineArgs
from orchestrator.sim.hardware import GpuSpec
from orchestrator.sim.memory import (cudagraph_capture_sizes, dtype_bytes, kv_bytes_per_token, layers_per_rank,
                                     model_dtype)
from orchestrator.sim.models import QUANT_WEIGHT_BITS, ModelShape
from orchestrator.sim.scheduler import BatchShape

# ---- constants fitted on one H200 (Llama-3.1-8B shape, vLLM 0.26, torch.compile + CUDA graphs,
# 512 in / 128 out): first on six cold runs (tests/sim/sim_reference.py: a fresh `vllm serve` per
# configuration, no warm-up), then re-fitted on warm runs on fresh prompts
# (results/examples/h200-ingress: 480 requests at 40 req/s and all at once, two samples each) by a
# Nelder-Mead fit of log errors (request throughput, TTFT / TPOT p50, mean / median ITL; the cold
# runs at a lower weight), then rounded. docs/simulator.md has both tables; tests/sim/test_virtual.py
# checks them.
GEMM_EFFICIENCY = 0.58  # of peak tensor FLOP/s for tall GEMMs (norms, rotary, SiLU folded in)
# Rows at which GEMM efficiency is half its maximum: GEMMs a few hundred rows tall fill the
# SMs poorly (too few output tiles), so a 256-sequence decode step is compute-bound at ~80%
# of the tall-GEMM rate (warm data: ~15-19 ms decode steps at 256 sequences, 8192-token steps ~200 ms).
GEMM_HALF_ROWS = 56
ATTN_EFFICIENCY = 0.45  # prefill attention FLOP/s efficiency (FlashAttention, causal; not fitted)
HBM_EFFICIENCY = 0.85  # achieved / peak HBM bandwidth for weight and KV streams
STEP_OVERHEAD_S = 1.9e-3  # per step left visible by async scheduling (CPU, sampler, kernel gaps)
PER_SEQ_OVERHEAD_S = 0.5e-6  # input preparation / output processing per scheduled request
# Without async scheduling the scheduler, input preparation and output processing run between
# steps (not fitted: vLLM's V1 notes give ~1-6 ms between steps without it).
SYNC_STEP_S = 1.5e-3
SYNC_PER_SEQ_S = 8e-6
PIECEWISE_LAYER_S = 15e-6  # eager attention launches per layer (mixed batch inside graphs; not fitted)
# Above the largest capture size nothing replays a graph: the compiled pieces launch from
# Python every step, ahead of the GPU, so the launches only show where they take longer than
# the GPU work they launch (small steps; a step of 513+ tokens on an 8B model is GPU-bound).
# The cold fit charged ~6.5 ms to every such step; the warm runs leave no room for it (with it,
# their 40 req/s TTFT and TPOT p50 came out 13-23% high, their ITL p90 / p99 25-45% high).
# Not identifiable from the warm data: kept at the cold fit's value as a launch time.
NOGRAPH_LAYER_S = 200e-6
EAGER_LAYER_S = 220e-6  # enforce_eager: Python dispatch + launches per layer, every step (not refitted)
PP_BUBBLE = 0.1  # per extra stage, share of a stage time lost to pipeline bubbles
# Client-visible latency outside the engine core (HTTP, tokenization, IPC, detokenization, SSE):
# the low-load TTFT exceeds the engine's prefill path by about this much (cold fit 31 ms,
# warm 40 req/s runs ~30 ms).
FRONTEND_LATENCY_S = 0.030

_FP8_QUANT = {"fp8", "modelopt", "compressed-tensors"}


@dataclass(frozen=True)
class StepBreakdown:
    linear_s: float
    attention_s: float
    comm_s: float
    overhead_s: float
    total_s: float
    graph: str  # "full", "piecewise", "none", "eager"


class StepCostModel:
    """Prices engine steps for one (model, GPU, engine args) on one replica."""

    def __init__(self, model: ModelShape, gpu: GpuSpec, args: EngineArgs, calibration=None, dtype: str = "auto"):
        cal = calibration
        self.model, self.gpu, self.args = model, gpu, args
        c_eff = getattr(cal, "compute_efficiency", 1.0) if cal is not None else 1.0
        b_eff = getattr(cal, "bandwidth_efficiency", 1.0) if cal is not None else 1.0
        o_mul = getattr(cal, "step_overhead", 1.0) if cal is not None else 1.0
        self.slowdown = getattr(cal, "slowdown", 1.0) if cal is not None else 1.0
        f_mul = getattr(cal, "frontend_latency", 1.0) if cal is not None else 1.0

        tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
        self.tp, self.pp = tp, pp
        dbytes = dtype_bytes(model, args, dtype)
        self.dbytes = dbytes
        layers = layers_per_rank(model, pp)
        self.layers = layers
        frac = layers / model.num_layers  # this stage's share of the layers

        # Peak FLOP/s of the linear layers: fp8 tensor cores for fp8 weights where they exist.
        peak = gpu.bf16_tflops * 1e12
        if model_dtype(model, args, dtype, gpu) == "float32":
            peak /= 4  # TF32-class throughput at best
        linear_peak = peak
        if args.quantization in _FP8_QUANT and gpu.fp8_tflops:
            linear_peak = gpu.fp8_tflops * 1e12
        self.linear_flops_per_row = 2 * model.linear_params * frac / tp
        self.lm_head_flops_per_row = 2 * model.vocab_size * model.hidden_size / tp
        self.gemm_rate = linear_peak * GEMM_EFFICIENCY * c_eff
        self.attn_rate = peak * ATTN_EFFICIENCY * c_eff
        self.bw = gpu.hbm_gbps * 1e9 * HBM_EFFICIENCY * b_eff

        # Bytes streamed per step: this rank's linear weights and lm_head (not the embedding table).
        bits = QUANT_WEIGHT_BITS.get(args.quantization)
        linear_bytes = model.linear_params * (bits / 8 if bits else dbytes) * frac / tp
        self.weight_read_bytes = linear_bytes + model.vocab_size * model.hidden_size * dbytes / tp
        self.kv_bytes_per_token = kv_bytes_per_token(model, args, dbytes)
        # Attention FLOPs per causal (query, key) pair: QK^T and PV over this rank's heads.
        self.attn_flops_per_pair = 4 * layers * (model.num_attention_heads // tp) * model.head_dim

        self.capture_sizes = cudagraph_capture_sizes(args)
        self.max_capture = self.capture_sizes[-1] if self.capture_sizes else 0
        sync = not args.extra.get("async_scheduling", True)
        self.step_overhead_s = (STEP_OVERHEAD_S + (SYNC_STEP_S if sync else 0.0)) * o_mul
        self.per_seq_overhead_s = (PER_SEQ_OVERHEAD_S + (SYNC_PER_SEQ_S if sync else 0.0)) * o_mul
        self.piecewise_s = PIECEWISE_LAYER_S * layers * o_mul
        self.nograph_s = NOGRAPH_LAYER_S * layers * o_mul
        self.eager_s = EAGER_LAYER_S * layers * o_mul
        self.frontend_latency_s = FRONTEND_LATENCY_S * o_mul * f_mul

        # Collectives: 2 all-reduces per layer (TP), one send per stage boundary (PP).
        link = gpu.interconnect_gbps * 1e9
        self._ar_bytes_per_row = model.hidden_size * dbytes
        self._ar_factor = 2 * (tp - 1) / tp / link if tp > 1 else 0.0
        self._ar_calls = 2 * layers if tp > 1 else 0
        self._p2p_per_row = model.hidden_size * dbytes / link if pp > 1 else 0.0
        self._latency = gpu.allreduce_latency_s

    # ---------------------------------------------------------------- pieces
    def graph_mode(self, batch: BatchShape) -> str:
        if not self.capture_sizes:
            return "eager"
        if batch.num_tokens > self.max_capture:
            return "none"
        return "full" if batch.is_uniform_decode else "piecewise"

    def padded_rows(self, batch: BatchShape, mode: str) -> int:
        if mode != "full":
            return batch.num_tokens
        return self.capture_sizes[bisect.bisect_left(self.capture_sizes, batch.num_tokens)]

    def breakdown(self, batch: BatchShape) -> StepBreakdown:
        if batch.num_tokens <= 0:
            return StepBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, "none")
        mode = self.graph_mode(batch)
        rows = self.padded_rows(batch, mode)

        flops = self.linear_flops_per_row * rows + self.lm_head_flops_per_row * batch.num_sampled
        gemm_eff = rows / (rows + GEMM_HALF_ROWS)
        linear = max(flops / (self.gemm_rate * gemm_eff), self.weight_read_bytes / self.bw)

        kvb = self.kv_bytes_per_token
        decode_attn = batch.decode_context * kvb / self.bw
        prefill_attn = max(batch.prefill_attn_pairs * self.attn_flops_per_pair / self.attn_rate,
                           batch.prefill_context * kvb / self.bw)
        kv_write = batch.num_tokens * kvb / self.bw
        attention = decode_attn + prefill_attn + kv_write

        comm = 0.0
        if self._ar_calls:
            comm += self._ar_calls * (self._latency + rows * self._ar_bytes_per_row * self._ar_factor)
        if self.pp > 1:
            comm += (self.pp - 1) * (self._latency + rows * self._p2p_per_row)

        stage = linear + attention
        if self.pp > 1:
            stage *= 1 + PP_BUBBLE * (self.pp - 1)

        overhead = self.step_overhead_s + self.per_seq_overhead_s * batch.num_reqs
        if mode == "piecewise":
            overhead += self.piecewise_s
        elif mode == "none":
            overhead += self.piecewise_s + max(0.0, self.nograph_s - (stage + comm))
        elif mode == "eager":
            overhead += self.eager_s
        total = (stage + comm + overhead) * self.slowdown
        return StepBreakdown(linear, attention, comm, overhead, total, mode)

    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one engine step running ``batch`` (``slowdown`` included)."""
        return self.breakdown(batch).total_s

    def decode_step_time(self, num_seqs: int, context: int) -> float:
        """Convenience: a decode-only step of ``num_seqs`` sequences at ``context`` tokens each."""
        b = BatchShape(num_tokens=num_seqs, num_reqs=num_seqs, num_decodes=num_seqs,
                       decode_context=num_seqs * context, num_sampled=num_seqs)
        return self.step_time(b)

    def prefill_step_time(self, num_tokens: int, prefix: int = 0, num_seqs: Optional[int] = 1) -> float:
        """Convenience: one step prefilling ``num_seqs`` prompts of ``num_tokens`` each after a cached ``prefix``."""
        n = num_tokens
        b = BatchShape(num_tokens=n * num_seqs, num_reqs=num_seqs, prefill_tokens=n * num_seqs,
                       prefill_attn_pairs=num_seqs * (n * prefix + n * (n + 1) // 2),
                       prefill_context=num_seqs * (prefix + n), num_sampled=num_seqs)
        return self.step_time(b)
