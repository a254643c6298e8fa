"""docs/simulator.md's out-of-sample error tables, from ``results/examples/sim-error``.

``benchmarks/sim_error.py`` replays every recorded real trial in the simulator
(:mod:`orchestrator.search.fidelity.replay`) and stores one row per compared number
(``errors.parquet``), each fold's calibration (``fits.parquet``) and the run (``run.json``);
these functions only summarise what is stored (:mod:`orchestrator.search.fidelity.error`),
so the docs' check is fast and the numbers change only when the benchmark runs again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, paragraph, series
from orchestrator.doc_tables.h200 import DASH, markdown
from orchestrator.search.fidelity import error
from orchestrator.search.fidelity import margin as fidelity_margin
from orchestrator.search.fidelity.replay import LEAVE_ONE_OUT, OTHER_GPU, SCHEMES, SHIPPED, TABLE_METRICS

ERRORS_FILE, FITS_FILE, RUN_FILE = "errors.parquet", "fits.parquet", "run.json"
NAMES = {"capacity_rps": "capacity (per trial)", "output_throughput": "output throughput",
         "ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "itl_p99_ms": "ITL p99", "tpot_p50_ms": "TPOT p50"}
# The bound on the leave-one-dataset-out median error (none stated for the medians of latency).
TARGETS = {"capacity_rps": 0.10, "output_throughput": 0.10, "ttft_p99_ms": 0.15, "itl_p99_ms": 0.15}
SCHEME_NAMES = {SHIPPED: "shipped", LEAVE_ONE_OUT: "leave one dataset out", OTHER_GPU: "other GPU's calibration"}


def load(folder: str | Path) -> pd.DataFrame:
    return pd.read_parquet(Path(folder) / ERRORS_FILE)


def pct(x: float) -> str:
    return DASH if pd.isna(x) else f"{100 * x:.0f}%"


def _cell(s: pd.DataFrame) -> str:
    if s.empty:
        return DASH
    r = s.iloc[0]
    return f"{pct(r['median'])} / {pct(r['max'])} ({int(r['points'])})"


def by_gpu_table(folder: str | Path) -> str:
    """Per GPU and metric: median / max |relative error| (points) under each scheme, and whether the
    leave-one-dataset-out median meets the issue's bound."""
    s = error.summary(load(folder))
    rows = []
    for gpu in sorted(s["gpu"].unique()):
        for m in TABLE_METRICS:
            at = s[(s["gpu"] == gpu) & (s["metric"] == m)]
            cells = [_cell(at[at["scheme"] == scheme]) for scheme in SCHEMES]
            target = TARGETS.get(m)
            lodo = at[at["scheme"] == LEAVE_ONE_OUT]
            met = DASH if target is None or lodo.empty else ("yes" if lodo["median"].iloc[0] <= target else "**no**")
            rows.append([gpu, NAMES[m], *cells, DASH if target is None else f"≤ {pct(target)}", met])
    return markdown(["GPU", "metric", *(f"{SCHEME_NAMES[s]}: median / max (points)" for s in SCHEMES),
                     "bound (leave-one-out median)", "met"], "llrrrrl", rows)


def by_dataset_table(folder: str | Path) -> str:
    """Per dataset, leave one dataset out: median |error| of each metric; and the ranking of the
    study's configurations by its first objective, pairs right of those measured apart, per scheme."""
    frame = load(folder)
    s = error.summary(frame, by=("scheme", "gpu", "dataset", "metric"))
    s = s[s["scheme"] == LEAVE_ONE_OUT]
    rank = error.ranking(frame)
    rows = []
    for (gpu, dataset), g in frame.groupby(["gpu", "dataset"], sort=True):
        cells = [pct(v.iloc[0]) if len(v := s[(s["dataset"] == dataset) & (s["metric"] == m)]["median"]) else DASH
                 for m in TABLE_METRICS]
        ranked = []
        for scheme in SCHEMES:
            r = rank[(rank["scheme"] == scheme) & (rank["dataset"] == dataset)]
            pairs = int(r["pairs"].sum())
            ranked.append(f"{int(r['right'].sum())} of {pairs}" if pairs else DASH)
        trials = g[g["scheme"] == SHIPPED]["trial_id"].nunique()
        rows.append([dataset, gpu, str(trials), *cells, " / ".join(ranked)])
    return markdown(["dataset", "GPU", "trials", *(NAMES[m] for m in TABLE_METRICS),
                     "ranking: pairs in the measured order (shipped / leave-one-out / other GPU)"],
                    "llr" + "r" * len(TABLE_METRICS) + "r", rows)


