"""The simulated vLLM engine core: scheduler + KV cache + step-time model, one step at a time.

Both modes use this class: the served Ray Serve deployment (real time: it sleeps
each step's duration) and the virtual-time simulator (it only advances a clock).
The core owns no clock: :meth:`SimEngineCore.step` says how long the step took and
the caller advances its own time by it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from orchestrator.hardware.accelerator import with_device_defaults
from orchestrator.hardware.engine_args import EngineArgs, ceil_div
from orchestrator.hardware.gpus import GpuSpec
from orchestrator.hardware.memory import MemoryPlan
from orchestrator.hardware.start import start_plan
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.cost import StepCostModel
from orchestrator.sim.scheduler import SchedRequest, Scheduler


@dataclass(frozen=True)
class SimRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    arrival_s: float = 0.0
    priority: int = 0  # scheduling_policy="priority": lower runs first


@dataclass(slots=True)
class TokenOutput:
    """What one step did for one request: 1 new token, or 0 for a prefill chunk that did not end the prompt."""

    request_id: str
    new_tokens: int
    finished: bool
    num_prompt_tokens: int
    num_cached_tokens: int


@dataclass
class StepResult:
    duration_s: float
    outputs: list[TokenOutput]
    num_scheduled_tokens: int
    num_running: int
    num_waiting: int
    num_preempted: int


@dataclass(frozen=True)
class EngineStats:
    """Cumulative counters and current gauges, named after vLLM's /metrics."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float
    num_preemptions_total: int
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    prompt_tokens_total: int  # vllm:prompt_tokens: prompt lengths of requests that started generating
    generation_tokens_total: int
    steps_total: int
    busy_time_s: float
    prompt_tokens_computed_total: int = 0  # prefill rows actually run, recomputation included
    prompt_tokens_cached_total: int = 0  # vllm:prompt_tokens_cached


class SimEngineCore:
    """One simulated vLLM replica (TP x PP GPUs). The constructor fails like vLLM's start-up."""

    def __init__(self, model: ModelShape, gpu: GpuSpec, args: EngineArgs, calibration=None, dtype: str = "auto"):
        if args.max_num_seqs is None or args.max_model_len is None:
            args = with_device_defaults(args, gpu, model_max_len=model.max_position_embeddings)
        self.model, self.gpu, self.args = model, gpu, args
        # The pre-flight's own decision (one function): the simulator refuses exactly what it prunes.
        self.memory: MemoryPlan = start_plan(model, gpu, args, dtype)
        num_blocks = self.memory.num_blocks
        override = args.extra.get("num_gpu_blocks_override")
        if override:
            num_blocks = int(override)  # as vLLM's num_gpu_blocks_override (tests: tiny caches)
        self.num_blocks = num_blocks
        self.cost = StepCostModel(model, gpu, args, calibration, dtype)
        self.scheduler = Scheduler(args, num_blocks)
        self._uids = itertools.count(1)
        self._steps = 0
        self._busy = 0.0
        self._prompt_tokens = 0
        self._prompt_cached = 0
        self.async_scheduling = bool(args.extra.get("async_scheduling", True))
        self._inflight = None  # (SchedulerOutput, duration) scheduled, not yet run

    # ---------------------------------------------------------------- requests
    def add_request(self, request: SimRequest) -> None:
        n_prompt = len(request.prompt_token_ids)
        limit = int(self.args.max_model_len)
        if n_prompt < 1:
            raise ValueError("The prompt cannot be empty.")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {request.max_tokens}.")
        if n_prompt + request.max_tokens > limit:
            raise ValueError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n_prompt + request.max_tokens} tokens ({n_prompt} in the messages, {request.max_tokens} in "
                f"the completion). Please reduce the length of the messages or completion.")
        if ceil_div(n_prompt + request.max_tokens, self.scheduler.block_size) > self.num_blocks - 1:
            # Only reachable with num_gpu_blocks_override: vLLM would wait forever.
            raise ValueError(f"request needs more KV blocks than the cache has ({self.num_blocks - 1})")
        self.scheduler.add_request(SchedRequest(request.request_id, next(self._uids), request.prompt_token_ids,
                                                request.max_tokens, request.priority, request.arrival_s))

    def abort_request(self, request_id: str) -> bool:
        return self.scheduler.abort(request_id)

    def has_work(self) -> bool:
        return self._inflight is not None or self.scheduler.has_work()

    # ---------------------------------------------------------------- stepping
    def _schedule(self):
        out = self.scheduler.schedule()
        if not len(out):
            if not out.preempted:
                return None
            # A running request preempted itself: an empty step, then the queue moves on.
            return out, self.cost.step_overhead_s * self.cost.slowdown, 0.0
        b = self.cost.breakdown(out.shape)
        return out, b.total_s, b.launch_s

    def step(self, before_next: Optional[Callable[[float], None]] = None) -> StepResult:
        """Run one engine step from now; the caller advances its clock by ``duration_s``.

        With async scheduling (vLLM's default; ``extra={"async_scheduling": False}``
        turns it off) the step that runs now was scheduled while the previous one
        ran, and the one after it is scheduled once this step's kernels are launched,
        before its output is processed: requests that reach the engine after that
        join one step later, and requests finishing now still hold their slot in
        that schedule. ``before_next(launch_s)``, when given, is called just before
        that scheduling with the step's launch time (its CPU time before the next
        step can be scheduled: near zero for a CUDA-graph replay, the whole Python
        launch without graphs), so a caller with a clock can add the requests that
        arrived meanwhile; without it they join one step later.
        """
        sched = self.scheduler
        batch = self._inflight
        if batch is None:
            if not sched.has_work():
                return StepResult(0.0, [], 0, len(sched.running), sched.num_waiting, 0)
            batch = self._schedule()
            if batch is None:
                raise RuntimeError("scheduler made no progress (KV cache cannot hold the waiting request)")
        out, duration, launch = batch
        if self.async_scheduling:
            if before_next is not None:
                before_next(launch)
            self._inflight = self._schedule()
        else:
            self._inflight = None
        outputs = []
        for req, new, finished in sched.update(out):
            if new and req.num_delivered == 1:  # first token: the prompt counts in vllm:prompt_tokens
                self._prompt_tokens += req.num_prompt_tokens
                self._prompt_cached += max(0, req.num_cached_tokens)
            outputs.append(TokenOutput(req.request_id, new, finished, req.num_prompt_tokens,
                                       max(0, req.num_cached_tokens)))
        self._steps += 1
        self._busy += duration
        return StepResult(duration, outputs, out.shape.num_tokens, len(sched.running), sched.num_waiting,
                          len(out.preempted))

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_requests_running=len(s.running), num_requests_waiting=s.num_waiting,
            kv_cache_usage=s.kv.usage(), num_preemptions_total=s.num_preemptions,
            prefix_cache_queries_total=s.prefix_cache_queries, prefix_cache_hits_total=s.prefix_cache_hits,
            prompt_tokens_total=self._prompt_tokens, generation_tokens_total=s.generation_tokens,
            steps_total=self._steps, busy_time_s=self._busy,
            prompt_tokens_computed_total=s.prompt_tokens_computed, prompt_tokens_cached_total=self._prompt_cached)
