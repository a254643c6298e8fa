"""The simulated engine's loop: the simulator core on a thread of its own, stepping in real time.

Like vLLM's engine core beside its API server: requests arrive from any thread or
event loop (:meth:`SimRuntime.submit`), every core call happens on the engine
thread, and each request's tokens come back through its :class:`Mailbox` in the
caller's event loop. A step sleeps the simulated duration of the batch it ran.
The HTTP front end is :mod:`orchestrator.engines.sim.http_server`.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Callable, Optional

from orchestrator.engines.sim.metrics import SimRequestMetrics
from orchestrator.sim.core import SimEngineCore, SimRequest

FINISHED = "finished"  # a mailbox's last item; before it: token counts, or the exception that killed the engine
FINISH_REASONS = ("stop", "length")  # vLLM's finished_reason labels of the requests the simulator ends
CATCH_UP_S = 0.1  # lateness of the engine loop made up by later steps; beyond it the timeline shifts


class Mailbox:
    """Tokens for one request, delivered into the caller's event loop."""

    __slots__ = ("queue", "loop", "prompt_tokens", "cached_tokens", "generated", "pending", "stop_after",
                 "finish_reason")

    def __init__(self, loop: asyncio.AbstractEventLoop, stop_after: Optional[int] = None,
                 finish_reason: str = "length"):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = loop
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated = 0
        self.pending = 0  # generated but not yet streamed (stream_interval)
        self.stop_after = stop_after  # a stop before max_tokens: the engine ends the request at this many tokens
        self.finish_reason = finish_reason  # how it ends (vllm:request_success's finished_reason)


