"""What a GPU-hour costs, and the metrics people rank deployments by: per GPU and per dollar.

Three columns of every trials row come from here (:func:`unit_metrics`), computed from
other columns of the same row, so they are objectives and constraints like any metric:

* ``goodput_per_gpu``: ``goodput / gpus`` (requests per second meeting every SLO, per GPU);
* ``capacity_rps_per_gpu``: ``capacity_rps / gpus`` (capacity search only);
* ``cost_per_mtok``: ``price_per_gpu_hour * gpus / 3600 / output_throughput * 1e6``: dollars
  per million output tokens at the measured window's output rate (in a capacity search, the
  capacity level's: the level the row reports).

``gpus`` is the trial's TP x PP (one replica per trial). The price is
``hardware.price_per_gpu_hour`` from the study file, else :data:`DEFAULT_PRICE_PER_GPU_HOUR`
for the study's GPU; with neither (a CPU study) ``cost_per_mtok`` is null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import pandas as pd

from orchestrator.hardware.gpus import get_gpu
from orchestrator.measure.confidence import Interval, scaled
from orchestrator.measure.metrics import UNIT_METRIC_NAMES

# On-demand list prices in US dollars per GPU-hour, rounded ballparks from the large clouds'
# price lists (2025; a 1-GPU instance, or an 8-GPU one / 8). Real prices vary by provider, region and
# commitment: set ``hardware.price_per_gpu_hour`` in the study file to use yours.
DEFAULT_PRICE_PER_GPU_HOUR: dict[str, float] = {
    "T4": 0.53,
    "A10G": 1.01,
    "L4": 0.80,
    "L40S": 1.86,
    "A100-40GB": 2.75,
    "A100-80GB": 3.45,
    "H100-80GB": 6.90,
    "H200": 7.90,
    "B200": 14.25,
}


@dataclass(frozen=True)
class GpuHourPrice:
    """The price a study's costs use and where it came from (``value`` None: no price known)."""

    gpu: str
    value: Optional[float]
    source: str  # "study file", "default", or "none"

    def describe(self) -> str:
        """One line for the run's header, ``show`` and the report."""
        if self.value is None:
            return (f"no GPU-hour price for {self.gpu}: cost_per_mtok stays empty "
                    "(set hardware.price_per_gpu_hour)")
        origin = ("hardware.price_per_gpu_hour" if self.source == "study file" else
                  f"default list price for {self.gpu}; hardware.price_per_gpu_hour overrides")
        return f"price ${self.value:,.2f} per GPU-hour ({origin})"


def default_price(gpu: Optional[str]) -> Optional[float]:
    """The table's price for a GPU name (catalog names and their aliases), or None."""
    if not gpu:
        return None
    try:
        return DEFAULT_PRICE_PER_GPU_HOUR.get(get_gpu(gpu).name)
    except KeyError:  # CPU, or a name outside the catalog (an imported benchmark's --gpu)
        return None


def gpu_hour_price(gpu: str, override: Optional[float] = None) -> GpuHourPrice:
    """The study file's price when given, else the default for ``gpu``."""
    if override is not None:
        return GpuHourPrice(gpu, float(override), "study file")
    value = default_price(gpu)
    return GpuHourPrice(gpu, value, "default" if value is not None else "none")


def _positive(value: Any) -> Optional[float]:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if x > 0 and x < float("inf") else None


@dataclass(frozen=True)
class UnitMetrics:
    """What people rank deployments by (:func:`unit_metrics`); None where an input is missing."""

    goodput_per_gpu: Optional[float] = None
    capacity_rps_per_gpu: Optional[float] = None
    cost_per_mtok: Optional[float] = None

    def columns(self) -> dict[str, Optional[float]]:
        return {"goodput_per_gpu": self.goodput_per_gpu, "capacity_rps_per_gpu": self.capacity_rps_per_gpu,
                "cost_per_mtok": self.cost_per_mtok}


def unit_metrics(values: Mapping[str, Any], gpus: Optional[int], price_per_gpu_hour: Optional[float]) -> dict:
    """``goodput_per_gpu``, ``capacity_rps_per_gpu`` and ``cost_per_mtok`` from a row's own columns.

    A value whose inputs are missing is None: no GPU count, no capacity search, no price, or
    no output tokens (a cost per token of nothing is not a number)."""
    n = gpus if gpus is not None and gpus >= 1 else None
    goodput, capacity = values.get("goodput"), values.get("capacity_rps")
    out_tps = _positive(values.get("output_throughput"))
    return {
        "goodput_per_gpu": float(goodput) / n if n is not None and goodput is not None else None,
        "capacity_rps_per_gpu": float(capacity) / n if n is not None and capacity is not None else None,
        "cost_per_mtok": (price_per_gpu_hour * n / 3600.0 / out_tps * 1e6
                          if n is not None and price_per_gpu_hour is not None and out_tps is not None else None),
    }


def unit_metric_intervals(intervals: Mapping[str, Any], gpus: Optional[int],
                          price_per_gpu_hour: Optional[float]) -> dict:
    """:func:`unit_metrics`' intervals from the intervals of their inputs (``Interval`` objects by
    metric): per GPU divides both ends; a cost per token swaps them (more tokens, less cost)."""
    n = gpus if gpus is not None and gpus >= 1 else None
    out = {}
    if n is None:
        return out
    for source, target in (("goodput", "goodput_per_gpu"), ("capacity_rps", "capacity_rps_per_gpu")):
        iv = scaled(intervals.get(source), 1.0 / n)
        if iv is not None:
            out[target] = iv
    tps = intervals.get("output_throughput")
    if tps is not None and price_per_gpu_hour is not None:
        def cost(t: Optional[float]) -> Optional[float]:
            return price_per_gpu_hour * n / 3600.0 / t * 1e6 if t is not None and t > 0 else None
        out["cost_per_mtok"] = Interval(cost(tps.high), cost(tps.low))
    return out


def unit_columns(frame: Any) -> list[str]:
    """The unit metrics a trials frame (or row) has values for, in :data:`UNIT_METRIC_NAMES` order:
    what ``show``, ``pareto``, ``recommend`` and the report add to the study's own metrics."""
    out = []
    for name in UNIT_METRIC_NAMES:
        if name in frame and pd.to_numeric(pd.Series(frame[name]), errors="coerce").notna().any():
            out.append(name)
    return out
