"""A vLLM replica's log, read back: the failure classifier's text and the engine's KV-cache size.

vLLM's engine core runs in a child process whose traceback only reaches the replica's
log. :func:`replica_log_tail` finds it through Ray's state API or this node's log folder;
:func:`kv_cache_facts` reads the KV cache vLLM allocated (and
:func:`orchestrator.engines.vllm.start_log.start_phases` where the start's seconds went).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Callable, Optional

from orchestrator.engines.vllm.process import ray_logs_dir
from orchestrator.engines.vllm.start_log import is_phase_line

log = logging.getLogger(__name__)


def this_node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def local_logs_dir() -> Path:

    return ray_logs_dir()


def replica_log_tail(app_name: str, lines: int = 400, *, marker: Optional[str] = None,
                     since: Optional[float] = None, keep: Optional[Callable[[str], bool]] = None,
                     max_lines: Optional[int] = None) -> str:
    """Lines of the app's replica logs that say why (errors, memory, KV cache; or those ``keep``
    keeps), the last ``max_lines`` of them, best effort: through Ray's state API (needs the
    dashboard), else this node's Ray log files."""
    keep = keep or _interesting
    text = _state_api_log_tail(app_name, lines, keep, max_lines or 60)
    if not text and marker:
        text = _local_log_tail(marker, since=since, keep=keep, max_lines=max_lines or 80)
    return text


def start_fact_line(line: str) -> bool:
    """A line the start's facts are read from: its KV-cache size, its phases."""
    return _interesting(line) or is_phase_line(line)


def _local_log_tail(marker: str, *, since: Optional[float] = None, max_bytes: int = 4_000_000,
                    keep: Callable[[str], bool], max_lines: int) -> str:
    """Worker log files of this node's Ray session that mention ``marker`` (e.g. the model id,
    which vLLM prints at start-up); the engine core writes to its replica's files."""
    try:
        import ray

        logs = Path(ray._private.worker._global_node.get_logs_dir_path())  # noqa: SLF001 - no public API
    except Exception:  # noqa: BLE001 - not the driver's node / no session
        return ""
    out: list[str] = []
    for path in sorted(logs.glob("worker-*"), key=lambda p: p.stat().st_mtime):
        try:
            if since is not None and path.stat().st_mtime < since:
                continue
            data = path.read_bytes()[-max_bytes:].decode("utf-8", "replace")
        except OSError:
            continue
        if marker in data:
            out += [ln for ln in data.splitlines() if keep(ln)]
    return "\n".join(out[-max_lines:])


def _state_api_log_tail(app_name: str, lines: int, keep: Callable[[str], bool], max_lines: int) -> str:
    try:
        from ray.util.state import get_log, list_actors

        # The state API filters by equality only; replica class names carry the deployment
        # name ray.serve.llm derives ("ServeReplica:<app>:LLMServer:<model id>").
        prefix = f"ServeReplica:{app_name}:"
        actors = [a for a in list_actors(detail=False, limit=5000, raise_on_missing_output=False)
                  if str(_field(a, "class_name") or "").startswith(prefix)]
        out: list[str] = []
        for a in actors:
            aid = _field(a, "actor_id")
            for suffix in ("err", "out"):
                try:
                    text = "".join(get_log(actor_id=aid, tail=lines, suffix=suffix, timeout=10))
                except Exception:  # noqa: BLE001 - log not available on this node/version
                    continue
                out += [ln for ln in text.splitlines() if keep(ln)]
        return "\n".join(out[-max_lines:])
    except Exception as e:  # noqa: BLE001
        log.debug("no replica logs for %s: %s", app_name, e)
        return ""


def kv_cache_facts(log_text: str) -> dict[str, float]:
    """The KV-cache size vLLM logged at start-up ("GPU KV cache size: N tokens", "Available
    KV cache memory: X GiB"): the numbers the pre-flight estimate is checked against."""
    out: dict[str, float] = {}
    tokens = re.findall(r"KV cache size: ([\d,]+) tokens", log_text)
    if tokens:
        out["kv_cache_tokens"] = float(tokens[-1].replace(",", ""))
    gib = re.findall(r"Available KV cache memory: ([\d.]+) GiB", log_text)
    if gib:
        out["kv_cache_gib"] = float(gib[-1])
    return out


def _field(obj, name: str):
    return getattr(obj, name, None) if not isinstance(obj, dict) else obj.get(name)


def _interesting(line: str) -> bool:
    keys = ("Error", "error", "memory", "Memory", "KV cache", "max seq len", "Traceback", "raise ", "divisible",
            "not supported", "Killed", "died", "exited")
    return any(k in line for k in keys)
