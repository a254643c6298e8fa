"""A stopped study stops: SIGTERM and SIGINT (Ctrl-C, ``ray job stop``, a CronJob's deadline, a
Kubernetes eviction) end the run gracefully, a second one at once; neither leaves an engine behind.

* **First signal.** The request is recorded, never raised inside whatever the driver runs then (an
  exception out of a signal handler in Ray's C++ calls comes back as a ``SystemError``): Tune's stopper
  stops every trial and Tune's loop (Tune's own SIGINT handler is switched off, so that SIGINT and
  SIGTERM take one path), and the driver raises :class:`StudyInterrupted` at its next checkpoint; on
  the way out it deletes every Serve application of the run (each replica's teardown ends its
  ``vllm serve`` process group, engine core and workers included:
  :mod:`orchestrator.engines.vllm.process`), stops the Ray it started, leaves the run resumable (the
  trials that were running run again next time) and exits with 128 + the signal and one line saying
  what was stopped.
* **Second signal.** No more bookkeeping: Ray is shut down (every replica with it, and every
  supervisor ends its engine's group) and the process exits at once.
* **SIGKILL of the driver.** Nothing runs; the engines still die with their replicas where Ray dies
  with the driver (a Ray the run started), and the next run of the study deletes the Serve
  applications of runs whose driver is gone (``search/driver._cleanup_apps``).
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

__all__ = ["StopRequest", "StudyInterrupted", "check", "rearm", "requested", "stop_on_signals"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_installed: list = []  # (handler, request) of the innermost active block: what rearm puts back


class StudyInterrupted(Exception):
    """The driver was told to stop (``signum``) outside Tune's loop."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.running = 0  # trials in flight when it came (the driver fills it in)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self, study: str) -> str:
        """What was stopped, in one line."""
        return (f"study {study} {self}: {self.running} trial(s) in flight stopped (they run again when the run "
                f"resumes); the run's Serve applications deleted and their engines ended. Run the same command "
                f"again to resume.")


@dataclass
class StopRequest:
    """Which signal asked the run to stop (None: none yet), and what a second one runs before exiting."""

    signum: Optional[int] = None
    count: int = 0
    hard_stop: list = field(default_factory=list)


def _shutdown_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """SIGTERM and SIGINT handled as the module docstring says, for the block's duration (main thread
    only; elsewhere the block runs with the signals as they were)."""
    request = StopRequest(hard_stop=[_shutdown_ray])
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, frame):
        request.count += 1
        if request.count > 1:  # the second: no bookkeeping, but the engines still end
            for step in request.hard_stop:
                step()
            os._exit(128 + signum)
        request.signum = signum

    # Tune installs a SIGINT handler of its own while its loop runs (stop after saving, a second press
    # aborts): one path for both signals instead, this one.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    _installed.append((handler, request))
    try:
        yield request
    finally:
        _installed.remove((handler, request))
        for s, h in previous.items():
            signal.signal(s, h)


def rearm() -> None:
    """Put the active block's handler back: connecting to Ray installs a handler of Ray's own for SIGTERM
    (it logs a native stack and aborts the driver), so the driver calls this once Ray is up."""
    if _installed and threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _installed[-1][0])


def requested() -> Optional[int]:
    """The signal that asked the run to stop, or None (no block active, or no signal yet)."""
    return _installed[-1][1].signum if _installed else None


def check() -> None:
    """Raise :class:`StudyInterrupted` if a stop was asked for: the driver's checkpoints call it."""
    signum = requested()
    if signum is not None:
        raise StudyInterrupted(signum)
