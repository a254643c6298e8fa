"""What one trial runs, resolved once: the plan every step of a trial reads instead of the study.

The search builds a :class:`TrialPlan` per trial (:func:`orchestrator.search.trial_plan.plan_trial`,
the one resolver of engine arguments for trials, screening, stages and the survey alike); the
trial, its load phase, its capacity search and its probe take the plan or its parts. A plan is
frozen and picklable: what a trial does is decided before it starts, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Optional

from orchestrator.hardware.accelerator import DeviceDefaults
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.measure.engine_noise import NO_START_NOISE, NO_WINDOW_NOISE, WindowNoise
from orchestrator.measure.metrics import RequestSLO
from orchestrator.models.shapes import ModelShape
from orchestrator.study.capacity import CapacitySpec
from orchestrator.study.goals import Constraint
from orchestrator.study.probe import ProbeSpec
from orchestrator.workload.generate import build_requests
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.spec import WorkloadSpec

__all__ = ["LoadPlan", "ProbePlan", "TrialPlan"]


@lru_cache(maxsize=16)
def _requests_for(workload_json: str, seed: int, vocab_size: int, base_dir: Optional[str], level: int,
                  replicate: int) -> RequestSet:
    return build_requests(WorkloadSpec.model_validate_json(workload_json), seed, vocab_size, base_dir, level,
                          replicate)


@dataclass(frozen=True)
class LoadPlan:
    """What a trial's load phase needs: the workload and the seed it is drawn with, the model's
    vocabulary, the SLOs a request and a capacity level are judged by, and the capacity search."""

    workload: WorkloadSpec
    seed: int  # the measurement's own (a configuration measured again draws other requests)
    vocab_size: int
    request_slo: RequestSLO
    base_dir: Optional[str] = None  # the study file's folder: relative trace and dataset paths
    capacity: Optional[CapacitySpec] = None
    capacity_slo: tuple[Constraint, ...] = ()
    interval_metrics: tuple[str, ...] = ()  # the load metrics the row gets an interval of
    paired_metrics: tuple[str, ...] = ()  # the load metrics trials are compared by: the row keeps their draws
    max_error_rate: float = 0.0
    window_noise: WindowNoise = NO_WINDOW_NOISE  # the engine's, added to every latency interval
    start_noise: WindowNoise = NO_START_NOISE  # the engine's between starts (a prior, or the study's replicates)
    start_noise_source: str = ""  # where start_noise comes from, as the row states it
    noise_seed: int = 0  # this trial's own: window and start noise drawn for it, never shared with another trial
    beat_rate: Optional[float] = None  # capacity search: stop once decided below this (the best trial's low bound)

    def requests(self, workload: Optional[WorkloadSpec] = None, *, level: int = 0,
                 replicate: int = 0) -> RequestSet:
        """The request set of the workload, or of ``workload`` (a capacity level's, with its ``level``:
        prompts of its own; ``replicate``: the level measured again, a fresh draw); cached per
        process: every trial replays the same requests."""
        return _requests_for((workload or self.workload).model_dump_json(), self.seed, self.vocab_size,
                             self.base_dir, level, replicate)


@dataclass(frozen=True)
class ProbePlan:
    """The reference-agreement probe of a trial (:mod:`orchestrator.trial.probe`)."""

    spec: ProbeSpec
    vocab_size: int
    seed: int
    reference: str  # what agreement is evidence of: ``dummy`` weights, real ``weights``, an ``endpoint``
    results_dir: str  # where the answers are kept when no run's writer is around: the study's output
    study_name: str


@dataclass(frozen=True)
class TrialPlan:
    """One trial, decided: which configuration, resolved how, on what, measured how."""

    trial_id: str
    trial_number: int
    params: Mapping[str, Any]
    args: EngineArgs  # resolved: vLLM's defaults on the device filled in
    model: ModelShape
    device: DeviceDefaults  # the GPU (None: vLLM's CPU build) and the defaults that resolved ``args``
    load: LoadPlan
    measurement: int = 0  # > 0: the configuration measured again (racing), with a seed of its own
    refusal: Optional[str] = None  # the pre-flight's "[kind] reason" when the configuration cannot start
    probe: Optional[ProbePlan] = None
    price_per_gpu_hour: Optional[float] = None
