"""How a trial can fail, and how what was seen maps to a kind and a status: the one classifier.

A failed configuration is a measurement ("this does not fit"), not a crash of the
study: the trial is recorded with its kind and the engine's own message. Every
classification lives here: an engine's start-up error text (:func:`classify_start_error`),
a failure under load (:func:`classify_load`), too many failed requests
(:func:`too_many_failures`), a lost trial process or an unwritten row (:func:`trial_lost`,
:func:`not_recorded`), a failure kind's trial status (:func:`status_of`), and the environment
problems that stop a study instead (:func:`storage_problem`).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Optional


class TrialStatus(str, Enum):
    COMPLETED = "completed"  # deployed and measured (SLOs may or may not be met)
    DEGRADED = "degraded"  # measured, but more requests failed than the study allows
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
    REQUEST_FAILURES = "request_failures"  # measured, but too many requests failed (degraded)
    EMPTY_WINDOW = "empty_window"  # the load ran, but no request was due in the measured window
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
    ("is smaller than max_model_len", FailureKind.INVALID_ARGS),  # vLLM's SchedulerConfig refusal
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


# Start-up failures caused by the configuration itself (vs. the engine misbehaving): infeasible.
CONFIG_FAILURES = frozenset({FailureKind.WEIGHTS_OOM, FailureKind.NO_KV_MEMORY, FailureKind.KV_CACHE_TOO_SMALL,
                             FailureKind.INVALID_ARGS})
# Request errors that mean the engine behind a live server died.
ENGINE_DEATH_MARKERS = ("EngineCore", "EngineDeadError", "engine dead", "engine died", "Engine loop has died")
MESSAGE_LIMIT = 4000  # characters of an engine's message kept in a row


@dataclass(frozen=True)
class Failure:
    """Why a trial did not complete (or, for a completed one, what went wrong after it)."""

    kind: FailureKind
    message: str

    def __post_init__(self):
        object.__setattr__(self, "message", self.message[-MESSAGE_LIMIT:])

    def columns(self) -> dict[str, str]:
        return {"failure_kind": self.kind.value, "failure_message": self.message}


def status_of(kind: FailureKind) -> TrialStatus:
    """The trial status a failure of this kind gives."""
    if kind in CONFIG_FAILURES:
        return TrialStatus.INFEASIBLE
    if kind is FailureKind.PREFLIGHT:
        return TrialStatus.PRUNED
    if kind is FailureKind.INTERNAL:
        return TrialStatus.ERROR
    if kind is FailureKind.TEARDOWN_LEAK:  # measured; the leak is a warning on a completed trial
        return TrialStatus.COMPLETED
    if kind is FailureKind.REQUEST_FAILURES:
        return TrialStatus.DEGRADED
    return TrialStatus.FAILED


def start_failure(e: EngineStartError) -> Failure:
    return Failure(e.kind, e.message)


def classify_load(*, health: Optional[str], errors: Iterable[Optional[str]], succeeded: int,
                  measured: int) -> Optional[Failure]:
    """A failure under load, from the engine's health after the load and the load's requests'
    errors (warm-up included; ``succeeded`` and ``measured`` count the measured requests); None
    when the load ran (some requests may still have failed: the metrics count them).

    An engine that died under load fails the trial even when Serve has since restarted the
    replica and later requests succeeded: the configuration is unstable under this load.
    """
    errors = [e for e in errors if e]
    death = next((e for e in errors if any(k in e for k in ENGINE_DEATH_MARKERS)), None)
    if health is not None:
        kind = classify_runtime_error(health)
        if kind is FailureKind.ENGINE_DIED and death is not None \
                and classify_runtime_error(death) is FailureKind.RUNTIME_OOM:
            # Serve stops a replica whose health check fails, so /health may already be gone when it
            # is read: a waiting request's error then holds the engine's own account of its death.
            return Failure(FailureKind.RUNTIME_OOM, f"{health}; a request's error: {death}")
        return Failure(kind, health)
    if death is not None:
        return Failure(classify_runtime_error(death), death)
    if measured and succeeded == 0:
        return Failure(FailureKind.UNRESPONSIVE, errors[0] if errors else "no request completed")
    return None


def error_rate(metrics) -> float:
    """The share of the measured requests that failed (0 when none was measured)."""
    return metrics.failed / metrics.num_requests if metrics.num_requests else 0.0


def too_many_failures(metrics, max_error_rate: float) -> bool:
    """The one error-rate rule: more than ``max_error_rate`` of the measured requests failed
    (exactly at the limit is allowed). A trial's (:func:`request_failures`) and a capacity level's."""
    return error_rate(metrics) > max_error_rate


def request_failures(metrics, max_error_rate: float, first_error: Optional[str] = None) -> Optional[Failure]:
    """A measured trial whose failed requests exceed ``max_error_rate`` of those measured: degraded,
    with the failures counted by kind (None: within the limit)."""
    if not too_many_failures(metrics, max_error_rate):
        return None
    kinds = {"timeout": metrics.failed_timeout, "http": metrics.failed_http, "connection": metrics.failed_connection,
             "bad response": metrics.failed_bad_response, "aborted": metrics.failed_aborted}
    counted = ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
    text = (f"{metrics.failed} of {metrics.num_requests} requests failed "
            f"({error_rate(metrics):.1%} > {max_error_rate:.1%})"
            + (f": {counted}" if counted else "") + (f"; first: {first_error}" if first_error else ""))
    return Failure(FailureKind.REQUEST_FAILURES, text)


def empty_window(metrics, warmup_s: float, cooldown_s: float) -> Optional[Failure]:
    """A load whose measured window holds no request measured nothing: failed, never completed
    with NaN latencies and no throughput (None: some request was measured)."""
    if metrics.num_requests:
        return None
    why = f": warmup_s ({warmup_s:g} s) and cooldown_s ({cooldown_s:g} s) left none of the load's requests" \
        if warmup_s > 0 or cooldown_s > 0 else ""
    return Failure(FailureKind.EMPTY_WINDOW, "no request in the measured window" + why)


def trial_lost(detail: str) -> Failure:
    """A trial whose process died for good (its node was lost): the orchestrator's failure, not
    the configuration's."""
    return Failure(FailureKind.INTERNAL, "trial process lost: " + detail)


