"""docs/benchmarks.md's table of the two calibration fits on the H200 datasets, and its prose, from
``results/examples/fidelity-fit``.

``benchmarks/fidelity_fit.py --output DIR`` stores each fit (``fits.parquet``: real trials fitted,
the way, the calibration, the fit's RMS log error and seconds), every held-out trial's measured
and predicted capacity under it (``predictions.parquet``) and the run (``run.json``). The errors
and their medians are computed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, count_word, join, paragraph, series, span
from orchestrator.doc_tables.h200 import markdown
from orchestrator.doc_tables.search_efficiency import code_block, machine

FITS_FILE, PREDICTIONS_FILE, RUN_FILE = "fits.parquet", "predictions.parquet", "run.json"
FIELDS = ("step_overhead", "compute_efficiency", "bandwidth_efficiency", "frontend_latency")
UNCALIBRATED, PER_TRIAL, PER_LEVEL = "uncalibrated", "per trial", "per level"
WITHIN = 0.10


@dataclass(frozen=True)
class Fit:
    """One calibration (k real trials fitted, one way) and its errors on the held-out trials."""

    k: int
    way: str
    calibration: tuple[float, ...]  # FIELDS' multipliers
    fit_s: float
    median: float  # |predicted - measured| / measured, over the held-out trials
    max: float
    within: int  # held-out trials predicted within WITHIN
    held_out: int
    uncalibrated: float  # the uncalibrated simulator's median |error| on the same held-out trials

    @property
    def moved(self) -> bool:
        return any(abs(v - 1.0) > 1e-9 for v in self.calibration)


def _errors(p: pd.DataFrame) -> pd.Series:
    return ((p["predicted"] - p["measured"]).abs() / p["measured"]).set_axis(p["dataset"] + "/" + p["trial_id"])


def fits(fit_rows: pd.DataFrame, predictions: pd.DataFrame) -> list[Fit]:
    plain = _errors(predictions[predictions["way"] == UNCALIBRATED])
    out = []
    for r in fit_rows.itertuples():
        err = _errors(predictions[(predictions["k"] == r.k) & (predictions["way"] == r.way)])
        out.append(Fit(int(r.k), str(r.way), tuple(float(getattr(r, f)) for f in FIELDS), float(r.fit_s),
                       float(err.median()), float(err.max()), int((err <= WITHIN).sum()), len(err),
                       float(plain[err.index].median())))
    return out


def load(folder: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    folder = Path(folder)
    return (pd.read_parquet(folder / FITS_FILE), pd.read_parquet(folder / PREDICTIONS_FILE),
            json.loads((folder / RUN_FILE).read_text()))


def table(fit_rows: pd.DataFrame, predictions: pd.DataFrame) -> str:
    rows = [[str(f.k), f.way, f"{f.median:.1%} / {f.max:.1%}", f"{f.within} of {f.held_out}",
             ", ".join(f"{v:.2f}" for v in f.calibration), f"{f.fit_s:.0f}"] for f in fits(fit_rows, predictions)]
    return markdown(["real trials fitted", "fit", "held-out capacity \\|error\\|: median / max",
                     f"within {WITHIN:.0%}", "calibration (step, compute, bandwidth, frontend)", "fit s"],
                    "llllll", rows)


def fits_table(folder: str | Path) -> str:
    fit_rows, predictions, _ = load(folder)
    return table(fit_rows, predictions)


# ---------------------------------------------------------------- prose
def fit_run(folder: str | Path) -> str:
    """The command that wrote the dataset, what was fitted and held out, and on which machine."""
    fit_rows, predictions, run = load(folder)
    ks = sorted(int(k) for k in fit_rows["k"].unique() if k > 0)
    return join(code_block(run["command"]), paragraph(
        f"For k = {ks[0]}..{ks[-1]}, the calibration is fitted to the first k completed trials of `{run['fit_from']}` "
        "(trial order), per trial (the old fit) and per level (the new one); the calibrated simulator then predicts "
        "the capacity of every other completed trial of that study and of "
        f"{series([f'`{d}`' for d in run['also_held_out']])}. The timer (`fit s`) covers the fit alone, in one "
        f"process (its simulations): it is this machine's, {machine(run)}, {count_word(run['jobs'])} fit{'' if run['jobs'] == 1 else 's'} at a time, {run['seconds']:.0f} s in all, "
        f"at commit {run['commit']} on {run['started'][:10]}."))


def _adjective(way: str) -> str:
    """``per trial`` -> ``per-trial`` (before "fit")."""
    return way.replace(" ", "-")


def _ahead(a: Fit, b: Fit) -> str:
    if round(a.median, 3) == round(b.median, 3):
        return f"both {a.median:.1%} at k = {a.k}"
    first, second = (a, b) if a.median < b.median else (b, a)
    return f"{first.way} at k = {a.k} (median {first.median:.1%} against {second.median:.1%})"


def fit_findings(folder: str | Path) -> str:
    """Whether either fit improves on the uncalibrated simulator, which is ahead at each k, and which
    fits did not move from no calibration."""
    fit_rows, predictions, _ = load(folder)
    all_fits = fits(fit_rows, predictions)
    base = next(f for f in all_fits if f.way == UNCALIBRATED)
    by_k = {f.k: {g.way: g for g in all_fits if g.k == f.k} for f in all_fits if f.k > 0}
    pairs = [(ws[PER_TRIAL], ws[PER_LEVEL]) for _, ws in sorted(by_k.items()) if PER_TRIAL in ws and PER_LEVEL in ws]
    # Against the uncalibrated simulator on the same held-out trials (fewer as k grows)
    better = {w: [f for f in all_fits if f.way == w and f.median < f.uncalibrated] for w in (PER_TRIAL, PER_LEVEL)}
    leaders = {("tie" if round(t.median, 3) == round(p.median, 3) else (t.way if t.median < p.median else p.way))
               for t, p in pairs}
    always = [_adjective(w) for w, fs in better.items() if pairs and len(fs) == len(pairs)]
    led = sorted(leaders - {"tie"})
    order = (", and neither is consistently better" if len(led) != 1
             else f", and the {_adjective(led[0])} fit is never behind")
    head = ((f"**The {series(always)} fit improves held-out capacity predictions at every k**" if always else
             "**Neither fit improves held-out capacity predictions at every k on these datasets**")
            + order + f": {series([_ahead(t, p) for t, p in pairs])}. Below the uncalibrated simulator's median on "
            f"the same held-out trials ({span([f.uncalibrated for f in all_fits if f.k > 0], '.1%')} for k = 1.."
            f"{max(f.k for f in all_fits)}; "
            f"{base.median:.1%} on all {base.held_out}): "
            + series([f"{w} at k = {series([str(f.k) for f in fs])}" if fs else f"{w} at no k"
                      for w, fs in better.items()])
            + ". The simulator's own constants were fitted to these same H200 levels (docs/simulator.md).")
    stalled = [f for f in all_fits if f.k > 0 and not f.moved]
    items = [head]
    if stalled:
        ways = {f.way: [str(g.k) for g in stalled if g.way == f.way] for f in stalled}
        items.append(
            f"**A fit can stall**: {series([f'the {_adjective(w)} fit at k = {series(ks)}' for w, ks in ways.items()])}"
            " did not move from 1.0 (no damped step lowered its cost)."
            + (" The per-trial fit's residuals are taken at the capacity the simulator finds, which moves in steps "
               "of the capacity search as a multiplier moves, so finite differences see a staircase; a level's "
               "metrics at a fixed rate move smoothly." if any(f.way == PER_TRIAL for f in stalled) else ""))
    return bullets(items)
