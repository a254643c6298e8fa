"""Which engine class runs a study: one table keyed by ``engine.kind`` (and, for ``sim``, ``engine.mode``).

Like Optuna's samplers or GuideLLM's ``Backend.create``: the study file names a kind,
:func:`create_engine` builds the engine for it. Classes are named by import path and
imported on first use, so a study imports only its own engine's dependencies (the
served simulator needs FastAPI, the ``vllm`` engine ``ray.serve.llm``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from orchestrator.engines.base import Engine, EngineContext, EngineTarget


@dataclass(frozen=True)
class EngineEntry:
    kind: str  # engine.kind in the study file
    mode: Optional[str]  # engine.mode for kinds that have modes, else None
    target: str  # "module:Class"
    summary: str

    def load(self) -> type["Engine"]:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


ENGINES: tuple[EngineEntry, ...] = (
    EngineEntry("sim", "served", "orchestrator.engines.sim.served:ServedSimEngine",
                "simulated vLLM replica, one Ray Serve application per trial, real time"),
    EngineEntry("sim", "virtual", "orchestrator.engines.sim.virtual:VirtualSimEngine",
                "simulated vLLM in virtual time: no HTTP, no sleeping"),
    EngineEntry("vllm", None, "orchestrator.engines.vllm.serve:VllmServeEngine",
                "real vLLM (GPU or the CPU build), one Ray Serve application per trial"),
    EngineEntry("external", None, "orchestrator.engines.external:ExternalEngine",
                "an OpenAI-compatible endpoint that already runs"),
)


def engine_kinds() -> tuple[str, ...]:
    """The values ``engine.kind`` may take, in table order."""
    return tuple(dict.fromkeys(e.kind for e in ENGINES))


def engine_entry(kind: str, mode: Optional[str] = None) -> EngineEntry:
    """The entry for ``kind`` (and ``mode`` where the kind has modes; None: its first mode)."""
    entries = [e for e in ENGINES if e.kind == kind]
    if not entries:
        raise ValueError(f"unknown engine kind {kind!r}; allowed: {', '.join(engine_kinds())}")
    if mode is None:
        return entries[0]
    for e in entries:
        if e.mode == mode:
            return e
    modes = ", ".join(str(e.mode) for e in entries)
    raise ValueError(f"engine kind {kind!r} has no mode {mode!r}; allowed: {modes}")


def engine_class(spec) -> type["Engine"]:
    """The class that runs ``spec`` (a study's ``engine`` section)."""
    return engine_entry(spec.kind, getattr(spec, "mode", None)).load()


def create_engine(target: "EngineTarget", context: Optional["EngineContext"] = None) -> "Engine":
    """The engine the target names, told where the run's Serve and ledger are (``context``)."""
    return engine_class(target.engine)(target, context)
