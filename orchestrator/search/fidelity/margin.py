"""How far the fidelity search trusts the simulator on a GPU, and how many real trials confirm it.

The simulator's out-of-sample error was measured per GPU and metric on the recorded real
datasets (docs/simulator.md, "Out-of-sample error"; ``benchmarks/sim_error.py`` writes
``results/examples/sim-error`` and :func:`orchestrator.search.fidelity.error.margins` reads
it: ``tests/search/test_sim_error.py`` keeps the numbers below equal to it). As a log sd
(the median of ``|log(predicted / measured)|`` over 0.6745):

* a GPU measured there: its leave-one-dataset-out error (the calibration fitted on its
  other datasets, the rest predicted);
* any other GPU: per metric, the largest measured GPU's error and the largest error with
  another GPU's calibration, added in quadrature: what a measured GPU shows out of sample, and
  on top of it the error of constants carried across GPUs; always wider than a measured GPU's.

The rule, in one place (:func:`screening_rule`):

* **margin**: the residual model's spread before any real trial
  (:class:`~orchestrator.search.fidelity.model.Residuals`), so how far a prediction may be off
  when the search weighs the chance that a configuration meets the SLOs and its expected gain;
* **confirmations**: the real trials the search runs before its stop rule may end it:
  ``n = ceil(sd / NOISE_LOG_SD)`` for the first objective's sd, at least 1. The simulator cannot
  order configurations closer than its error, and a real measurement tells apart configurations
  one noise width apart: as many real trials as noise widths fit in the simulator's error (the
  study's budget bounds them);
* **the stated error** of each real trial's prediction (:meth:`ScreeningRule.band`): the
  prediction times ``exp(-sd)`` to ``exp(+sd)``, printed before the trial runs and kept in its row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

from orchestrator.hardware.gpus import get_gpu
from orchestrator.numbers import finite_float
from orchestrator.search.fidelity.model import NOISE_LOG_SD, metric_family

# GPU -> metric -> log sd, leave one dataset out (results/examples/sim-error).
MEASURED_LOG_SD: dict[str, dict[str, float]] = {
    "H100-80GB": {"capacity_rps": 0.277, "output_throughput": 0.033, "ttft_p50_ms": 0.712, "ttft_p99_ms": 0.651,
                  "itl_p99_ms": 0.332, "tpot_p50_ms": 0.207},
    "H200": {"capacity_rps": 0.313, "output_throughput": 0.055, "ttft_p50_ms": 0.236, "ttft_p99_ms": 0.645,
             "itl_p99_ms": 0.168, "tpot_p50_ms": 0.243},
}
# metric -> log sd on a GPU not measured.
UNMEASURED_LOG_SD: dict[str, float] = {"capacity_rps": 0.479, "output_throughput": 0.071, "ttft_p50_ms": 1.06,
                                       "ttft_p99_ms": 0.98, "itl_p99_ms": 0.385, "tpot_p50_ms": 0.339}


def confirmations(sd: float) -> int:
    """Real trials before the stop rule applies, for a first objective of log sd ``sd``."""
    return max(math.ceil(round(sd / NOISE_LOG_SD, 9)), 1)


@dataclass(frozen=True)
class ScreeningRule:
    """The simulator's expected error on one GPU and what the fidelity search makes of it."""

    gpu: str
    measured: bool  # the GPU is one the error was measured on
    log_sd: Mapping[str, float]  # by metric

    def sd(self, metric: str) -> float:
        """``metric``'s log sd; a metric not measured takes its family's widest (throughputs, TTFT,
        per-token latencies), else the widest of all."""
        if metric in self.log_sd:
            return self.log_sd[metric]
        family = [v for m, v in self.log_sd.items() if metric_family(m) == metric_family(metric)]
        return max(family or self.log_sd.values())

    def confirmations(self, objective: str) -> int:
        return confirmations(self.sd(objective))

    def band(self, metric: str, predicted: object) -> Optional[tuple[float, float]]:
        """The stated error of a prediction of ``metric``: where the measurement should fall,
        ``predicted`` times ``exp(-sd)`` to ``exp(+sd)`` (one log sd either way, as the error was
        measured); None for a prediction that is not a positive number."""
        p = finite_float(predicted)
        if p is None or p <= 0:
            return None
        sd = self.sd(metric)
        return p * math.exp(-sd), p * math.exp(sd)

    def describe(self, objective: str) -> str:
        where = "measured out of sample" if self.measured else "never measured: wider than on a measured GPU"
        sds = ", ".join(f"{m} {v:.3f}" for m, v in self.log_sd.items())
        return (f"simulator error on {self.gpu} ({where}), log sd: {sds}; "
                f"{self.confirmations(objective)} real trial(s) before the stop rule")


def screening_rule(gpu: str) -> ScreeningRule:
    """The rule for a study on ``gpu`` (a catalog name or alias)."""
    name = get_gpu(gpu).name
    if name in MEASURED_LOG_SD:
        return ScreeningRule(name, True, dict(MEASURED_LOG_SD[name]))
    return ScreeningRule(name, False, dict(UNMEASURED_LOG_SD))
