"""Failures injected into the served simulator (``engine.faults``): chaos testing of a study.

Which faults a trial gets is decided on the driver side when it deploys
(:func:`faults_for_trial`, pure and seeded); the replica receives only those and acts
them out as vLLM fails:

==============  =====================================================  =================
kind            what the replica does                                  the trial records
==============  =====================================================  =================
start_crash     its constructor raises vLLM's start-up error after     failed, start_crash
                ``after_s`` seconds (Serve: DEPLOY_FAILED)
never_ready     its constructor never returns                          failed, start_timeout
crash           its process exits (``after_s`` after the first request, failed, engine_died
                or at the ``after_requests``-th), as a dead EngineCore
                takes vLLM's API server down
oom             the engine loop raises CUDA's out-of-memory error;     failed, runtime_oom
                waiting requests fail, /health answers 500 with it
ingress_delay   a slow serving path: streamed chunks pass one at a     completed,
                time, each taking ``after_s`` seconds (a proxy that    harness_bound
                moves 1/after_s chunks per second over all streams);
                the engine runs unchanged and its /metrics show it
==============  =====================================================  =================
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

log = logging.getLogger(__name__)

START_CRASH_MESSAGE = "Engine core initialization failed. See root cause above. (injected fault: start_crash)"
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
               "1.06 GiB is free. (injected fault: oom)")


class InjectedOutOfMemoryError(RuntimeError):
    """What the engine loop dies of under an ``oom`` fault (torch.OutOfMemoryError's text)."""


@dataclass(frozen=True)
class Fault:
    """One fault as the replica receives it (plain data: it crosses into the Serve replica)."""

    kind: str
    after_s: float = 0.0
    after_requests: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _draw(seed: int, trial_id: str, index: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, trial, fault): the same trial always draws the same."""
    digest = hashlib.sha256(f"{seed}:{trial_id}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _matches(when: Optional[dict[str, Any]], engine_args: dict[str, Any]) -> bool:
    for name, expected in (when or {}).items():
        allowed = expected if isinstance(expected, list) else [expected]
        if engine_args.get(name) not in allowed:
            return False
    return True


def faults_for_trial(faults: Sequence, engine_args: dict[str, Any], *, seed: int, trial_id: str) -> list[Fault]:
    """The study's ``engine.faults`` that apply to this trial (its engine arguments, its draw)."""
    out = []
    for i, f in enumerate(faults):
        if _matches(f.when, engine_args) and _draw(seed, trial_id, i) < f.probability:
            out.append(Fault(f.kind, f.after_s, f.after_requests))
    return out


def ingress_delay_s(faults: Sequence[Fault]) -> float:
    """Seconds the serving path spends per streamed chunk (``ingress_delay`` faults add up)."""
    return sum(f.after_s for f in faults if f.kind == "ingress_delay")


def act_on_start(faults: Sequence[Fault]) -> None:
    """In the replica's constructor, before the engine is built: crash or hang as told."""
    for f in faults:
        if f.kind == "start_crash":
            time.sleep(f.after_s)
            raise RuntimeError(START_CRASH_MESSAGE)
        if f.kind == "never_ready":
            log.warning("injected fault never_ready: the engine will not become ready")
            threading.Event().wait()  # until Serve kills the replica


class LoadFaults:
    """Arms the under-load faults of a ready replica: a per-request counter, and timers that start
    with the first request (under load, not at start-up: how long a start takes varies)."""

    def __init__(self, faults: Sequence[Fault], *, crash: Callable[[], None] = lambda: os._exit(1),
                 oom: Callable[[BaseException], None]):
        self._crash = crash
        self._oom = oom
        self._lock = threading.Lock()
        self._requests = 0
        load = [f for f in faults if f.kind in ("crash", "oom")]
        self._at_request = [f for f in load if f.after_requests is not None]
        self._timed = [f for f in load if f.after_requests is None]

    def on_request(self) -> None:
        """Called for every accepted request."""
        if not self._at_request and not self._timed:
            return
        with self._lock:
            self._requests += 1
            timed, self._timed = self._timed, []
        for f in timed:
            t = threading.Timer(f.after_s, self._fire, args=(f,))
            t.daemon = True
            t.start()
        with self._lock:
            due = [f for f in self._at_request if self._requests >= max(1, f.after_requests or 0)]
            self._at_request = [f for f in self._at_request if f not in due]
        for f in due:
            self._fire(f)

    def _fire(self, f: Fault) -> None:
        log.warning("injected fault %s fires", f.kind)
        if f.kind == "crash":
            self._crash()
        else:
            self._oom(InjectedOutOfMemoryError(OOM_MESSAGE))
