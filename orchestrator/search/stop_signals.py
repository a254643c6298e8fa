"""A stopped study stops: SIGTERM and SIGINT (Ctrl-C, ``ray job stop``, a CronJob's deadline, a
Kubernetes eviction) end the run gracefully, a second one at once; neither leaves an engine behind.

* **First signal.** :class:`StudyInterrupted` is raised where the driver is: inside Tune's loop Tune
  stops its trial actors on the way out (Tune's own SIGINT handler is switched off, so that SIGINT and
  SIGTERM take one path); the driver then deletes every Serve application of the run (each replica's
  teardown ends its ``vllm serve`` process group, engine core and workers included:
  :mod:`orchestrator.engines.vllm_process`), stops the Ray it started, leaves the run resumable (the
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

__all__ = ["StopRequest", "StudyInterrupted", "stop_on_signals"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
        raise StudyInterrupted(signum)

    # Tune installs a SIGINT handler of its own while its loop runs (stop after saving, a second press
    # aborts): one path for both signals instead, this one.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
