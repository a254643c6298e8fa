"""What a study runs on, decided once: CPUs (vLLM's CPU build) or a GPU from the catalog,
and the engine arguments vLLM defaults to there.

vLLM picks its token budget, batch size and block size from the device
(:meth:`EngineArgs.resolved`). The pre-flight, the simulator and every engine resolve
through here, so a configuration is judged with the same arguments it runs with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import GpuSpec

CPU = "CPU"  # hardware.gpu of a study that runs vLLM's CPU build


def runs_on_cpu(engine_spec, gpu: str) -> bool:
    """Whether an engine section and a ``hardware.gpu`` name mean CPUs: ``engine.platform: cpu``
    or ``hardware.gpu: CPU``."""
    return getattr(engine_spec, "platform", None) == "cpu" or gpu.upper() == CPU


def with_device_defaults(args: EngineArgs, gpu: Optional[GpuSpec], *, model_max_len: Optional[int]) -> EngineArgs:
    """``args`` with vLLM's device-dependent defaults filled in for ``gpu`` (None: CPU)."""
    if gpu is None:  # vLLM-CPU's defaults do not depend on the memory size
        return args.resolved(device_memory_gib=0, platform="cpu", model_max_len=model_max_len)
    return args.resolved(device_memory_gib=gpu.memory_gib, device_name=gpu.name, platform="cuda",
                         model_max_len=model_max_len)


@dataclass(frozen=True)
class DeviceDefaults:
    """One model on one device, decided once: the one resolver of engine arguments (trials,
    screening, stages and the survey alike), so a configuration is judged with the arguments
    it runs with."""

    gpu: Optional[GpuSpec]  # the catalog's GPU that ``hardware.gpu`` names (None: ``CPU``)
    on_cpu: bool  # vLLM's CPU build serves (``engine.platform: cpu`` or ``hardware.gpu: CPU``)
    model_max_len: Optional[int]  # the model's own maximum context
    model_dtype: str = "auto"  # ``model.dtype`` of the study

    def resolve(self, args: EngineArgs) -> EngineArgs:
        """``args`` with the device's defaults filled in."""
        cpu = self.on_cpu
        if args.dtype == "auto" and self.model_dtype != "auto":
            args = dataclasses.replace(args, dtype=self.model_dtype)
        elif args.dtype == "auto" and cpu:
            # No native bf16 on most CPUs: float32 (bfloat16 was ~10x slower on AVX2).
            args = dataclasses.replace(args, dtype="float32")
        return with_device_defaults(args, None if cpu else self.gpu, model_max_len=self.model_max_len)
