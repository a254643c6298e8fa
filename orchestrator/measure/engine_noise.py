"""What a real engine adds to a measurement that its requests do not show: noise between windows of one
engine start, and between engine starts (:class:`WindowNoise`, a log-scale standard deviation per
metric), with the priors measured for each kind of engine. :mod:`orchestrator.measure.confidence`
widens intervals and moves bootstrap draws by them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["CPU_START_NOISE", "CPU_WINDOW_NOISE", "GPU_START_NOISE", "GPU_WINDOW_NOISE", "NO_START_NOISE",
           "NO_WINDOW_NOISE", "WindowNoise"]


@dataclass(frozen=True)
class WindowNoise:
    """How far a latency statistic moves between windows measured apart at one rate, beyond what one
    window's own requests show: a log-scale standard deviation per metric (``ttft_p99_ms``: 0.27),
    none for a metric not named. A real engine's state and the machine beside it change from one
    window to the next; the block bootstrap of one window cannot see that, so each interval of a
    named metric is widened by it (in quadrature, both sides, divided by the square root of the
    windows pooled). Measured by ``benchmarks/window_noise.py`` (docs/benchmarks.md, "Window noise")."""

    sd: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, sd: Mapping[str, float]) -> "WindowNoise":
        return cls(tuple(sorted((k, float(v)) for k, v in sd.items() if v > 0)))

    def sd_of(self, metric: str) -> float:
        return dict(self.sd).get(metric, 0.0)


NO_WINDOW_NOISE = WindowNoise()
# benchmarks/window_noise.py on results/examples/repeatability-h200/windows.parquet: capacity levels of
# vLLM 0.26 on one H200 measured in two windows (7 levels, 14 windows, near the knee). Tails of TTFT
# move between windows by more than their requests show; medians, TPOT's p50, ITL and E2E latency do
# not. p95 is not measured: between p90's and p99's; TPOT p90/p95 as its p99.
GPU_WINDOW_NOISE = WindowNoise.of({"ttft_p90_ms": 0.18, "ttft_p95_ms": 0.22, "ttft_p99_ms": 0.27,
                                   "tpot_p90_ms": 0.12, "tpot_p95_ms": 0.12, "tpot_p99_ms": 0.12})
# The same on vLLM's CPU build, one configuration at a fixed rate over five seeds (each its own engine
# start; results/examples/repeatability-cpu-vllm): only TTFT's median moved beyond its intervals.
CPU_WINDOW_NOISE = WindowNoise.of({"ttft_mean_ms": 0.17, "ttft_p50_ms": 0.17})

# Start-to-start noise: how far a metric moves between two engine starts of one configuration, beyond
# what the windows of one start show (log-scale standard deviation; one shift per start, shared by every
# window and level of it). One start cannot see it; a capacity's interval and every paired comparison
# carry it (orchestrator.trial.capacity_fit, orchestrator.results.paired). The simulator has none: the
# same requests give the same numbers. The real engines' priors are measured by starting the engine
# anew for every replicate (benchmarks/repeatability.py --starts; docs/benchmarks.md, "Engine starts
# as replicates"); a study's own replicate starts (racing) replace them where it has them.
NO_START_NOISE = WindowNoise()
# vLLM 0.26 on an H100 (results/examples/starts-h100): the inter-token tail moves between starts
# (the defaults' ITL p99 at one rate: 24-27 ms on one start, 32-38 ms on the next), the rest hardly.
# The tuned configuration's capacity repeated within 1% over four starts on one machine, and within 1.3% over
# three on another lease (results/examples/starts-h100-one-machine): on one machine the engine's speed
# (capacity_rps, the whole curve along the rate) hardly moves. Between machines it moved further (35-47 req/s)
# where the ITL tail bound the capacity, which the ITL priors carry.
GPU_START_NOISE = WindowNoise.of({"capacity_rps": 0.02, "itl_p90_ms": 0.15, "itl_p95_ms": 0.15, "itl_p99_ms": 0.15,
                                  "tpot_p50_ms": 0.03, "tpot_p90_ms": 0.05, "tpot_p99_ms": 0.05,
                                  "ttft_p50_ms": 0.05, "ttft_p90_ms": 0.05, "ttft_p99_ms": 0.05})
# vLLM's CPU build on a 2-core machine (results/examples/starts-cpu-vllm): the engine's speed moves between
# starts (five starts of one configuration on one draw of requests: capacities 36-52 req/s while other
# processes ran beside it), the tail of TTFT with it.
CPU_START_NOISE = WindowNoise.of({"capacity_rps": 0.10, "ttft_p99_ms": 0.05, "ttft_p90_ms": 0.05, "ttft_p95_ms": 0.05})
