"""Step-time predictor: how long one forward pass of a :class:`BatchShape` takes.

A roofline per operator group, summed (the kernels run one after another):

* linear layers: max(2 * params * rows / (peak * eff(rows)), weight bytes / (HBM * eff))
  with eff(rows) rising to its maximum as GEMMs get tall enough; lm_head only for
  the rows that sample;
* attention: decode rows are memory-bound (their KV is read once per layer; an fp8
  cache at its own, lower, achieved bandwidth); prefill chunks are compute-bound
  (causal query-key pairs, cached prefix included); the new KV is written;
* TP: two ring all-reduces per layer of rows x hidden; PP: one activation send per
  stage boundary, layers split over stages and the pipeline treated as full (a step
  costs one stage plus a bubble share), so PP scales throughput, not token latency;
* overheads: a per-step CPU cost (scheduling, input preparation, sampling sync;
  mostly hidden by async scheduling), plus kernel launches where no CUDA graph
  covers the step: attention only for a mixed batch within the largest capture
  size (piecewise graphs); every compiled layer above the largest capture size.
  Those launches run ahead of the GPU, so they only show where they outlast the
  step's GPU work (max(launch, GPU)). With enforce_eager every layer runs as
  unfused PyTorch ops whose launches the GPU waits on, so they add to the GPU work
  (launch + GPU). The next step is scheduled once the launches are done
  (:attr:`StepBreakdown.launch_s`).
  Decode-only batches replay a full graph padded to the next capture size.

Constants were fitted on Llama-3.1-8B / H200 / vLLM 0.26 (docs/simulator.md);
:class:`orchestrator.study.spec.SimCalibration` multiplies them (1.0 = as fitted).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Optional

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import GpuSpec
from orchestrator.hardware.memory import (cudagraph_capture_sizes, dtype_bytes, kv_bytes_per_token, layers_per_rank,
                                          model_dtype)
from orchestrator.models.shapes import QUANT_WEIGHT_BITS, ModelShape
from orchestrator.sim.scheduler import BatchShape

# ---- constants fitted on one H200 (Llama-3.1-8B shape, vLLM 0.26, torch.compile + CUDA graphs),
# jointly on every warm engine-side measurement (benchmarks/fit_sim_h200.py: the 512-in / 128-out
# ingress runs of results/examples/h200-ingress, the capacity reference and the capacity study's
# levels, aborted levels left out; the six earlier cold runs of results/examples/h200-cold-runs at a
# lower weight), then rounded. "fitted" below means by that joint fit. docs/simulator.md
# ("Against the H200 capacity study") has the tables; tests/sim/ checks them.
# Of peak tensor FLOP/s for tall GEMMs (norms, rotary, SiLU folded in). The joint fit gave 0.62;
# the ingress runs' 8,192-token prefill steps (198-219 ms, ITL p99) allow at most ~0.60.
GEMM_EFFICIENCY = 0.60
# Rows at which GEMM efficiency is half its maximum: GEMMs a few hundred rows tall fill the
# SMs poorly (too few output tiles), so a 256-sequence decode step is partly compute-bound
# (fitted; the 256-sequence decode steps of the rate-inf ingress runs pin it).
GEMM_HALF_ROWS = 42
ATTN_EFFICIENCY = 0.45  # prefill attention FLOP/s efficiency (FlashAttention, causal; not fitted)
HBM_EFFICIENCY = 0.85  # achieved / peak HBM bandwidth for weight and KV streams (the fit left it at 0.84-0.85)
# Attention over an fp8 KV cache reads half the bytes, but not at the bf16 path's rate: the
# query is converted and the keys and values dequantized per layer, so the decode attention
# kernel runs well below the HBM roofline. Fitted on the study's four fp8 configurations
# (they decode no faster than bf16 ones at these ~600-token contexts).
FP8_KV_READ_EFFICIENCY = 0.52
# Per step left visible by async scheduling (CPU, sampler, kernel gaps). Fitted, at the bound
# the cold 16-sequence runs allow (their decode steps, 6.4-6.9 ms, are ~3.9 ms of weights).
STEP_OVERHEAD_S = 2.5e-3
PER_SEQ_OVERHEAD_S = 0.5e-6  # input preparation / output processing per scheduled request (not refitted)
# Without async scheduling the scheduler, input preparation and output processing run between
# steps (not fitted: vLLM's V1 notes give ~1-6 ms between steps without it).
SYNC_STEP_S = 1.5e-3
SYNC_PER_SEQ_S = 8e-6
PIECEWISE_LAYER_S = 15e-6  # attention launches per layer (mixed batch inside graphs; not fitted)
# A compiled step no CUDA graph covers (a batch above the largest capture size) is launched from
# Python layer by layer. CUDA runs the kernels as they are queued, so the launches cost only what
# they take beyond the step's GPU work: a small step is launch-bound, an 8,192-token prefill is
# GPU-bound. Cold fit's value as a launch time (the warm data has few such small steps).
NOGRAPH_LAYER_S = 200e-6
# enforce_eager: no torch.compile either, so every layer runs as a few dozen unfused PyTorch ops
# dispatched from Python. The GEMMs run behind their launches, but the many small kernels between
# them (norms, rotary, activations, cache writes) are launch-bound, so the GPU idles between
# them: this per-layer time adds to the step's GPU work instead of hiding behind it. Fitted on
# the study's three enforce_eager configurations (~7.7 ms a step over 32 layers).
EAGER_LAYER_S = 240e-6
PP_BUBBLE = 0.1  # per extra stage, share of a stage time lost to pipeline bubbles
# Client-visible latency outside the engine core (HTTP, tokenization, IPC, detokenization, SSE):
# a request reaches the engine this long after it is sent.
FRONTEND_LATENCY_S = 0.035  # fitted (the cold fit gave 31 ms)
# The API server streams the tokens of a step one after another (detokenize, SSE chunk): a
# token reaches the client this much after the one before it, in the engine's output order
# (running requests first, new ones last). Virtual mode only; served mode streams real HTTP.
FRONTEND_TOKEN_S = 50e-6  # measured: one step's tokens reach the client ~50-55 us apart (capacity reference)

_FP8_QUANT = {"fp8", "modelopt", "compressed-tensors"}


@dataclass(frozen=True)
class StepBreakdown:
    linear_s: float
    attention_s: float
    comm_s: float
    overhead_s: float
    total_s: float
    graph: str  # "full", "piecewise", "none", "eager"
    launch_s: float = 0.0  # CPU time launching the step's kernels: the next step is scheduled after it


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
        fp8_kv = (args.kv_cache_dtype or "auto").startswith("fp8")
        self.kv_read_bw = gpu.hbm_gbps * 1e9 * (FP8_KV_READ_EFFICIENCY if fp8_kv else HBM_EFFICIENCY) * b_eff
        # Attention FLOPs per causal (query, key) pair: QK^T and PV over this rank's heads.
        self.attn_flops_per_pair = 4 * layers * (model.num_attention_heads // tp) * model.head_dim

        self.capture_sizes = cudagraph_capture_sizes(args)
        self.max_capture = self.capture_sizes[-1] if self.capture_sizes else 0
        sync = not args.extra.get("async_scheduling", True)
        self.step_overhead_s = (STEP_OVERHEAD_S + (SYNC_STEP_S if sync else 0.0)) * o_mul
        self.per_seq_overhead_s = (PER_SEQ_OVERHEAD_S + (SYNC_PER_SEQ_S if sync else 0.0)) * o_mul
        self.piecewise_s = PIECEWISE_LAYER_S * layers * o_mul
        self.nograph_s = NOGRAPH_LAYER_S * layers * o_mul  # a compiled forward pass launched without a graph
        self.eager_s = EAGER_LAYER_S * layers * o_mul  # an eager forward pass: adds to the GPU work
        self.frontend_latency_s = FRONTEND_LATENCY_S * o_mul * f_mul
        self.frontend_token_s = FRONTEND_TOKEN_S * o_mul

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
        decode_attn = batch.decode_context * kvb / self.kv_read_bw
        prefill_attn = max(batch.prefill_attn_pairs * self.attn_flops_per_pair / self.attn_rate,
                           batch.prefill_context * kvb / self.kv_read_bw)
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
        # Compiled kernels' launches run ahead of the GPU: they show only beyond the GPU work they
        # launch. Eager launches do not (EAGER_LAYER_S): the GPU waits on them between the GEMMs.
        gpu = stage + comm
        if mode == "eager":
            launch = self.eager_s
            overhead += launch
        else:
            launch = {"piecewise": self.piecewise_s, "none": self.nograph_s}.get(mode, 0.0)
            overhead += max(0.0, launch - gpu)
        total = (gpu + overhead) * self.slowdown
        return StepBreakdown(linear, attention, comm, overhead, total, mode, min(launch * self.slowdown, total))

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
