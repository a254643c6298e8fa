"""HTTP load generation against OpenAI-compatible servers.

:mod:`.api` (the two streaming APIs and the :class:`Endpoint`), :mod:`.sse` (the event
stream parser), :mod:`.request` (one streaming request, the readiness probe) and
:mod:`.load_window` (a whole :class:`~orchestrator.workload.request_set.RequestSet` over one
load window: open or closed loop, sessions, a monitor that may stop it) after :mod:`.warmup_load`
(the warm-up burst and the steady warm-up).
"""

from orchestrator.loadgen.api import APIS, MAX_ERROR_CHARS, ApiFormat, Endpoint
from orchestrator.loadgen.load_window import LoadMonitor, ProgressFn, run_load, run_load_sync
from orchestrator.loadgen.request import send_request, wait_ready
from orchestrator.loadgen.sse import DONE, SSEParser

__all__ = [
    "APIS", "ApiFormat", "DONE", "Endpoint", "LoadMonitor", "MAX_ERROR_CHARS", "ProgressFn", "SSEParser",
    "run_load", "run_load_sync", "send_request", "wait_ready",
]
