"""Is the measurement limited by the harness (the serving path and the client), not the engine?

The client measures what a user of the endpoint sees; the engine's own histograms
(``engine_*``, :mod:`orchestrator.measure.telemetry`) what vLLM did. Both describe the same
requests, so they must agree up to the cost of the path between them (HTTP, the
serving proxy, SSE framing and detokenisation, the network). When they do not, the
client-side numbers describe the harness, not the configuration under test.

:func:`harness_verdict` is the one rule; every place that shows the flag reads the
``harness_bound`` / ``harness_bound_reason`` columns it produced:

* **TTFT**: client ``ttft_p50_ms`` exceeds the engine's median TTFT by more than
  ``TTFT_RELATIVE`` (10 %) of it *and* by more than ``TTFT_FLOOR_MS`` (20 ms). The
  engine's median is taken at its upper bound (``engine_ttft_p50_upper_ms``: vLLM's
  TTFT buckets are coarse, 0.1 -> 0.25 -> 0.5 s, and an interpolated median can sit
  well below the true one), so the excess is a lower bound of what the path adds.
  The floor keeps the fixed per-request cost of HTTP + one detokenisation + SSE
  framing (about a millisecond on one host, a few across a network) from flagging
  fast engines, where 10 % of a 20 ms TTFT is only 2 ms.
* **Throughput**: client ``output_throughput`` is below ``1 - THROUGHPUT_RELATIVE``
  (0.9) of ``engine_output_throughput``. The engine's throughput is measured over its
  active time with an end that is late by up to one scrape interval, so the engine
  side is never overstated. Judged only when every measured request succeeded:
  otherwise the engine also counted tokens of requests the client gave up on.

The client can never be faster than the engine for the same requests; if it seems to
be (e.g. another client shares an external endpoint), nothing is flagged. When a row is
flagged and the load generator's own p99 send lag (``sched_lag_p99_ms``) exceeds
``CLIENT_LAG_MS``, the reason says so: a client short of CPU delays its reads as much as
its sends, and the excess is then partly the client's, not the path's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import pandas as pd

from orchestrator.failures import TrialStatus
from orchestrator.numbers import finite_float

TTFT_RELATIVE = 0.10
TTFT_FLOOR_MS = 20.0
THROUGHPUT_RELATIVE = 0.10
CLIENT_LAG_MS = TTFT_FLOOR_MS  # a p99 send lag above it is named next to a harness-bound verdict


@dataclass(frozen=True)
class HarnessVerdict:
    bound: Optional[bool]  # None: not judged (no engine-side numbers)
    reason: Optional[str] = None

    def columns(self) -> dict[str, Any]:
        return {"harness_bound": self.bound, "harness_bound_reason": self.reason}


def harness_verdict(metrics: Mapping[str, Any]) -> HarnessVerdict:
    """The harness-bound rule over one row's (or one level's) columns (pure; see the module doc)."""
    reasons: list[str] = []
    judged = False

    client_ttft = finite_float(metrics.get("ttft_p50_ms"))
    engine_ttft = finite_float(metrics.get("engine_ttft_p50_ms"))
    if client_ttft is not None and engine_ttft is not None:
        judged = True
        upper = finite_float(metrics.get("engine_ttft_p50_upper_ms"))
        bound = max(engine_ttft, upper) if upper is not None else engine_ttft
        excess = client_ttft - bound
        if excess > TTFT_FLOOR_MS and excess > TTFT_RELATIVE * bound:
            reasons.append(f"client TTFT p50 {client_ttft:,.0f} ms vs engine {engine_ttft:,.0f} ms"
                           + (f" (at most {bound:,.0f} ms)" if bound > engine_ttft else "")
                           + f": the serving path adds {client_ttft - engine_ttft:,.0f} ms")

    client_tput = finite_float(metrics.get("output_throughput"))
    engine_tput = finite_float(metrics.get("engine_output_throughput"))
    failed = finite_float(metrics.get("failed"))
    completed = finite_float(metrics.get("completed"))
    if (client_tput is not None and engine_tput is not None and engine_tput > 0 and not failed
            and completed != 0):
        judged = True
        ratio = client_tput / engine_tput
        if ratio < 1.0 - THROUGHPUT_RELATIVE:
            reasons.append(f"client throughput {ratio:.2f}x engine's ({client_tput:,.0f} vs "
                           f"{engine_tput:,.0f} tok/s): the serving path limits the output rate")

    if not judged:
        return HarnessVerdict(None)
    lag = finite_float(metrics.get("sched_lag_p99_ms"))
    if reasons and lag is not None and lag > CLIENT_LAG_MS:
        # The client is part of the harness: on a busy client machine its own event loop, not the
        # path, can hold the first tokens (and the sends), and the user needs to know which.
        reasons.append(f"the load generator lagged too (p99 send lag {lag:,.0f} ms): part of it is the "
                       "client's own CPU, not the path")
    return HarnessVerdict(bool(reasons), "; ".join(reasons) or None)


def harness_bound_mask(trials):
    """Completed rows of a trials (or levels) frame flagged ``harness_bound``; False where the
    column is absent (results written before it existed) or null (not judged)."""

    if "harness_bound" not in trials.columns:
        return pd.Series(False, index=trials.index)
    mask = trials["harness_bound"].astype("boolean").fillna(False).astype(bool)
    return mask & (trials["status"] == TrialStatus.COMPLETED) if "status" in trials.columns else mask