def margins_table(folder: str | Path) -> str:
    """The fidelity search's margins from the rows, per metric: the log sd and, were it the first
    objective, the confirmations; per measured GPU, and for any other GPU."""
    measured, unmeasured = error.margins(load(folder), TABLE_METRICS)

    def cells(sds: dict) -> list[str]:
        return [f"{sds[m]:.3f} ({fidelity_margin.confirmations(sds[m])})" if m in sds else DASH
                for m in TABLE_METRICS]

    rows = [[gpu, "leave one dataset out", *cells(sds)] for gpu, sds in sorted(measured.items())]
    rows.append(["any other GPU", "a measured GPU's largest (+) other GPU's calibration's largest", *cells(unmeasured)])
    return markdown(["GPU", "from", *(f"{NAMES[m]}: log sd (confirmations)" for m in TABLE_METRICS)],
                    "ll" + "r" * len(TABLE_METRICS), rows)


def fits_table(folder: str | Path) -> str:
    """Each fold's calibration: what it was fitted on and the multipliers."""
    fits = pd.read_parquet(Path(folder) / FITS_FILE)
    fits = fits[fits["scheme"] != SHIPPED]
    run = json.loads((Path(folder) / RUN_FILE).read_text())
    fields = ("step_overhead", "compute_efficiency", "bandwidth_efficiency", "frontend_latency")
    rows = [[SCHEME_NAMES[r["scheme"]], r["gpu"],
             r["held_out"] if r["scheme"] == LEAVE_ONE_OUT else "every dataset of the GPU",
             str(int(r["fit_points"])), DASH if pd.isna(r["fit_rms_log_error"]) else f"{r['fit_rms_log_error']:.3f}",
             *(f"{r[f]:.2f}" for f in fields),
             "none better than none" if all(r[f] == 1.0 for f in fields) else ""] for _, r in fits.iterrows()]
    iterations = int(run["iterations"])
    note = (f"({iterations} fit iteration{'' if iterations == 1 else 's'} from none per fold, "
            f"{run['simulations']:,} simulations in all)")
    return markdown(["scheme", "GPU", "predicted", "fit points", "fit RMS log error", *fields, "calibration found"],
                    "lllrrrrrrl", rows) + "\n\n" + note


# ---------------------------------------------------------------- prose
def _datasets_by_error(s: pd.DataFrame, gpu: str, metric: str, n: int = 2) -> str:
    at = s[(s["gpu"] == gpu) & (s["metric"] == metric)].sort_values("median", ascending=False).head(n)
    return series([f"`{r.dataset}` ({pct(r.median)}, {_points(r.points)})" for r in at.itertuples()])


def _capacity_why(frame: pd.DataFrame, gpu: str) -> str:
    """What the capacity errors come from, in the rows: how wide the measured capacities' own intervals
    are, and how the latencies measured above each trial's capacity compare with their predictions."""
    f = error.scored(frame)
    f = f[(f["scheme"] == LEAVE_ONE_OUT) & (f["gpu"] == gpu)]
    cap = f[(f["metric"] == "capacity_rps") & (f["level"] == -1)]
    parts = []
    band = cap.dropna(subset=["measured_low", "measured_high"])
    band = band[band["measured_high"] > band["measured_low"]]
    if len(band):
        half = ((band["measured_high"] - band["measured_low"]) / 2 / band["measured"]).median()
        parts.append(f"the measured capacities' own intervals, where the dataset has them ({len(band)} trials), are "
                     f"a median ±{pct(half)} wide")
    above = f[f["level"] >= 0].merge(cap[["trial_id", "measured"]].rename(columns={"measured": "capacity"}),
                                     on="trial_id")
    above = above[above["rate"] > above["capacity"]]
    ratios = {m: float((g["measured"] / g["predicted"]).median()) for m in ("ttft_p99_ms", "itl_p99_ms", "tpot_p50_ms")
              if len(g := above[above["metric"] == m])}
    if ratios:
        levels = len(above[["trial_id", "level"]].drop_duplicates())
        worst = max(ratios, key=ratios.get)
        parts.append(f"on the {levels} levels above a trial's measured capacity the engine measured "
                     f"{series([f'{NAMES[m]} {r:.2f}x' for m, r in ratios.items()])} the prediction (medians)"
                     + (f": there the engine's {NAMES[worst]} crossed limits the simulator's still met"
                        if ratios[worst] > 1.2 else ""))
    return "; ".join(parts)


