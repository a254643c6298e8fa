"""NVML: the bindings (``pynvml``, the nvidia-ml-py package, else the copy vLLM ships) and a
sampler of the GPUs' memory, utilisation, power and energy."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)


def _vllm_pynvml():
    """vLLM's bundled pynvml, loaded from its file (importing the vllm package takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("neither nvidia-ml-py nor vllm is installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "third_party" / "pynvml.py"
    mod_spec = importlib.util.spec_from_file_location("_orchestrator_pynvml", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module  # it looks itself up there while loading
    mod_spec.loader.exec_module(module)
    return module


def load_pynvml():
    """The pynvml module, initialised; raises if no NVIDIA driver is reachable."""
    try:
        import pynvml  # deferred: optional (nvidia-ml-py); else the copy vLLM ships
    except ImportError:
        pynvml = _vllm_pynvml()
    pynvml.nvmlInit()
    return pynvml


class NvmlSampler:
    """Memory, utilisation, power and energy of the given GPU indices (all if None)."""

    def __init__(self, indices: Optional[list[int]] = None):
        pynvml = load_pynvml()
        self.nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (indices or range(count))]
        self.energy0 = self._energy()

    def _energy(self) -> Optional[float]:
        try:
            return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1000.0
        except Exception:  # noqa: BLE001 - not all GPUs expose the counter
            return None

    def sample(self) -> dict[str, float]:
        mem = sum(self.nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles) / 2**30
        util = sum(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles) / len(self.handles)
        try:
            power = sum(self.nvml.nvmlDeviceGetPowerUsage(h) for h in self.handles) / 1000.0
        except Exception:  # noqa: BLE001
            power = None
        return {"mem_gib": mem, "util": util, "power_w": power}

    def energy_j(self) -> Optional[float]:
        e = self._energy()
        return (e - self.energy0) if (e is not None and self.energy0 is not None) else None


def try_nvml(indices: Optional[list[int]] = None) -> Optional[NvmlSampler]:
    try:
        return NvmlSampler(indices)
    except Exception as e:  # noqa: BLE001 - no driver / no GPU: telemetry stays null
        log.debug("NVML unavailable: %s", e)
        return None
