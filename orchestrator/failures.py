"""How a trial can fail, and how an engine's error text maps to a kind.

A failed configuration is a measurement ("this does not fit"), not a crash of the
study: the trial is recorded with its kind and the engine's own message.
"""

from __future__ import annotations

from enum import Enum


class TrialStatus(str, Enum):
    COMPLETED = "completed"  # deployed and measured (SLOs may or may not be met)
    INFEASIBLE = "infeasible"  # the engine could not start with this configuration
    FAILED = "failed"  # started, then died or stopped answering under load
    PRUNED = "pruned"  # skipped by the pre-flight check: cannot fit, never started
    ERROR = "error"  # the orchestrator itself failed (a bug or the environment)


class FailureKind(str, Enum):
    WEIGHTS_OOM = "weights_oom"  # weights do not fit (CUDA OOM while loading)
    NO_KV_MEMORY = "no_kv_memory"  # nothing left for KV blocks after weights + activations
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"  # KV cache cannot hold one max_model_len sequence
    INVALID_ARGS = "invalid_args"  # vLLM rejected the argument combination
    START_TIMEOUT = "start_timeout"  # not ready within the start timeout
    START_CRASH = "start_crash"  # the engine died while starting, for another reason
    ENGINE_DIED = "engine_died"  # crashed under load
    RUNTIME_OOM = "runtime_oom"  # out of memory under load
    UNRESPONSIVE = "unresponsive"  # alive but every request failed / timed out
    TEARDOWN_LEAK = "teardown_leak"  # measured, but resources not released in time
    PREFLIGHT = "preflight"  # rejected before start by the feasibility model
    INTERNAL = "internal"  # orchestrator error


class EngineStartError(Exception):
    """An engine that could not start; ``kind`` says why, ``message`` is the engine's text."""

    def __init__(self, kind: FailureKind, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __reduce__(self):  # survive pickling across Ray processes
        return (EngineStartError, (self.kind, self.message))


# Ordered: the first pattern found in an engine's error text decides the kind.
_START_PATTERNS: list[tuple[str, FailureKind]] = [
    ("To serve at least one request with the model's max seq len", FailureKind.KV_CACHE_TOO_SMALL),
    ("larger than the available KV cache memory", FailureKind.KV_CACHE_TOO_SMALL),
    ("No available memory for the cache blocks", FailureKind.NO_KV_MEMORY),
    ("Free memory on device", FailureKind.NO_KV_MEMORY),
    ("CUDA out of memory", FailureKind.WEIGHTS_OOM),
    ("OutOfMemoryError", FailureKind.WEIGHTS_OOM),
    ("out of memory", FailureKind.WEIGHTS_OOM),
    ("Cannot allocate memory", FailureKind.WEIGHTS_OOM),
    ("is not divisible by", FailureKind.INVALID_ARGS),
    ("must be divisible by", FailureKind.INVALID_ARGS),
    ("ValidationError", FailureKind.INVALID_ARGS),
    ("validation error", FailureKind.INVALID_ARGS),
    ("Invalid", FailureKind.INVALID_ARGS),
    ("invalid", FailureKind.INVALID_ARGS),
    ("not supported", FailureKind.INVALID_ARGS),
    ("Unknown quantization", FailureKind.INVALID_ARGS),
    ("ValueError", FailureKind.INVALID_ARGS),
]


def classify_start_error(text: str) -> FailureKind:
    """Map an engine's start-up error text to a :class:`FailureKind`."""
    for pattern, kind in _START_PATTERNS:
        if pattern in text:
            return kind
    return FailureKind.START_CRASH


def classify_runtime_error(text: str) -> FailureKind:
    if "out of memory" in text.lower() or "OutOfMemoryError" in text:
        return FailureKind.RUNTIME_OOM
    return FailureKind.ENGINE_DIED
