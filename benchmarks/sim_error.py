"""The simulator's out-of-sample error on every recorded real dataset, per GPU and metric.

Every completed real trial under ``results/examples`` (H200 and H100; the simulator's own
datasets, CPUs and speculative decoding left out) is predicted by the virtual-time simulator,
as the fidelity search scores a configuration, under three calibrations
(:mod:`orchestrator.search.fidelity.replay`): none (``shipped``), fitted on the GPU's other
datasets (``leave-one-out``), fitted on the other GPU's datasets (``other-gpu``). The rows
(one per trial, load level and metric: measured, predicted) and each fold's calibration are
written to ``results/examples/sim-error``; docs/simulator.md's tables are generated from them
(``python -m orchestrator.doc_tables.registry --write``), and the fidelity search's margins
(:mod:`orchestrator.search.fidelity.margin`) must equal what they give
(``tests/search/test_sim_error.py``). Printed: the tables.

    python benchmarks/sim_error.py --jobs 2 --iterations 1   # every fold; minutes on two cores (run.json: seconds)

A fold's simulations run over ``--jobs`` processes; a simulation asked for twice (every fit's
first steps are the same) runs once. ``--datasets`` keeps only the named datasets (a quick
look; it writes nothing unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from dataset import RunRecord, write  # noqa: E402

EXAMPLES = ROOT / "results" / "examples"
OUT = EXAMPLES / "sim-error"


def _nice() -> None:
    os.nice(5)  # the simulations yield some of the machine to whatever else runs on it


class PoolSimulate:
    """:data:`~orchestrator.search.fidelity.replay.Simulate` over a process pool, each distinct
    simulation once (every fold's fit starts with the same ones)."""

    def __init__(self, root: str, jobs: int):
        from orchestrator.search.fidelity import model as fm

        self.root, self.fields = root, fm.CAL_FIELDS
        # spawned, not forked: the folds' threads would be forked with whatever locks they hold
        self.pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_nice)
        self.done: dict[tuple, Future] = {}
        self.lock = threading.Lock()
        self.ran = self.finished = 0
        self.t0 = time.monotonic()

    def _progress(self, _future) -> None:
        with self.lock:
            self.finished += 1
            if self.finished % 250 == 0:
                print(f"  {self.finished} of {self.ran} simulations asked so far done, "
                      f"{time.monotonic() - self.t0:.0f} s", flush=True)

    def __call__(self, tasks: Sequence[tuple], calibration: Mapping[str, float]) -> list[dict]:
        from orchestrator.search.fidelity.replay import simulate_task

        cal = tuple(round(float(calibration.get(f, 1.0)), 12) for f in self.fields)
        keys = [(t, cal) for t in tasks]
        with self.lock:
            for k in keys:
                if k not in self.done:
                    self.done[k] = self.pool.submit(simulate_task, self.root, k[0], dict(calibration))
                    self.done[k].add_done_callback(self._progress)
                    self.ran += 1
        return [self.done[k].result() for k in keys]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="simulation processes")
    ap.add_argument("--iterations", type=int, default=None,
                    help="Levenberg-Marquardt iterations of each fit (default: the fidelity search's, per refit)")
    ap.add_argument("--datasets", nargs="*", help="only these datasets (writes nothing unless --out is given)")
    ap.add_argument("--out", type=Path, help=f"where to write (default: {OUT.relative_to(ROOT)} for a full run)")
    args = ap.parse_args(argv)

    import pandas as pd

    from orchestrator.doc_tables import sim_error as tables
    from orchestrator.search.fidelity import model as fm
    from orchestrator.search.fidelity import replay

    iterations = args.iterations or fm.FIT_ITERATIONS
    record = RunRecord.for_script("sim_error.py", sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    trials, skipped = replay.recorded_trials(EXAMPLES)
    if args.datasets:
        unknown = sorted(set(args.datasets) - {t.dataset for t in trials})
        if unknown:
            ap.error(f"no recorded real dataset {', '.join(unknown)}")
        trials = [t for t in trials if t.dataset in args.datasets]
    out = args.out or (None if args.datasets else OUT)
    folds = replay.folds(trials)
    print(f"{len(trials)} trials of {len({t.dataset for t in trials})} datasets, {len(folds)} folds; "
          f"left out: {'; '.join(f'{k} ({v})' for k, v in skipped.items())}", flush=True)
    simulate = PoolSimulate(str(EXAMPLES), args.jobs)

    def one(fold):
        t = time.monotonic()
        rows, record = replay.run_fold(str(EXAMPLES), fold, trials, simulate, iterations)
        record["seconds"] = round(time.monotonic() - t, 1)
        print(f"{fold.scheme} {fold.gpu} {', '.join(fold.held_out)}: {len(rows)} rows, "
              f"calibration {', '.join(f'{record[f]:.3g}' for f in fm.CAL_FIELDS)}, {record['seconds']:.0f} s",
              flush=True)
        return rows, record

    with ThreadPoolExecutor(len(folds)) as threads:
        results = list(threads.map(one, folds))
    simulate.pool.shutdown()
    errors = pd.DataFrame([r for rows, _ in results for r in rows])
    fits = pd.DataFrame([record for _, record in results])
    print(f"{simulate.ran} simulations, {time.monotonic() - t0:.0f} s, {args.jobs} processes", flush=True)
    if out is not None:
        write(out, {tables.ERRORS_FILE: errors, tables.FITS_FILE: fits},
              record.finish(iterations=iterations, simulations=simulate.ran, seconds=round(time.monotonic() - t0),
                            left_out=skipped))
        print(f"wrote {out}")
        for build in (tables.by_gpu_table, tables.by_dataset_table, tables.margins_table):
            print("\n" + build(out))
    else:
        print(errors.groupby(["scheme", "gpu", "metric"])["scored"].sum())
    return 0


if __name__ == "__main__":
    sys.exit(main())
