"""A stopped study stops: SIGTERM and SIGINT (Ctrl-C, ``ray job stop``, a CronJob's deadline, a
Kubernetes eviction) end the run gracefully, a second one at once; neither leaves an engine behind.

* **First signal.** The request is recorded, never raised inside whatever the driver runs then (an
  exception out of a signal handler in Ray's C++ calls comes back as a ``SystemError``). At once, in a
  thread of its own, what the driver registered with :func:`ending` runs: the run's writer takes no
  more rows and Serve's controller is asked to delete every application of the run, without waiting
  (each replica's teardown ends its ``vllm serve`` process group, engine core and workers included:
  :mod:`orchestrator.engines.vllm.process`), so the engines end even if the driver is killed a moment
  later (``ray job stop`` sends SIGKILL 3 s after SIGTERM). Tune's stopper stops every trial and
  Tune's loop (Tune's own SIGINT handler is switched off, so that SIGINT and SIGTERM take one path),
  and the driver raises :class:`StudyInterrupted` at its next checkpoint; on the way out it waits
  until the run's Serve applications are gone, marks the trials that were running interrupted (they
  run again when the run resumes), stops the Ray it started and exits with 128 + the signal and one
  line saying what was stopped.
* **Second signal.** No more bookkeeping: once the deletions were asked for (10 s at most),
  Ray is shut down (every replica with it where the run started Ray, and every supervisor ends its
  engine's group) and the process exits at once.
* **SIGKILL of the driver.** Nothing runs; the engines still die with their replicas where Ray dies
  with the driver (a Ray the run started), and the next run of the study deletes the Serve
  applications of runs whose driver is gone (``search/resume.cleanup_apps``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

__all__ = ["StopRequest", "StudyInterrupted", "check", "ending", "rearm", "requested", "stop_on_signals"]

log = logging.getLogger(__name__)

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
    """Which signal asked the run to stop (None: none yet), and what a second one runs before exiting.
    ``signalled``: set by the first signal (:func:`ending`'s thread waits for it); ``first_pass``: set once
    each step registered with :func:`ending` has run once; ``ending``: how many registrations are active."""

    signum: Optional[int] = None
    count: int = 0
    hard_stop: list = field(default_factory=list)
    signalled: threading.Event = field(default_factory=threading.Event)
    first_pass: threading.Event = field(default_factory=threading.Event)
    ending: int = 0


# How long a second signal waits for the first one's :func:`ending` steps to have run once.
SECOND_SIGNAL_WAIT_S = 10.0


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
            if request.ending:  # the deletions the first signal asked for (their thread needs no lock of ours)
                request.first_pass.wait(SECOND_SIGNAL_WAIT_S)
            for step in request.hard_stop:
                step()
            os._exit(128 + signum)
        request.signum = signum
        request.signalled.set()

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


@contextmanager
def ending(step: Callable[[], None], every_s: float = 1.0) -> Iterator[None]:
    """While the block runs, a stop signal (one already recorded included) runs ``step`` at once in a thread
    of its own, and again every ``every_s`` until the block ends (what a trial deployed meanwhile left is
    caught too): what must happen even if the driver is killed a moment later. ``step`` logs its own
    trouble; an exception out of it is logged and the next pass tries again. Outside a
    :func:`stop_on_signals` block (or off the main thread), the block runs with nothing registered."""
    if not _installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    request = _installed[-1][1]
    done = threading.Event()

    def passes() -> None:
        while not request.signalled.wait(0.5):
            if done.is_set():
                return
        while True:  # at least one pass once signalled, however soon the block ends
            try:
                step()
            except Exception as e:  # noqa: BLE001 - a stopping driver: say it and try again
                log.warning("stopping: %s", e)
            request.first_pass.set()
            if done.wait(every_s):
                return

    thread = threading.Thread(target=passes, name="stop-signal-ending", daemon=True)
    request.ending += 1
    thread.start()
    try:
        yield
    finally:
        done.set()
        request.ending -= 1
        thread.join(timeout=SECOND_SIGNAL_WAIT_S)  # a pass under way finishes first


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
