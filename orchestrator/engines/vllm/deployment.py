"""What a deployed ``vllm`` trial is while it runs: health, teardown, and the wait for its memory.

Both ingresses' deployments (``serve_llm``: :class:`VllmDeployment`; ``engine``:
:class:`EngineModeDeployment`, whose replica runs ``vllm serve`` and keeps its log) are
Serve applications torn down by :class:`~orchestrator.engines.serve_app.AppDeployment`;
:class:`ReleaseCheck` makes the next trial wait until this one's memory is given back.
"""

from __future__ import annotations

import logging
import time
import urllib.request
from pathlib import Path
from typing import Optional

from orchestrator.engines.base import EngineEndpoint
from orchestrator.engines.serve_app import AppDeployment, app_state
from orchestrator.engines.vllm.logs import replica_log_tail
from orchestrator.engines.vllm.process import group_gone, tail
from orchestrator.measure.nvml import load_pynvml

log = logging.getLogger(__name__)


class ReleaseCheck:
    """What "released" means after a teardown: Ray's free units back to at least their level
    before the deploy, and (GPU nodes) device memory back near its level before the deploy."""

    def __init__(self, resource: str, gpu_slack_gib: float = 2.0):
        import ray

        self.resource = resource
        self.free_before = ray.available_resources().get(resource, 0.0)
        self.gpu_slack_gib = gpu_slack_gib
        self.mem_before = _gpu_memory_used_gib() if resource == "GPU" else None

    def wait(self, timeout_s: float) -> Optional[str]:
        import ray

        deadline = time.monotonic() + timeout_s
        free = mem = None
        while time.monotonic() < deadline:
            free = ray.available_resources().get(self.resource, 0.0)
            mem = _gpu_memory_used_gib() if self.mem_before is not None else None
            ray_ok = free + 1e-6 >= self.free_before
            mem_ok = mem is None or mem <= self.mem_before + self.gpu_slack_gib
            if ray_ok and mem_ok:
                return None
            time.sleep(1.0)
        parts = []
        if free is not None and free + 1e-6 < self.free_before:
            parts.append(f"Ray shows {free:g} free {self.resource}(s), {self.free_before:g} before the deploy")
        if mem is not None and mem > self.mem_before + self.gpu_slack_gib:
            parts.append(f"GPU memory in use {mem:.1f} GiB, {self.mem_before:.1f} GiB before the deploy")
        return f"not released {timeout_s:.0f} s after delete: " + "; ".join(parts)


def _gpu_memory_used_gib() -> Optional[float]:
    try:

        nv = load_pynvml()
        return sum(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used
                   for i in range(nv.nvmlDeviceGetCount())) / 2**30
    except Exception:  # noqa: BLE001 - no NVML here
        return None


class VllmDeployment(AppDeployment):
    def __init__(self, name: str, endpoint: EngineEndpoint, teardown_timeout_s: float,
                 release: Optional[ReleaseCheck] = None):
        super().__init__(name, endpoint, teardown_timeout_s)
        self.release = release

    def health(self) -> Optional[str]:
        """Why the engine is not healthy now (replica died or restarted), or None."""
        st = app_state(self.name)
        if st is None:
            return "application disappeared"
        bad = [f"{name}: {status} {message}".strip()
               for name, (status, message) in st.deployments.items() if status != "HEALTHY"]
        if st.status == "RUNNING" and not bad:
            try:
                with urllib.request.urlopen(self.endpoint.base_url + "/v1/models", timeout=10) as r:
                    if r.status == 200:
                        return None
            except Exception as e:  # noqa: BLE001
                bad.append(f"/v1/models failed: {e}")
        text = "; ".join(bad) or f"application {st.status}"
        logs = replica_log_tail(self.name, marker=self.endpoint.model)
        return (text + ("\n" + logs if logs else ""))[-6000:]

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)  # the application is deleted; then its resources must come back
        if self.release is not None:
            leak = self.release.wait(timeout_s=self.teardown_timeout_s)
            if leak:
                self._problems.append(leak)


class EngineModeDeployment(VllmDeployment):
    """Ingress ``engine``: health is the server's own; teardown also waits for its processes."""

    def __init__(self, name: str, endpoint: EngineEndpoint, teardown_timeout_s: float,
                 release: Optional[ReleaseCheck], handle, log_path: Optional[Path]):
        super().__init__(name, endpoint, teardown_timeout_s, release)
        self.handle = handle
        self.log_path = log_path

    def _log_tail(self) -> str:

        if self.log_path is not None:
            return tail(self.log_path, 80)
        try:
            return self.handle.log_tail.remote(80).result(timeout_s=10)
        except Exception:  # noqa: BLE001 - the replica is gone with its log
            return ""

    def health(self) -> Optional[str]:
        """None while ``vllm serve`` answers /health (vLLM says 503 once its engine core died)."""
        try:
            with urllib.request.urlopen(self.endpoint.base_url + "/health", timeout=20) as r:
                if r.status == 200:
                    return None
                why = f"/health answered {r.status}"
        except Exception as e:  # noqa: BLE001 - the server is gone or its engine is dead
            why = f"vllm serve /health failed: {e}"

        st = app_state(self.name)
        serve_says = st.failure_text() if st is not None else "application disappeared"
        return "\n".join(x for x in (why, serve_says, self._log_tail()) if x)[-6000:]

    def __exit__(self, *exc) -> None:

        super().__exit__(*exc)
        for pid in self.endpoint.pids:
            if not group_gone(pid, timeout_s=self.teardown_timeout_s):
                self._problems.append(f"vllm serve (pid {pid}) or its engine still running "
                                      f"{self.teardown_timeout_s:.0f} s after delete")
