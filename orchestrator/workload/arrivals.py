"""When requests are due: seeded, precomputed arrival times for every arrival kind.

Pure functions of (spec, n, rng). The first request is due at t = 0 and times never
decrease. Poisson and gamma arrivals are drawn, then rescaled (as ``vllm bench serve``
does) so that the last of ``n`` requests is due at ``(n - 1) / rate``: a window's
realised rate is the rate it asks for, whatever the seed, and only the burstiness
inside the window is random. Without it, 500 Poisson arrivals realise their rate only
within about +-4.5% (one standard deviation), and a capacity search read that draw as
a change of capacity. :func:`nominal_rate` is the rate a spec asks for (what a trial reports as
``requested_rate``), :func:`with_rate` rescales a spec to another rate (what a
capacity search does between load levels): for poisson, gamma, constant and ramp
the same seed then gives the same gaps, only shorter or longer; a diurnal cycle
keeps its period and gets proportionally more requests per cycle.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from orchestrator.workload.spec import (RATE_ARRIVALS, BurstArrival, ConcurrencyArrival, ConstantArrival,
                                        DiurnalArrival, GammaArrival, PoissonArrival, RampArrival)

__all__ = ["sample_arrivals", "nominal_rate", "with_rate", "ramp_rates", "diurnal_rate", "is_rate_driven"]

# Grid points per period for integrating a diurnal rate (piecewise linear between them).
_DIURNAL_GRID = 2048


def is_rate_driven(arrival) -> bool:
    return isinstance(arrival, RATE_ARRIVALS)


def ramp_rates(arrival: RampArrival, n: int) -> np.ndarray:
    """The rate at which each of ``n`` requests is drawn (as vLLM's ``_get_current_request_rate``)."""
    progress = np.arange(n) / (n - 1) if n > 1 else np.zeros(n)
    if arrival.shape == "linear":
        return arrival.start_rate + (arrival.end_rate - arrival.start_rate) * progress
    return arrival.start_rate * (arrival.end_rate / arrival.start_rate) ** progress


def _profile(arrival: DiurnalArrival) -> tuple[np.ndarray, np.ndarray]:
    """(time grid over one period, relative rate on it, mean 1)."""
    t = np.linspace(0.0, arrival.period_s, _DIURNAL_GRID + 1)
    if arrival.profile is None:
        rel = 1.0 + arrival.amplitude * np.sin(2 * np.pi * (t / arrival.period_s + arrival.phase))
    else:
        levels = np.asarray(arrival.profile + [arrival.profile[0]], dtype=float)  # cyclic
        knots = np.linspace(0.0, arrival.period_s, len(levels))
        rel = np.interp(t, knots, levels)
    mean = float(np.sum((rel[1:] + rel[:-1]) / 2 * np.diff(t))) / arrival.period_s  # trapezoid rule
    return t, rel / mean


def diurnal_rate(arrival: DiurnalArrival, t: np.ndarray) -> np.ndarray:
    """The requested rate at times ``t`` (seconds from the start of the load window)."""
    grid, rel = _profile(arrival)
    return arrival.rate * np.interp(np.mod(t, arrival.period_s), grid, rel)


def _diurnal_times(arrival: DiurnalArrival, n: int, rng: np.random.Generator) -> np.ndarray:
    # Time rescaling: unit-rate Poisson event times E_k mapped through the inverse of the
    # cumulative rate Lambda(t) are the event times of a Poisson process of rate lambda(t).
    grid, rel = _profile(arrival)
    lam = arrival.rate * rel
    cum = np.concatenate(([0.0], np.cumsum((lam[1:] + lam[:-1]) / 2 * np.diff(grid))))
    per_period = cum[-1]
    e = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0, n - 1))))
    periods = np.floor(e / per_period)
    return periods * arrival.period_s + np.interp(e - periods * per_period, cum, grid)


def sample_arrivals(arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Due times (seconds, first at 0, non-decreasing) of ``n`` requests."""
    if n <= 0:
        return np.zeros(0)
    if isinstance(arrival, DiurnalArrival):
        return _diurnal_times(arrival, n, rng)
    if isinstance(arrival, PoissonArrival):
        gaps = _to_rate(rng.exponential(1.0 / arrival.rate, n - 1), arrival.rate)
    elif isinstance(arrival, GammaArrival):
        # As vLLM's get_request: shape = burstiness, scale = 1 / (rate * burstiness),
        # so the mean gap is 1/rate and the gaps' coefficient of variation 1/sqrt(burstiness).
        b = arrival.burstiness
        gaps = _to_rate(rng.gamma(shape=b, scale=1.0 / (arrival.rate * b), size=n - 1), arrival.rate)
    elif isinstance(arrival, ConstantArrival):
        gaps = np.full(n - 1, 1.0 / arrival.rate)
    elif isinstance(arrival, RampArrival):
        # Unit-mean gamma draws divided by each request's rate: the gap before request i is
        # drawn at request i's rate.
        b = arrival.burstiness
        gaps = rng.gamma(shape=b, scale=1.0 / b, size=n - 1) / ramp_rates(arrival, n)[1:]
    elif isinstance(arrival, (BurstArrival, ConcurrencyArrival)):
        gaps = np.zeros(n - 1)
    else:  # pragma: no cover - the spec union is closed
        raise TypeError(f"unknown arrival spec {type(arrival).__name__}")
    out = np.empty(n)
    out[0] = 0.0
    np.cumsum(gaps, out=out[1:])
    return out


def _to_rate(gaps: np.ndarray, rate: float) -> np.ndarray:
    """``gaps`` scaled so that they sum to ``len(gaps) / rate`` (vLLM's ``normalize_factor``)."""
    total = float(gaps.sum())
    return gaps * (len(gaps) / rate / total) if total > 0 else gaps


def nominal_rate(arrival, n: int) -> Optional[float]:
    """Requests per second the spec asks for over ``n`` requests; None if unbounded or closed loop.

    A ramp asks for ``(n - 1) / sum(1 / rate_i)``: its expected span is the sum of the
    mean gaps, so this is the rate whose span equals it.
    """
    if isinstance(arrival, (PoissonArrival, GammaArrival, ConstantArrival, DiurnalArrival)):
        return float(arrival.rate)
    if isinstance(arrival, RampArrival):
        if n <= 1:
            return float(arrival.start_rate)
        return float((n - 1) / np.sum(1.0 / ramp_rates(arrival, n)[1:]))
    return None


def with_rate(arrival, rate: float, n: int):
    """``arrival`` rescaled so that :func:`nominal_rate` is ``rate`` (for ``n`` requests)."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number, got {rate!r}")
    if isinstance(arrival, RampArrival):
        f = rate / nominal_rate(arrival, n)
        return arrival.model_copy(update={"start_rate": arrival.start_rate * f, "end_rate": arrival.end_rate * f})
    if isinstance(arrival, (PoissonArrival, GammaArrival, ConstantArrival, DiurnalArrival)):
        return arrival.model_copy(update={"rate": float(rate)})
    raise ValueError(f"arrival kind {arrival.kind!r} has no rate to scale; "
                     "use poisson, gamma, constant, ramp or diurnal")
