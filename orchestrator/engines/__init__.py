"""Engines: what turns one configuration into something the load generator can measure.

:mod:`~orchestrator.engines.base` defines the interface and its call order;
:mod:`~orchestrator.engines.registry` maps ``engine.kind`` to the class that runs it.
"""

from orchestrator.engines.base import Deployment, Engine, EngineContext, EngineEndpoint, EngineTarget, ResourceRequest
from orchestrator.engines.registry import ENGINES, EngineEntry, create_engine, engine_class, engine_kinds

__all__ = ["ENGINES", "Deployment", "Engine", "EngineContext", "EngineEndpoint", "EngineEntry", "EngineTarget", "ResourceRequest",
           "create_engine",
           "engine_class", "engine_kinds"]