class SimRuntime:
    """Owns the simulator core; all core calls happen on the engine thread."""

    def __init__(self, core: SimEngineCore, stream_interval: int = 1):
        self.core = core
        self.stream_interval = max(1, stream_interval)
        self.loop = asyncio.new_event_loop()
        self.mailboxes: dict[str, Mailbox] = {}
        self.ids = itertools.count()
        self.error: Optional[BaseException] = None
        self.request_success = dict.fromkeys(FINISH_REASONS, 0)  # finished requests by finished_reason
        self._stopping = 0  # live requests with a stop before max_tokens (the step's outputs are checked only then)
        self.metrics = SimRequestMetrics()  # vLLM's request-latency histograms (engine thread)
        self.on_accept: Optional[Callable[[], None]] = None  # per accepted request (fault injection)
        self._pending_failure: Optional[BaseException] = None
        self._wake: Optional[asyncio.Event] = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._thread_main, args=(ready,), name="sim-engine", daemon=True)
        self.thread.start()
        ready.wait()

    def _thread_main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self._wake = asyncio.Event()
        self.loop.create_task(self._engine_loop())
        ready.set()
        self.loop.run_forever()

    def _deliver(self, box: Mailbox, *items) -> None:
        """Items reach the mailbox together: a request's last tokens and FINISHED are read as one."""
        if box.loop is self.loop:
            _put_all(box.queue, items)
        else:
            box.loop.call_soon_threadsafe(_put_all, box.queue, items)

    def _stop(self, outputs) -> None:
        """End the requests that reached their stop (a stop string or stop token id before
        ``max_tokens``), as vLLM's output processor aborts them in the engine core."""
        for out in outputs:
            box = self.mailboxes.get(out.request_id)
            if (box is not None and box.stop_after is not None and not out.finished
                    and box.generated + out.new_tokens >= box.stop_after):
                self.core.abort_request(out.request_id)
                out.finished = True

    async def _engine_loop(self) -> None:
        loop = self.loop
        next_free = loop.time()
        try:
            while True:
                if self._pending_failure is not None:
                    raise self._pending_failure
                if not self.core.has_work():
                    self._wake.clear()
                    await self._wake.wait()
                    next_free = loop.time()
                    continue
                # Step boundaries stay on a wall-clock timeline: a wake-up late by up to
                # CATCH_UP_S (a busy host) is made up by the next steps instead of shifting every
                # later token, so the simulated GPU does not slow down with the host's CPU.
                start = max(next_free, loop.time() - CATCH_UP_S)
                result = self.core.step()
                next_free = start + result.duration_s
                delay = next_free - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._stopping:
                    self._stop(result.outputs)
                # Recorded before any token reaches a client: a scrape after the client saw a
                # request end always counts it.
                self.metrics.step(result.outputs, start, loop.time())
                for out in result.outputs:
                    box = self.mailboxes.get(out.request_id)
                    if box is None:
                        continue
                    box.prompt_tokens = out.num_prompt_tokens
                    box.cached_tokens = out.num_cached_tokens
                    if out.new_tokens:
                        # vLLM's stream_interval: the first token at once, then every N tokens.
                        first = box.generated == 0
                        box.generated += out.new_tokens
                        box.pending += out.new_tokens
                        if not out.finished and (first or box.pending >= self.stream_interval):
                            self._deliver(box, box.pending)
                            box.pending = 0
                    if out.finished:
                        self.mailboxes.pop(out.request_id, None)
                        self._stopping -= box.stop_after is not None
                        self.request_success[box.finish_reason] += 1
                        self._deliver(box, *((box.pending, FINISHED) if box.pending else (FINISHED,)))
                        box.pending = 0
        except BaseException as e:  # noqa: BLE001 - every waiting request must learn of it
            self.error = e
            for box in list(self.mailboxes.values()):
                self._deliver(box, e)
            raise

    # ---- called from any thread / loop
    def submit(self, prompt_ids: list[int], max_tokens: int, *, stop_after: Optional[int] = None,
               finish_reason: str = "length", priority: int = 0):
        """Queue a request on the engine thread; returns (request id, mailbox, accepted future).
        The future raises ValueError, with vLLM's message, for a request the core refuses.
        ``stop_after``: a stop ends it after that many tokens (it is checked against
        ``max_model_len`` with ``max_tokens``, as vLLM checks it); ``finish_reason``: how it ends."""
        if self.error is not None:
            raise RuntimeError(f"engine dead: {self.error!r}")
        arrival = time.monotonic()  # vLLM's arrival_time: the front end has the request
        rid = f"cmpl-{next(self.ids)}"
        box = Mailbox(asyncio.get_running_loop(), stop_after if stop_after is not None and stop_after < max_tokens
                      else None, finish_reason)
        box.prompt_tokens = len(prompt_ids)
        fut: "asyncio.Future" = asyncio.get_running_loop().create_future()
        caller = asyncio.get_running_loop()

        def _add():
            queued = time.monotonic()
            try:
                self.core.add_request(SimRequest(rid, prompt_ids, max_tokens, arrival_s=queued, priority=priority))
            except ValueError as e:  # e.g. too long for max_model_len: the front end answers 400
                caller.call_soon_threadsafe(fut.set_exception, e)
                return
            self.metrics.add(rid, arrival, queued)
            self.mailboxes[rid] = box
            self._stopping += box.stop_after is not None
            self._wake.set()
            caller.call_soon_threadsafe(fut.set_result, None)
            if self.on_accept is not None:
                self.on_accept()

        self.loop.call_soon_threadsafe(_add)
        return rid, box, fut

    def inject_failure(self, error: BaseException) -> None:
        """Make the engine loop die of ``error`` at its next step, as a failing engine core would."""

        def _fail():
            self._pending_failure = error
            self._wake.set()

        self.loop.call_soon_threadsafe(_fail)

    def abort(self, rid: str) -> None:
        def _abort():
            self.metrics.abort(rid)
            box = self.mailboxes.pop(rid, None)
            if box is not None:
                self._stopping -= box.stop_after is not None
                try:
                    self.core.abort_request(rid)
                except Exception:  # noqa: BLE001 - it finished meanwhile
                    pass

        self.loop.call_soon_threadsafe(_abort)


def _put_all(queue: asyncio.Queue, items: tuple) -> None:
    for item in items:
        queue.put_nowait(item)
