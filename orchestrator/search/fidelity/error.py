"""The simulator's out-of-sample error, summarised from :mod:`.replay`'s rows (pure: pandas, numpy).

A row compares one measured number with its prediction; its error is relative,
(predicted - measured) / measured. Rows marked not scored (a queue's TTFT on an overloaded
level, a capacity below every level measured, a configuration the simulator refused) are in
no summary. :func:`margins` is what the fidelity search's margins must equal
(:mod:`.margin`): a log sd per GPU and metric.
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd

from orchestrator.search.fidelity.replay import LEAVE_ONE_OUT, OTHER_GPU

# median |x| of a normal of sd 1: the sd of a log error from its median absolute value (robust to the
# few configurations the simulator misses by far, which the max shows)
MEDIAN_ABS_PER_SD = 0.6745


def scored(frame: pd.DataFrame) -> pd.DataFrame:
    """The scored rows with their relative error ``rel`` and log error ``log`` (log predicted / measured)."""
    f = frame[frame["scored"].astype(bool)].copy()
    f["rel"] = (f["predicted"] - f["measured"]) / f["measured"]
    f["log"] = np.log(f["predicted"] / f["measured"])
    return f


def summary(frame: pd.DataFrame, by: tuple[str, ...] = ("scheme", "gpu", "metric")) -> pd.DataFrame:
    """Per group: ``points``, ``median`` and ``max`` of the absolute relative error, ``median_signed``."""
    f = scored(frame)
    g = f.assign(abs_rel=f["rel"].abs()).groupby(list(by), sort=False)
    return g.agg(points=("abs_rel", "size"), median=("abs_rel", "median"), max=("abs_rel", "max"),
                 median_signed=("rel", "median")).reset_index()


def ranking(frame: pd.DataFrame) -> pd.DataFrame:
    """Per scheme and dataset: the pairs of configurations whose measured first objective differs by
    more than the study's equivalence margin (``pairs``), and how many of them the prediction puts
    in the measured order (``right``; a predicted tie is not). Of those, ``with_intervals`` counts the
    pairs whose two configurations recorded a measured interval (older datasets did not), ``decided``
    those the measurement itself orders, their intervals apart, and ``decided_right`` how many of them
    the prediction orders so: a pair whose intervals overlap was not told apart by the engine, so its
    order is no test of the prediction. A configuration measured several times counts once, at its
    median, measured and predicted (its interval: the medians of its bounds; a bound not found, 0 or
    unbounded)."""
    f = scored(frame)
    f = f[(f["level"] == -1) & (f["metric"] == f["objective"])]
    rows = []
    for (scheme, gpu, dataset, objective), g in f.groupby(["scheme", "gpu", "dataset", "objective"], sort=False):
        g = g.assign(low=g["measured_low"].fillna(0.0), high=g["measured_high"].fillna(math.inf),
                     recorded=g["measured_low"].notna() | g["measured_high"].notna())
        by_config = g.groupby("config").agg(y=("measured", "median"), p=("predicted", "median"),
                                            low=("low", "median"), high=("high", "median"),
                                            recorded=("recorded", "any"),
                                            margin=("margin", "max"), maximize=("maximize", "first"))
        pairs = right = with_intervals = decided = decided_right = 0
        wrong = []
        for (a, ra), (b, rb) in combinations(by_config.iterrows(), 2):
            if abs(ra.y - rb.y) / min(ra.y, rb.y) <= max(ra.margin, rb.margin):
                continue  # equivalent as measured: no order to get right
            pairs += 1
            recorded = bool(ra.recorded and rb.recorded)
            with_intervals += recorded
            apart = recorded and (ra.high < rb.low or rb.high < ra.low)
            decided += apart
            if np.sign(ra.p - rb.p) == np.sign(ra.y - rb.y):
                right += 1
                decided_right += apart
            else:
                wrong.append(f"{a} (measured {_measured(ra)}, predicted {ra.p:.3g}) vs {b} ({_measured(rb)}, "
                             f"{rb.p:.3g})" + ("" if apart or not recorded else ", not told apart as measured"))
        rows.append({"scheme": scheme, "gpu": gpu, "dataset": dataset, "objective": objective,
                     "configs": len(by_config), "pairs": pairs, "right": right, "with_intervals": with_intervals,
                     "decided": decided, "decided_right": decided_right, "wrong": "; ".join(wrong)})
    return pd.DataFrame(rows, columns=["scheme", "gpu", "dataset", "objective", "configs", "pairs", "right",
                                       "with_intervals", "decided", "decided_right", "wrong"])


def _measured(r) -> str:
    """A configuration's measured value with its interval where one was recorded: ``30 [0, inf]``."""
    if not r.recorded:
        return f"{r.y:.3g}"
    high = "inf" if math.isinf(r.high) else f"{r.high:.3g}"
    return f"{r.y:.3g} [{r.low:.3g}, {high}]"


def log_sd(frame: pd.DataFrame, scheme: str) -> dict[str, dict[str, float]]:
    """GPU -> metric -> the robust sd of the log error of ``scheme`` (3 decimals)."""
    f = scored(frame)
    f = f[f["scheme"] == scheme]
    out: dict[str, dict[str, float]] = {}
    for (gpu, metric), g in f.groupby(["gpu", "metric"], sort=True):
        out.setdefault(gpu, {})[metric] = round(float(g["log"].abs().median()) / MEDIAN_ABS_PER_SD, 3)
    return out


def margins(frame: pd.DataFrame, metrics) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The margins of :mod:`.margin`, from the rows: per measured GPU its leave-one-dataset-out log sd;
    for any other GPU, per metric, the largest leave-one-out log sd of a measured GPU and the largest
    other-GPU log sd added in quadrature (3 decimals): what a measured GPU shows out of sample, and on
    top of it the error of constants carried from another GPU, so always wider than a measured GPU's."""
    measured = {gpu: {m: by_metric[m] for m in metrics if m in by_metric}
                for gpu, by_metric in log_sd(frame, LEAVE_ONE_OUT).items()}
    other = log_sd(frame, OTHER_GPU)
    unmeasured = {}
    for m in metrics:
        inside = [v[m] for v in measured.values() if m in v and math.isfinite(v[m])]
        across = [v[m] for v in other.values() if m in v and math.isfinite(v[m])]
        if inside or across:
            unmeasured[m] = round(math.hypot(max(inside, default=0.0), max(across, default=0.0)), 3)
    return measured, unmeasured
