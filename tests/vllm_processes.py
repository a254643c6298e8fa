"""vLLM processes of one test: the CPU vLLM test modules run at the same time on two workers,
so each finds its own engines by the cache folder it gave them (``VLLM_CACHE_ROOT`` is set in
the test's Ray runtime environment and inherited by every engine process)."""

from __future__ import annotations

from pathlib import Path

import psutil


def vllm_processes(cache_root: Path, *, kinds: tuple[str, ...] = ("EngineCore", "vllm.entrypoints")) -> list:
    """Live processes whose name or command line has one of ``kinds`` and whose environment
    points ``VLLM_CACHE_ROOT`` under ``cache_root``."""
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            text = (p.info["name"] or "") + " " + " ".join(p.info["cmdline"] or [])
            if not any(k in text for k in kinds) or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("VLLM_CACHE_ROOT", "").startswith(str(cache_root)):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def own_caches(monkeypatch, cache_root: Path) -> dict[str, str]:
    """Give this test's vLLM its own compile and model caches under ``cache_root`` (set here, and
    returned for the Ray runtime environment the engines inherit)."""
    env = {var: str(cache_root / sub) for var, sub in (("VLLM_CACHE_ROOT", "vllm"),
                                                       ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("HF_HOME", "hf"))}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return env
