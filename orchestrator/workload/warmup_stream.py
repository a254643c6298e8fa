"""The steady warm-up's requests (:class:`WarmupStream`), made on demand at the trial's own load.

After the warm-up burst, unless ``workload.warmup.enabled`` is false, the steady warm-up
sends as many requests as the engine needs to become steady (:mod:`orchestrator.measure.warmup`),
at the trial's own load: its arrival process at its rate (a ramp's start rate, a diurnal
cycle's rate at t = 0; a closed loop keeps its concurrency; a trace cycles its own gaps),
its length distributions (a trace or dataset cycles its entries' shapes) and its shared
prefixes, with prompts from a stream of their own (spawn key ``(STEADY_KEY, level)``). A
``burst`` arrival has no steady state to wait for: it gets the burst only. Warm-up
prompts are never measured prompts, at any level. Indexes count down from
``-warmup_requests - 1`` in the order the requests are sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from orchestrator.workload.arrivals import diurnal_rate
from orchestrator.workload.requests import Request
from orchestrator.workload.spec import (ConstantArrival, DiurnalArrival, GammaArrival, PoissonArrival, RampArrival,
                                        WorkloadSpec)
from orchestrator.workload.synthesis import (STEADY_KEY, draw_prefixes, entry_requests, make_requests, make_rng,
                                             seed_streams)

__all__ = ["WarmupStream", "steady_stream"]

CHUNK = 64  # the steady warm-up's requests are drawn this many at a time (fixed: determinism)


def _steady_arrival(arrival):
    """The stationary arrival process the steady warm-up draws gaps from (None: closed loop or burst)."""
    if isinstance(arrival, (PoissonArrival, GammaArrival, ConstantArrival)):
        return arrival
    if isinstance(arrival, RampArrival):  # the rate the measured window starts at
        return GammaArrival(rate=arrival.start_rate, burstiness=arrival.burstiness)
    if isinstance(arrival, DiurnalArrival):
        return PoissonArrival(rate=float(diurnal_rate(arrival, np.zeros(1))[0]))
    return None


def steady_stream(spec: WorkloadSpec, seed: int, vocab_size: int, level: int, *, rate: Optional[float],
                  concurrency: Optional[int], entries: tuple = (), gaps: tuple = (),
                  default_prefix_len: Optional[int] = None) -> Optional[WarmupStream]:
    """A request set's steady warm-up (None: disabled, a burst, or a trace whose requests all come at once)."""
    if not spec.warmup.enabled:
        return None
    arrival = None
    if spec.trace is not None:
        if not any(g > 0 for g in gaps):
            return None  # one request, or all at once: no rate to warm up at
    elif concurrency is None:
        arrival = _steady_arrival(spec.arrival)
        if arrival is None:  # a burst: nothing steady to wait for
            return None
        rate = arrival.rate
    return WarmupStream(settings=spec.warmup, spec=spec, seed=seed, vocab_size=vocab_size, level=level,
                        first_index=-spec.warmup_requests - 1, arrival=arrival, rate=rate,
                        concurrency=concurrency, entries=entries, gaps=gaps, default_prefix_len=default_prefix_len)


@dataclass(frozen=True)
class WarmupStream:
    """The steady warm-up's requests, made on demand: iterate for as many as the warm-up needs.

    Open loop (``concurrency`` None): ``arrival_s`` counts from the warm-up's first request
    (due at 0), with gaps from ``arrival`` at ``rate`` (or, for a trace, the trace's own
    gaps, cycled). Closed loop: every ``arrival_s`` is 0; keep ``concurrency`` in flight.
    Lengths and prefix groups come from the workload's distributions (synthetic) or cycle
    through ``entries`` (traces and datasets); prompts are the stream's own. Requests are
    drawn ``CHUNK`` at a time from fixed streams: every iteration yields the same sequence.
    """

    settings: Any  # WarmupSpec
    spec: WorkloadSpec
    seed: int
    vocab_size: int
    level: int
    first_index: int  # the first request's index; later ones count down
    arrival: Any = None  # a Poisson, gamma or constant arrival (None: closed loop, or a trace's gaps)
    rate: Optional[float] = None  # nominal requests per second (None: closed loop)
    concurrency: Optional[int] = None
    entries: tuple = ()  # traces and datasets: TraceEntry shapes, cycled
    gaps: tuple = ()  # traces: the replayed window's gaps (seconds), cycled
    default_prefix_len: Optional[int] = None

    def _gaps(self, rng: np.random.Generator, n: int, done: int) -> np.ndarray:
        """Gaps before each of the next ``n`` requests (``done`` already drawn; the first is due at 0)."""
        a = self.arrival
        if self.concurrency is not None:
            g = np.zeros(n)
        elif self.entries and self.gaps:
            g = np.array([self.gaps[(done + i - 1) % len(self.gaps)] for i in range(n)], dtype=float)
        elif isinstance(a, PoissonArrival):
            g = rng.exponential(1.0 / a.rate, n)
        elif isinstance(a, GammaArrival):
            g = rng.gamma(shape=a.burstiness, scale=1.0 / (a.rate * a.burstiness), size=n)
        else:
            g = np.full(n, 1.0 / a.rate)
        if done == 0:
            g[0] = 0.0
        return g

    def __iter__(self) -> Iterator[Request]:
        r_arr, r_in, r_out, r_grp, r_prompt = (
            make_rng(s) for s in np.random.SeedSequence(self.seed, spawn_key=(STEADY_KEY, self.level)).spawn(5))
        prefixes = None
        sp = self.spec.shared_prefix
        if sp is not None and not self.entries:  # the workload's own prefixes (drawn first from its stream)
            prefixes = draw_prefixes(sp, make_rng(seed_streams(self.seed)["prefix"]), self.vocab_size)
        t, done = 0.0, 0
        while True:
            arrivals = t + np.cumsum(self._gaps(r_arr, CHUNK, done))
            first = self.first_index - done
            if self.entries:
                chunk = [self.entries[(done + i) % len(self.entries)] for i in range(CHUNK)]
                reqs = entry_requests(chunk, arrivals.tolist(), seed=self.seed, vocab_size=self.vocab_size,
                                      prompt_rng=r_prompt, default_prefix_len=self.default_prefix_len,
                                      first_index=first, warmup=True, index_step=-1)
            else:
                reqs = make_requests(spec=self.spec, n=CHUNK, arrivals=arrivals, len_rngs=(r_in, r_out),
                                      group_rng=r_grp, prompt_rng=r_prompt, prefixes=prefixes,
                                      vocab_size=self.vocab_size, first_index=first, warmup=True, index_step=-1)
            yield from reqs
            t = float(arrivals[-1])
            done += CHUNK

