"""The arithmetic of ``search.fidelity: sim``: calibration fit, residual model, expected gain.

Pure (numpy only). The simulator's error is modelled in log space, as a ratio:

* a **calibration** (a few :class:`~orchestrator.study.spec.SimCalibration` multipliers) fitted
  to every real trial so far by damped Gauss-Newton on the log errors of the measured
  metrics, with a ridge towards 1.0 (few trials identify few multipliers);
* a **residual model**: what the calibrated simulator still gets wrong, a Gaussian process
  over the configurations (normalised parameters), one per predicted metric; far from any
  real trial its spread is the simulator's typical error, near one it is the measurement's;
* the **expected gain** of measuring a configuration: the expected improvement of the
  first objective over the best real trial that meets the SLOs, times the chance that it
  meets them (each SLO's metric log-normal around the corrected prediction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from math import erf
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from orchestrator.measure import limits
from orchestrator.sim.cost import GEMM_EFFICIENCY, HBM_EFFICIENCY

# The multipliers fitted, in order: step-time overhead, prefill (compute) and decode
# (bandwidth) efficiency, the latency outside the engine core (TTFT offset).
CAL_FIELDS = ("step_overhead", "compute_efficiency", "bandwidth_efficiency", "frontend_latency")
# Metrics whose log errors the calibration is fitted to (besides the study's own).
FIT_METRICS = ("ttft_p50_ms", "tpot_p50_ms", "itl_mean_ms", "e2el_p50_ms", "output_throughput")
# Weight of log(multiplier)^2 per multiplier: a prior that multipliers are within ~1.5x of 1.0
# (log sd ~0.5 against a per-metric log error of ~0.15: (0.15 / 0.5)^2). A capacity trial's
# metrics are measured at its capacity, the prediction's at the predicted capacity: without it,
# one such trial pulled bandwidth_efficiency to 9 on the H200.
RIDGE = 0.1
# Where each multiplier may go: overheads and latencies 4x either way; efficiencies down to a
# quarter, and up only to the GPU's peak (over the simulator's own share of it).
BOUNDS = {"step_overhead": (0.25, 4.0), "compute_efficiency": (0.25, 1.0 / GEMM_EFFICIENCY),
          "bandwidth_efficiency": (0.25, 1.0 / HBM_EFFICIENCY), "frontend_latency": (0.25, 4.0)}
LOG_LO = np.log([BOUNDS[f][0] for f in CAL_FIELDS])
LOG_HI = np.log([BOUNDS[f][1] for f in CAL_FIELDS])
FD_STEP = 0.05  # finite-difference step in log(multiplier)
FIT_ITERATIONS = 2  # from the last fit: each real trial moves it little
# The simulator's log error before evidence (the margin, per GPU and metric: .margin) counts as
# PRIOR_WEIGHT residuals in the running estimate of each metric's residual spread.
PRIOR_WEIGHT = 1.0
# The run-to-run spread of one real measurement (log sd) when its row carries no interval: vLLM's
# defaults' capacity on an H200 over five seeds, 54.7-62.4 req/s (log sd 0.064; docs/benchmarks.md,
# "Repeatability"). A row with an interval (orchestrator.measure.confidence) gives its own: noise_log_sd.
NOISE_LOG_SD = 0.065
MIN_LOG_SD = 0.005  # a configuration's value is never known more closely than this
LENGTH_SCALE = 0.35  # of the residual model, in normalised parameter units


def metric_family(metric: str) -> str:
    """Which kind of number ``metric`` is, for the simulator's error on it: ``throughput`` (rates,
    goodput, capacity, cost per token: an inverse throughput), ``tpot`` (per-token and end-to-end
    latencies), ``ttft`` or ``other``."""
    m = metric.lower()
    if any(w in m for w in ("throughput", "goodput", "capacity", "rps", "cost_per")):
        return "throughput"
    if any(w in m for w in ("tpot", "itl", "e2el")):
        return "tpot"
    return "ttft" if "ttft" in m else "other"


def noise_log_sd(measured: Mapping[str, Any], metric: str, z: float) -> float:
    """The log sd of one real measurement of ``metric``: from its interval ``<metric>_low`` /
    ``_high`` (at the two-sided normal quantile ``z``), else :data:`NOISE_LOG_SD`."""
    lo, hi = log_value(measured.get(f"{metric}_low")), log_value(measured.get(f"{metric}_high"))
    if lo is None or hi is None or hi < lo:
        return NOISE_LOG_SD
    return max((hi - lo) / (2.0 * z), MIN_LOG_SD)


def log_value(v: Any) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return math.log(x) if math.isfinite(x) and x > 0 else None


# ------------------------------------------------------------------ calibration
def calibration(theta: Sequence[float]) -> dict[str, float]:
    """The multipliers of log multipliers ``theta``, within :data:`BOUNDS` (clamped after exp:
    exp(log(10)) is 10.000000000000002)."""
    return {f: min(max(float(math.exp(v)), BOUNDS[f][0]), BOUNDS[f][1]) for f, v in zip(CAL_FIELDS, theta)}


def _residuals(measured: Sequence[Mapping[str, Any]], predicted: Sequence[Mapping[str, Any]],
               metrics: Sequence[str], theta: np.ndarray) -> np.ndarray:
    out = []
    for y, p in zip(measured, predicted):
        for m in metrics:
            ly = log_value(y.get(m))
            if ly is None:
                continue
            lp = log_value(p.get(m))
            out.append(ly - lp if lp is not None else 0.0)  # keep the vector's shape at every theta
    return np.concatenate([np.asarray(out, dtype=float), math.sqrt(RIDGE) * theta])


def fit_calibration(predict: Callable[[np.ndarray], list[Mapping[str, Any]]],
                    measured: Sequence[Mapping[str, Any]], metrics: Sequence[str],
                    theta0: np.ndarray, iterations: int = FIT_ITERATIONS) -> tuple[np.ndarray, float]:
    """log multipliers minimising the squared log errors (+ ridge); and the final RMS log error.

    ``predict(theta)`` simulates every measured configuration under the multipliers
    ``exp(theta)``. Levenberg-Marquardt with forward differences, a few iterations from
    ``theta0`` (the last fit), ``iterations`` at most: each costs ``len(theta) + 1`` simulations of the set."""
    theta = np.clip(np.asarray(theta0, dtype=float), LOG_LO, LOG_HI)
    r = _residuals(measured, predict(theta), metrics, theta)
    n_data = len(r) - len(theta)
    if n_data == 0:
        return theta, 0.0
    cost, damping = float(r @ r), 1e-2
    for _ in range(iterations):
        jac = np.empty((len(r), len(theta)))
        for i in range(len(theta)):
            t = theta.copy()
            t[i] += FD_STEP if t[i] + FD_STEP <= LOG_HI[i] else -FD_STEP  # stay inside the bounds
            jac[:, i] = (_residuals(measured, predict(t), metrics, t) - r) / (t[i] - theta[i])
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = False
        for _ in range(3):
            step = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-9), -jtr)
            cand = np.clip(theta + step, LOG_LO, LOG_HI)
            rc = _residuals(measured, predict(cand), metrics, cand)
            if float(rc @ rc) < cost:
                theta, r, cost, damping, improved = cand, rc, float(rc @ rc), damping / 3, True
                break
            damping *= 4
        if not improved or np.max(np.abs(step)) < 1e-3:
            break
    data = r[:n_data]
    return theta, float(math.sqrt(data @ data / n_data))


# ------------------------------------------------------------------ the configurations as vectors
class Encoder:
    """Parameters as numbers in [0, 1]: numbers by position on their (log) range, other values one-hot.
    (A class: Tune pickles the searcher that holds it.)"""

    def __init__(self, space, points: Sequence[Mapping[str, Any]]):
        self.cols: list[tuple[str, tuple]] = []
        for name in space.sampled_names():
            values = [p.get(name) for p in points]
            nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if nums and len(nums) == sum(v is not None for v in values):
                lo, hi = min(nums), max(nums)
                log = lo > 0 and hi / lo > 4
                a, b = (math.log(lo), math.log(hi)) if log else (lo, hi)
                self.cols.append((name, ("num", log, a, max(b - a, 1e-12))))
            else:
                for choice in sorted({repr(v) for v in values}):
                    self.cols.append((name, ("cat", choice)))

    def __call__(self, params: Mapping[str, Any]) -> np.ndarray:
        out = np.zeros(len(self.cols))
        for i, (name, spec) in enumerate(self.cols):
            v = params.get(name)
            if spec[0] == "num":
                if v is None:
                    out[i] = -0.5  # switched off by a condition: apart from every value
                    continue
                _, log, a, span = spec
                x = math.log(v) if log and v > 0 else float(v)
                out[i] = (x - a) / span
            else:
                out[i] = 1.0 if repr(v) == spec[1] else 0.0
        return out


# ------------------------------------------------------------------ residual model
@dataclass
class Residuals:
    """A Gaussian process over one metric's log error of the calibrated simulator: a constant
    mean (the real trials' average error, shrunk towards none) plus a smooth deviation."""

    x: np.ndarray  # (n, d) real trials
    e: np.ndarray  # (n,) their log errors, less the mean
    mean: float
    signal_var: float
    noise: Optional[np.ndarray] = None  # (n,) each real measurement's log sd (default NOISE_LOG_SD)

    @classmethod
    def fit(cls, x: np.ndarray, e: np.ndarray, prior_sd: float,
            noise: Optional[np.ndarray] = None) -> "Residuals":
        n = len(e)
        mean = float(e.sum()) / (PRIOR_WEIGHT + n) if n else 0.0
        d = e - mean
        var = (PRIOR_WEIGHT * prior_sd ** 2 + float(d @ d)) / (PRIOR_WEIGHT + n)
        return cls(x.reshape(n, -1) if n else x, d, mean, max(var, MIN_LOG_SD ** 2),
                   None if noise is None else np.asarray(noise, dtype=float))

    def _k(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return self.signal_var * np.exp(-0.5 * d2 / LENGTH_SCALE ** 2)

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean log correction and the standard deviation of the true value's log at ``xs`` (m, d)."""
        if len(self.e) == 0:
            return np.full(len(xs), self.mean), np.full(len(xs), math.sqrt(self.signal_var))
        noise = self.noise if self.noise is not None else np.full(len(self.e), NOISE_LOG_SD)
        kxx = self._k(self.x, self.x) + np.diag(noise ** 2)
        ks = self._k(xs, self.x)
        sol = np.linalg.solve(kxx, np.column_stack([self.e, ks.T]))
        mean = self.mean + ks @ sol[:, 0]
        var = self.signal_var - np.einsum("ij,ji->i", ks, sol[:, 1:])
        return mean, np.sqrt(np.maximum(var, MIN_LOG_SD ** 2))


# ------------------------------------------------------------------ expected gain
def _phi(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(erf)(z / math.sqrt(2.0)))


def chance_met(op: str, limit: float, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """P(metric op limit) for a log-normal metric (log mean ``mu``, log sd ``sd``); NaN mu: never."""
    if limit <= 0:
        z = np.where(limits.upper(op), -np.inf, np.inf) * np.ones_like(mu)
    else:
        z = (math.log(limit) - mu) / sd
    p = _phi(z) if limits.upper(op) else 1.0 - _phi(z)
    return np.where(np.isnan(mu), 0.0, p)


def expected_gain(mu: np.ndarray, sd: np.ndarray, best: Optional[float], maximize: bool) -> np.ndarray:
    """Expected improvement over ``best`` of a log-normal objective; without a best, its mean
    (maximize) or the inverse of its mean (minimize), so the most promising comes first."""
    mean = np.exp(mu + sd ** 2 / 2)
    if best is None or best <= 0:
        return mean if maximize else 1.0 / np.maximum(mean, 1e-300)
    d2 = (mu - math.log(best)) / sd
    d1 = d2 + sd
    if maximize:
        return np.maximum(mean * _phi(d1) - best * _phi(d2), 0.0)
    return np.maximum(best * _phi(-d2) - mean * _phi(-d1), 0.0)
