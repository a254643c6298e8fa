"""docs/simulator.md's calibration history on the warm H200 ingress runs (``results/examples/h200-ingress``):
each earlier fit's simulator against the runs, the measured side read from the dataset.

The earlier simulators are gone from the code (their constants, and the no-graph launch model of the
cold fit), so what they gave on these runs is recorded in :data:`EARLIER`: ``benchmarks/sim_vs_h200.py
ingress`` at the commit that held each fit, with the per-token fields of its records summarised as
:func:`orchestrator.apps.measured_replay.summary` does. The simulator is deterministic, so these
are the numbers it gave, not a draw. Everything measured, and every error, comes from the dataset.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.apps.measured_replay import TABLE_HEADER, Point, ingress_points, table_row

# The simulator of each earlier fit on the ingress runs, by rate (virtual time, the runs' arrival
# seeds): "cold fit" as of commit 0d540d6^, "warm re-fit" as of commit 0d540d6.
EARLIER: dict[str, dict[str, dict[str, float]]] = {
    "cold fit": {
        "40": {"req_s": 37.5286, "ttft_p50_ms": 92.8216, "ttft_p90_ms": 130.0774, "tpot_p50_ms": 16.8111,
               "tpot_mean_ms": 16.1732, "tpot_p90_ms": 20.8239, "tpot_p99_ms": 22.2594, "itl_mean_ms": 16.1732,
               "itl_p50_ms": 7.2020, "itl_p90_ms": 36.4410, "itl_p99_ms": 58.8108, "e2el_p50_ms": 2242.9611},
        "inf": {"req_s": 53.0146, "ttft_p50_ms": 3224.2122, "ttft_p90_ms": 7152.4611, "tpot_p50_ms": 33.9214,
                "tpot_mean_ms": 28.1762, "tpot_p90_ms": 34.1064, "tpot_p99_ms": 35.3438, "itl_mean_ms": 28.1762,
                "itl_p50_ms": 12.5493, "itl_p90_ms": 13.3224, "itl_p99_ms": 202.1948, "e2el_p50_ms": 7555.6767},
    },
    "warm re-fit": {
        "40": {"req_s": 37.4235, "ttft_p50_ms": 78.2381, "ttft_p90_ms": 114.4545, "tpot_p50_ms": 14.8238,
               "tpot_mean_ms": 13.8972, "tpot_p90_ms": 16.9631, "tpot_p99_ms": 18.7237, "itl_mean_ms": 13.8972,
               "itl_p50_ms": 7.5937, "itl_p90_ms": 31.5890, "itl_p99_ms": 45.9562, "e2el_p50_ms": 1971.6204},
        "inf": {"req_s": 49.0767, "ttft_p50_ms": 3359.1772, "ttft_p90_ms": 7618.4794, "tpot_p50_ms": 36.6618,
                "tpot_mean_ms": 30.7085, "tpot_p90_ms": 36.8471, "tpot_p99_ms": 38.1350, "itl_mean_ms": 30.7085,
                "itl_p50_ms": 14.6031, "itl_p90_ms": 15.3761, "itl_p99_ms": 210.7061, "e2el_p50_ms": 8038.7169},
    },
}


def rate_of(point: Point) -> str:
    """``40`` or ``inf``: the rate of an ingress point (its key holds it)."""
    return str(point.key[3])


def earlier_points(folder: str | Path, fit: str) -> list[Point]:
    """The ingress runs (bare and `engine`) with the simulated side of the ``fit``'s simulator."""
    points = ingress_points(str(folder))
    for p in points:
        p.sim = EARLIER[fit][rate_of(p)]
    return points


def earlier_table(folder: str | Path, fit: str) -> str:
    """The ingress runs against the ``fit``'s simulator, as the current constants' table shows them."""
    return "\n".join([TABLE_HEADER, *(table_row(p) for p in earlier_points(folder, fit))])


def cold_fit_table(folder: str | Path) -> str:
    return earlier_table(folder, "cold fit")


def warm_refit_table(folder: str | Path) -> str:
    return earlier_table(folder, "warm re-fit")
