"""docs/simulator.md's calibration history on the warm H200 ingress runs (``results/examples/h200-ingress``):
each earlier fit's simulator against the runs, the measured side read from the dataset.

The earlier simulators are gone from the code (their constants, and the no-graph launch model of the
cold fit), so what they gave on these runs is recorded in :data:`EARLIER`: ``benchmarks/sim_vs_h200.py
ingress`` at the commit that held each fit, with the per-token fields of its records summarised as
:func:`orchestrator.apps.measured_replay.summary` does. The simulator is deterministic, so these
are the numbers it gave, not a draw. Everything measured, and every error, comes from the dataset.

:func:`constants_table` sets each earlier fit's constants (:data:`EARLIER_CONSTANTS`, read from those
commits) beside the ones ``sim/cost.py`` holds now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

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


# ---------------------------------------------------------------- the constants, fit by fit
# sim/cost.py's constants at each earlier fit (the commits above). None: not in that model (an fp8 KV
# cache was read at HBM_EFFICIENCY; no per-token frontend time).
EARLIER_CONSTANTS: dict[str, dict[str, Optional[float]]] = {
    "cold fit": {"GEMM_EFFICIENCY": 0.62, "GEMM_HALF_ROWS": 12, "STEP_OVERHEAD_S": 1.45e-3,
                 "FRONTEND_LATENCY_S": 0.031, "FRONTEND_TOKEN_S": None, "FP8_KV_READ_EFFICIENCY": None,
                 "NOGRAPH_LAYER_S": 200e-6, "EAGER_LAYER_S": 220e-6, "PER_SEQ_OVERHEAD_S": 0.5e-6,
                 "HBM_EFFICIENCY": 0.85, "ATTN_EFFICIENCY": 0.45, "PIECEWISE_LAYER_S": 15e-6, "SYNC_STEP_S": 1.5e-3,
                 "SYNC_PER_SEQ_S": 8e-6, "PP_BUBBLE": 0.1},
    "warm re-fit": {"GEMM_EFFICIENCY": 0.58, "GEMM_HALF_ROWS": 56, "STEP_OVERHEAD_S": 1.9e-3,
                    "FRONTEND_LATENCY_S": 0.030, "FRONTEND_TOKEN_S": None, "FP8_KV_READ_EFFICIENCY": None,
                    "NOGRAPH_LAYER_S": 200e-6, "EAGER_LAYER_S": 220e-6, "PER_SEQ_OVERHEAD_S": 0.5e-6,
                    "HBM_EFFICIENCY": 0.85, "ATTN_EFFICIENCY": 0.45, "PIECEWISE_LAYER_S": 15e-6,
                    "SYNC_STEP_S": 1.5e-3, "SYNC_PER_SEQ_S": 8e-6, "PP_BUBBLE": 0.1},
}
CURRENT = "joint fit (current)"
# How a launch time entered a step in each model (the value alone does not say).
LAUNCHES: dict[str, dict[str, str]] = {
    "cold fit": {"NOGRAPH_LAYER_S": "added to every step", "EAGER_LAYER_S": "added"},
    "warm re-fit": {"NOGRAPH_LAYER_S": "only beyond the GPU work", "EAGER_LAYER_S": "added"},
    CURRENT: {"NOGRAPH_LAYER_S": "only beyond the GPU work", "EAGER_LAYER_S": "added to the GPU work"},
}
# Where a current value came from, as written when it was set: shown while the constant holds that value.
CURRENT_NOTES: dict[str, tuple[float, str]] = {
    "GEMM_EFFICIENCY": (0.60, "fit: 0.62; the 8,192-token steps allow ~0.60"),
    "STEP_OVERHEAD_S": (2.5e-3, "the cold 16-sequence runs' bound"),
    "FRONTEND_TOKEN_S": (50e-6, "measured, not fitted"),
}
# The rows the table names one by one (with what the constant is); the others share one row while no
# fit has moved them.
NAMED = {"GEMM_EFFICIENCY": "of peak, tall GEMMs", "GEMM_HALF_ROWS": "", "STEP_OVERHEAD_S": "",
         "FRONTEND_LATENCY_S": "", "FRONTEND_TOKEN_S": "API server, per streamed token",
         "FP8_KV_READ_EFFICIENCY": "of HBM peak", "NOGRAPH_LAYER_S": "above the capture sizes",
         "EAGER_LAYER_S": "`enforce_eager`"}


def _value(name: str, value: float) -> str:
    if name.endswith("_LAYER_S"):
        return f"{value * 1e6:g} µs / layer"
    if name == "FRONTEND_TOKEN_S" or "PER_SEQ" in name:
        return f"{value * 1e6:g} µs"
    if name.endswith("_S"):
        return f"{value * 1e3:g} ms"
    if name.endswith("EFFICIENCY"):
        return f"{value:.2f}"
    return f"{value:g}"


def _cell(name: str, values: dict[str, Optional[float]], fit: str) -> str:
    value = values.get(name)
    if value is None:
        return f"as bf16 ({values['HBM_EFFICIENCY']:.2f})" if name == "FP8_KV_READ_EFFICIENCY" else "–"
    how = LAUNCHES[fit].get(name)
    return f"{_value(name, value)}, {how}" if how else _value(name, value)


def current_constants(module) -> dict[str, Optional[float]]:
    """The constants :data:`EARLIER_CONSTANTS` records, as ``module`` (sim/cost.py) holds them now."""
    return {name: getattr(module, name, None) for name in EARLIER_CONSTANTS["warm re-fit"]}


def constants_table(module) -> str:
    """Each fit's constants: the earlier ones recorded, the current ones read from ``module``."""
    fits = {**EARLIER_CONSTANTS, CURRENT: current_constants(module)}
    last = list(EARLIER_CONSTANTS)[-1]
    rows = []

    def current_cell(name: str) -> str:
        cell = _cell(name, fits[CURRENT], CURRENT)
        if cell == _cell(name, fits[last], last):
            return "unchanged"
        value, note = CURRENT_NOTES.get(name, (None, ""))
        return f"{cell} ({note})" if note and value == fits[CURRENT][name] else cell

    unchanged = [n for n in fits[CURRENT] if n not in NAMED and len({f[n] for f in fits.values()}) == 1]
    for name in [*NAMED, *(n for n in fits[CURRENT] if n not in NAMED and n not in unchanged)]:
        what = f" ({NAMED[name]})" if NAMED.get(name) else ""
        rows.append([f"`{name}`{what}", *(_cell(name, fits[f], f) for f in EARLIER_CONSTANTS), current_cell(name)])
    if unchanged:
        rows.append([", ".join(f"`{n}`" for n in unchanged), *["unchanged"] * len(fits)])
    path = module.__name__.removeprefix("orchestrator.").replace(".", "/") + ".py"
    return "\n".join([f"| constant (`{path}`) | {' | '.join(fits)} |", "| --- |" + " --- |" * len(fits),
                      *(f"| {' | '.join(r)} |" for r in rows)])
