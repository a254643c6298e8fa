"""The ``sim`` engine in virtual time: same core, no HTTP, no sleeping.

A trial's whole load window is simulated in milliseconds, so thousands of
configurations can be scored in minutes (search experiments, shrinking a space
before spending GPU hours). Telemetry comes from the core's own counters.
"""

from __future__ import annotations

import dataclasses

from orchestrator.engines.base import Engine, EngineTarget, ResourceRequest
from orchestrator.engines.sim.served import sim_resolve
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.measure.measurement import LevelMeasurement
from orchestrator.measure.warmup import WarmupOutcome
from orchestrator.sim.core import SimEngineCore
from orchestrator.sim.virtual import simulate


class VirtualSimEngine(Engine):
    kind = "sim"
    serves_http = False
    deploys_on_serve = False

    def __init__(self, target: EngineTarget, context=None):
        super().__init__(target, context)
        self.model = dataclasses.replace(target.model_shape, name=target.model.name)  # named as the study names it
        self.gpu = get_gpu(target.hardware.gpu)

    def resolve(self, args: EngineArgs) -> EngineArgs:
        return sim_resolve(self.target, args)

    def resources(self, args: EngineArgs) -> ResourceRequest:
        return ResourceRequest("GPU", 0)  # nothing is deployed

    def measure(self, args: EngineArgs, requests) -> LevelMeasurement:

        core = SimEngineCore(self.model, self.gpu, args, self.target.engine.calibration, dtype=self.target.model.dtype)
        warmup = WarmupOutcome()
        records = simulate(core, requests, warmup_report=warmup, timeout_s=self.target.request_timeout_s)
        s = core.stats()
        queries = s.prefix_cache_queries_total
        telemetry = {
            "kv_cache_tokens": float(core.memory.kv_tokens),
            "kv_cache_gib": core.memory.kv_bytes / 2**30,
            "num_preemptions": float(s.num_preemptions_total),
            "prefix_cache_hit_rate": (s.prefix_cache_hits_total / queries) if queries else None,
            "startup_s": 0.0,
        }
        return LevelMeasurement(records, engine=telemetry, warmup=warmup)
