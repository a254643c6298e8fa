"""NVML bindings: ``pynvml`` (the nvidia-ml-py package), else the copy vLLM ships."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


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
        import pynvml
    except ImportError:
        pynvml = _vllm_pynvml()
    pynvml.nvmlInit()
    return pynvml
