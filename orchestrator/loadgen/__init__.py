"""HTTP load generation against OpenAI-compatible servers (see :mod:`.client`)."""

from orchestrator.loadgen.client import (
    APIS,
    MAX_ERROR_CHARS,
    ApiFormat,
    Endpoint,
    LoadMonitor,
    ProgressFn,
    run_load,
    run_load_sync,
    send_request,
    wait_ready,
)
from orchestrator.loadgen.sse import DONE, SSEParser

__all__ = [
    "APIS", "ApiFormat", "DONE", "Endpoint", "LoadMonitor", "MAX_ERROR_CHARS", "ProgressFn", "SSEParser",
    "run_load", "run_load_sync", "send_request", "wait_ready",
]
