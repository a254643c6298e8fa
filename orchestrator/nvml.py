"""NVML bindings: ``pynvml`` (the nvidia-ml-py package), else the copy vLLM ships."""

from __future__ import annotations


def load_pynvml():
    """The pynvml module, initialised; raises if no NVIDIA driver is reachable."""
    try:
        import pynvml
    except ImportError:  # vLLM vendors the same bindings
        from vllm.third_party import pynvml  # type: ignore[no-redef]
    pynvml.nvmlInit()
    return pynvml