def _points(n: int) -> str:
    return f"{n} point" + ("" if n == 1 else "s")


def verdict_text(folder: str | Path) -> str:
    """Per GPU: the leave-one-dataset-out medians against the issue's bounds, and for each bound not met,
    which way the simulator is off and on which datasets most."""
    frame = load(folder)
    s = error.summary(frame)
    s = s[s["scheme"] == LEAVE_ONE_OUT]
    by_dataset = error.summary(frame, by=("scheme", "gpu", "dataset", "metric"))
    by_dataset = by_dataset[by_dataset["scheme"] == LEAVE_ONE_OUT]
    items = []
    for gpu in sorted(s["gpu"].unique()):
        parts, missed = [], []
        for m, bound in TARGETS.items():
            at = s[(s["gpu"] == gpu) & (s["metric"] == m)]
            if at.empty:
                continue
            r = at.iloc[0]
            ok = r["median"] <= bound
            parts.append(f"{NAMES[m]} {pct(r['median'])} ({'within' if ok else 'over'} {pct(bound)})")
            if not ok:
                high = (frame.pipe(error.scored).query("scheme == @LEAVE_ONE_OUT and gpu == @gpu and metric == @m")
                        ["rel"] > 0).mean()
                why = _capacity_why(frame, gpu) if m == "capacity_rps" else ""
                missed.append(f"{NAMES[m]}: predicted high on {pct(high)} of its points (median signed error "
                              f"{100 * r['median_signed']:+.0f}%), most on {_datasets_by_error(by_dataset, gpu, m)}"
                              + (f"; {why}" if why else ""))
        datasets = frame[frame["gpu"] == gpu]["dataset"].nunique()
        items.append(f"**{gpu}** ({datasets} datasets), median |error| leaving one dataset out: {series(parts)}."
                     + (f" Not met: {'; '.join(missed)}." if missed else " Every bound met."))
    return bullets(items)


def ranking_text(folder: str | Path) -> str:
    """How many pairs of configurations measured apart each scheme orders as measured, and which it does not."""
    rank = error.ranking(load(folder))
    parts, decided = [], []
    for scheme in SCHEMES:
        r = rank[rank["scheme"] == scheme]
        parts.append(f"{SCHEME_NAMES[scheme]} {int(r['right'].sum())} of {int(r['pairs'].sum())}")
        decided.append(f"{SCHEME_NAMES[scheme]} {int(r['decided_right'].sum())} of {int(r['decided'].sum())}")
    shipped = rank[rank["scheme"] == SHIPPED]
    lodo = rank[(rank["scheme"] == LEAVE_ONE_OUT) & (rank["wrong"] != "")]
    wrong = [f"`{r.dataset}`: {r.wrong}" for r in lodo.itertuples()]
    return paragraph(
        "Pairs of configurations whose measured first objective differs by more than the study's equivalence "
        f"margin, put in the measured order by the prediction: {series(parts)}.",
        f"{int(shipped['with_intervals'].sum())} of those pairs have a measured interval on both sides (older "
        f"datasets recorded none), and {int(shipped['decided'].sum())} of them are told apart by the "
        f"measurement itself, their intervals apart; on those the prediction gives the measured order: "
        f"{series(decided)}.",
        (f"Out of order leaving one dataset out: {'; '.join(wrong)}." if wrong
         else "Leaving one dataset out, every such pair is in the measured order."))