def not_recorded(detail: str) -> Failure:
    """A trial whose row could not be written (a full disk): the study stops."""
    return Failure(FailureKind.INTERNAL, "result not recorded: " + detail)


def teardown_warning(problems: list[str]) -> Optional[Failure]:
    return Failure(FailureKind.TEARDOWN_LEAK, "; ".join(problems)) if problems else None


def storage_problem(e: BaseException) -> Optional[str]:
    """A full or read-only disk somewhere in ``e``'s chain (journal, Tune state, results), or None."""
    seen = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG):
            return f"{x.strerror or x}" + (f": {x.filename}" if x.filename else "")
        stack += [x.__cause__, x.__context__, getattr(x, "cause", None)]
    text = str(e)
    for marker in ("No space left on device", "Disk quota exceeded", "Read-only file system", "File too large"):
        if marker in text:
            return marker
    return None


def root_message(e: BaseException) -> str:
    """The innermost error line of an exception that may have crossed Ray processes."""
    text = str(getattr(e, "cause", None) or e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln[-500:]
    return (lines[-1] if lines else type(e).__name__)[-500:]


# vLLM's log prefixes: "(APIServer pid=12) " / "(EngineCore pid=3) " and "ERROR 12-03 09:40:01 [core.py:1374] ".
_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?"
                         r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ \[[^\]]*\]\s*)?")
_EXCEPTION = re.compile(r"(?:[\w.]+\.)?(\w*(?:Error|Exception))(?:\([^)]*\))?: (.+)")
# How a process that died of a signal says so (Python's faulthandler, Ray's C++ signal handler); the
# faulthandler's list of loaded modules after it says nothing about why.
_FATAL = re.compile(r"Fatal Python error: .+|\*\*\* SIG[A-Z]+ received|Segmentation fault")
# The line that says why, for the kinds that have a marker of their own. Invalid arguments have
# none: the last exception line says why (a marker such as "error" would pick warnings like
# "failed to increase ulimit with error [Errno 24]").
_MESSAGE_MARKERS = {
    FailureKind.KV_CACHE_TOO_SMALL: "max seq len",
    FailureKind.NO_KV_MEMORY: "No available memory for the cache blocks",
    FailureKind.WEIGHTS_OOM: "out of memory",
}


def engine_message(text: str) -> str:
    """The engine's own error from a failure text (Serve's message, a server log): the last line
    that starts with an exception, log prefixes removed. A pydantic ``ValidationError`` (how vLLM
    rejects engine arguments) is followed by the reason on the next line, which is kept. Without
    one, a process killed by a signal is named by the text's first line and how it died."""
    lines = [_LOG_PREFIX.sub("", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    for i in range(len(lines) - 1, -1, -1):
        m = _EXCEPTION.match(lines[i])
        if m and "ray.exceptions" not in lines[i] and "RayActorError" not in lines[i]:
            message = m.group(2).strip()
            if m.group(1) == "ValidationError" and i + 1 < len(lines):
                message += ": " + lines[i + 1].removeprefix("Value error, ")
            return message[:2000]
    fatal = [ln for ln in lines if _FATAL.match(ln)]
    if fatal and fatal[-1] != lines[0]:  # a crash: what the caller said first (which process), then how it died
        return f"{lines[0]} {fatal[-1]}"[:2000]
    return (lines[-1] if lines else "deployment failed")[:2000]


def best_message(text: str, kind: FailureKind) -> str:
    """The line of ``text`` that says why an engine of this failure kind did not start, as it wrote it."""
    key = _MESSAGE_MARKERS.get(kind)
    if key:
        for line in text.splitlines():
            if key.lower() in line.lower():
                # "(EngineCore pid=1) ERROR 12-02 16:40:43 [core.py:1374] ValueError: To serve..." -> the message
                m = re.search(r"(?:\w+(?:Error|Exception)): (.*)$", line)
                return (m.group(1) if m else line).strip()[:MESSAGE_LIMIT]
    return engine_message(text)


def start_failure_from_text(text: str, *, timed_out: bool = False) -> EngineStartError:
    """An engine that did not start, classified from everything it left (Serve's status, its log)."""
    kind = FailureKind.START_TIMEOUT if timed_out else classify_start_error(text)
    return EngineStartError(kind, best_message(text, kind))
