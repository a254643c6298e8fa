"""Accelerator catalog: the numbers the simulator's roofline and memory model use.

``memory_mib`` is what the driver reports as total (``nvidia-smi``); peak FLOP/s are
dense tensor-core figures from the vendors' data sheets; ``interconnect_gbps`` is
the per-GPU all-reduce bandwidth between GPUs of one node (NVLink, else PCIe).
The H200 entry was checked against the reference run in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_mib: int
    hbm_gbps: float  # GB/s, 1e9 bytes
    bf16_tflops: float  # dense
    fp8_tflops: Optional[float]  # None: no native FP8 (FP8 weights run as W8A16)
    interconnect_gbps: float  # GB/s per GPU within a node
    ray_accelerator_type: str  # ray.util.accelerators name
    compute_capability: int  # major * 10 + minor, as vLLM compares it with a kernel's minimum
    supports_bf16: bool = True
    # NVLink / PCIe all-reduce latency per call (seconds).
    allreduce_latency_s: float = 8e-6

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in [
        GpuSpec("T4", 15360, 320, 65, None, 16, "T4", 75, supports_bf16=False, allreduce_latency_s=25e-6),
        GpuSpec("A10G", 23028, 600, 70, None, 16, "A10G", 86, allreduce_latency_s=25e-6),
        GpuSpec("L4", 23034, 300, 121, 242, 16, "L4", 89, allreduce_latency_s=25e-6),
        GpuSpec("L40S", 46068, 864, 362, 733, 32, "L40S", 89, allreduce_latency_s=20e-6),
        GpuSpec("A100-40GB", 40960, 1555, 312, None, 300, "A100-40G", 80),
        GpuSpec("A100-80GB", 81920, 2039, 312, None, 300, "A100-80G", 80),
        GpuSpec("H100-80GB", 81559, 3350, 989, 1979, 450, "H100", 90),
        GpuSpec("H200", 143771, 4800, 989, 1979, 450, "H200", 90),
        GpuSpec("B200", 183359, 8000, 2250, 4500, 900, "B200", 100),
    ]
}

_ALIASES = {
    "H100": "H100-80GB", "H100-SXM": "H100-80GB", "A100": "A100-80GB", "A100-80G": "A100-80GB",
    "A100-40G": "A100-40GB", "H200-141GB": "H200",
}


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by catalog name (case-insensitive; a few aliases)."""
    key = {k.upper(): k for k in GPUS}.get(name.upper()) or _ALIASES.get(name.upper())
    if key is None:
        close = difflib.get_close_matches(name, list(GPUS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown GPU {name!r}{hint}; known: {', '.join(GPUS)}")
    return GPUS[key]
