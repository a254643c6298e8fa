"""The fidelity search's calibration fit on the H200 capacity studies: per load level vs per trial.

``search.fidelity: sim`` fits the simulator's calibration to the real trials so far
(:meth:`orchestrator.search.fidelity.search.FidelitySearch.refit`). In a capacity study a trial's
metrics are measured at its capacity, and the simulator's at the capacity it predicts: two
load levels. The fit compares each measured level with the simulator at that level's rate
instead (:func:`orchestrator.search.fidelity.search.fit_levels`); ``--per-trial`` is the old fit,
kept here as the baseline.

For k = 1..K the calibration is fitted to the first k completed trials of
``results/examples/llama3-8b-h200`` (in trial order, as a search would have measured them),
once per way, and the calibrated simulator then predicts the capacity (req/s) of every other
completed trial of that study and of ``results/examples/llama3-8b-h200-fidelity`` (same
model, GPU, workload, SLOs and capacity search). Printed per k and way: the calibration,
the median and max |error| of the held-out capacities, and the fit's wall time (one process;
the simulations of the fit and of the held-out trials, nothing else). k = 0 is the
uncalibrated simulator.

    python benchmarks/fidelity_fit.py --max-k 4 --jobs 2 [--markdown FILE] [--output DIR]

``--output results/examples/fidelity-fit`` stores the dataset docs/benchmarks.md's table and figures
are generated from (:mod:`orchestrator.doc_tables.fidelity_fit`): each fit, every held-out trial's
measured and predicted capacity, and the run (``run.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import dataset  # noqa: E402
from orchestrator.doc_tables import fidelity_fit as tables  # noqa: E402

FIT_FROM = ROOT / "results/examples/llama3-8b-h200"
ALSO_HELD_OUT = (ROOT / "results/examples/llama3-8b-h200-fidelity",)


def _trials(path: Path) -> list[dict]:
    from orchestrator.results import load_trials
    from orchestrator.results.levels import load_levels

    trials = load_trials(str(path), status="completed").sort_values("trial_number")
    levels = load_levels(str(path))
    out = []
    for _, t in trials.iterrows():
        rows = levels[levels["trial_id"] == t["trial_id"]].to_dict("records")
        out.append({"dataset": str(path.relative_to(ROOT)), "trial_id": t["trial_id"],
                    "params": json.loads(t["params_json"]), "row": t.to_dict(), "levels": rows})
    return out


def one(args) -> dict:
    k, way = args
    from orchestrator.results.definition import read_study_definition
    from orchestrator.search.fidelity.search import FidelitySearch, fidelity_metrics, fit_levels, score_in_simulator

    study = read_study_definition(str(FIT_FROM))
    fitted = _trials(FIT_FROM)
    held = fitted[k:] + [t for p in ALSO_HELD_OUT for t in _trials(p)]
    search = FidelitySearch(study, note=lambda s: None)
    t0 = time.monotonic()
    for t in fitted[:k]:
        measured = {m: t["row"].get(m) for m in fidelity_metrics(study)}
        if way == tables.PER_LEVEL:
            measured["levels"] = fit_levels(study, t["levels"])
        search.observe(t["params"], "completed", measured, refit=False)
    if k:
        search.refit()
    fit_s = time.monotonic() - t0
    scores = score_in_simulator(study, [t["params"] for t in held], search.calibration())
    predictions = [{"k": k, "way": way, "dataset": t["dataset"], "trial_id": t["trial_id"],
                    "measured": float(t["row"]["capacity_rps"]), "predicted": float(m["capacity_rps"])}
                   for t, (_, m) in zip(held, scores)]
    fit = {"k": k, "way": way, **search.calibration(), "fit_s": round(fit_s, 1), "fit_rms": search.fit_rms}
    return {"fit": fit, "predictions": predictions}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--output", type=Path, help="write the dataset here (fits.parquet, predictions.parquet, run.json)")
    args = ap.parse_args(argv)
    record = dataset.RunRecord.for_script("fidelity_fit.py", sys.argv[1:] if argv is None else argv)
    jobs = [(0, tables.UNCALIBRATED)] + [(k, w) for k in range(1, args.max_k + 1)
                                         for w in (tables.PER_TRIAL, tables.PER_LEVEL)]
    t0 = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, jobs))
    fits = pd.DataFrame([r["fit"] for r in results])
    predictions = pd.DataFrame([p for r in results for p in r["predictions"]])
    text = tables.table(fits, predictions)
    print(text)
    print(f"({time.monotonic() - t0:.0f} s in all, {args.jobs} processes)")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.output:
        run = record.finish(**{"max_k": args.max_k, "jobs": args.jobs, "fit_from": str(FIT_FROM.relative_to(ROOT)),
               "also_held_out": [str(p.relative_to(ROOT)) for p in ALSO_HELD_OUT],
               "seconds": round(time.monotonic() - t0, 1)})
        print(f"wrote {dataset.write(args.output, {tables.FITS_FILE: fits, tables.PREDICTIONS_FILE: predictions}, run)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
