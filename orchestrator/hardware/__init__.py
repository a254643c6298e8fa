"""Devices and vLLM on them: the GPU catalog, engine arguments, the memory model, the start check, prices."""
