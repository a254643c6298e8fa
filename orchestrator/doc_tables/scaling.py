"""docs/benchmarks.md's parallel-scaling table and text, from ``results/examples/parallel-scaling``.

``benchmarks/parallel_scaling.py`` stores every trial's row (``trials.parquet``: the number of GPUs
of its run, status and phase seconds) and the run record (``run.json``: per number of GPUs the
study's wall time, the CPU seconds it used and the most GPUs leased at once per node). Speed-ups,
efficiencies and means are computed here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, paragraph, series
from orchestrator.doc_tables.h200 import markdown
from orchestrator.doc_tables.overhead import load_average

TRIALS_FILE, RUN_FILE = "trials.parquet", "run.json"
TARGET = 0.9  # speed-up >= 0.9 N
COUNTED = {"cgroup": "a cpuacct cgroup holding the benchmark and every process it starts",
           "machine": "the machine's counters (other work included)"}


@dataclass(frozen=True)
class Scale:
    """One run of the study on ``gpus`` GPUs, summarised from its rows and record."""

    gpus: int
    trials: int
    completed: int
    wall_s: float
    speedup: float
    trial_s: float
    startup_s: float
    load_s: float
    cpu_per_trial: float
    busy: float  # the share of the machine's cores the run kept busy
    peaks: tuple[tuple[int, int], ...]

    @property
    def efficiency(self) -> float:
        return self.speedup / self.gpus


def load(folder: str | Path) -> tuple[pd.DataFrame, dict]:
    folder = Path(folder)
    return pd.read_parquet(folder / TRIALS_FILE), json.loads((folder / RUN_FILE).read_text())


def scales(frame: pd.DataFrame, run: dict) -> list[Scale]:
    base = next(r for r in run["runs"] if r["gpus"] == 1)
    out = []
    for r in run["runs"]:
        rows = frame[frame["gpus"] == r["gpus"]]
        ok = rows[rows["status"] == "completed"]
        out.append(Scale(r["gpus"], len(rows), len(ok), r["wall_s"], base["wall_s"] / r["wall_s"],
                         float(rows["wall_time_s"].mean()), float(ok["startup_s"].mean()),
                         float(ok["load_window_s"].mean()), r["cpu_s"] / max(1, len(rows)),
                         r["cpu_s"] / (r["wall_s"] * run["cpu_count"]), tuple(tuple(p) for p in r["peaks"])))
    return out


def scaling_setup(folder: str | Path) -> str:
    frame, run = load(folder)
    return paragraph(f"{load_average(run)}; CPU counted by {COUNTED[run['cpu_counted']]}. One run per number of "
                     "GPUs (not repeated: a run takes minutes; the trials of a run are its repeats, and their "
                     "start-up and load window are the means shown):")


def scaling_table(folder: str | Path) -> str:
    frame, run = load(folder)
    rows = [[str(s.gpus), f"{s.completed}/{s.trials}", f"{s.wall_s:.0f}", f"{s.speedup:.2f}", f"{TARGET * s.gpus:.1f}",
             f"{s.efficiency:.0%}", f"{s.trial_s:.0f} ({s.startup_s:.0f} + {s.load_s:.0f})", f"{s.cpu_per_trial:.1f}",
             f"{s.busy:.0%}", ", ".join(f"{u}/{t}" for u, t in s.peaks)] for s in scales(frame, run)]
    return markdown(["GPUs", "trials", "wall s", "speed-up", "target 0.9 N", "efficiency", "trial s (start + load)",
                     "CPU s / trial", "cores busy (the run's own)", "most GPUs leased per node"], "rrrrrrrrrl", rows)


def _verdict(ss: list[Scale]) -> str:
    met = [s for s in ss if s.gpus > 1 and s.efficiency >= TARGET]
    missed = [s for s in ss if s.gpus > 1 and s.efficiency < TARGET]
    said = [f"at {s.gpus} it is {s.speedup:.2f} ({s.efficiency:.0%})" for s in ss if s.gpus > 1]
    head = f"Speed-up against 1 GPU: {series(said)} (target {TARGET:.0%} of N)."
    if not missed:
        return head + " **The target is met at every N measured.**"
    first = min(s.gpus for s in missed)
    ok = max((s.gpus for s in met if s.gpus < first), default=1)
    return head + (f" **The target is missed beyond {ok} on this machine**, and the columns say why." if ok > 1
                   else " **The target is missed from 2 GPUs on this machine**, and the columns say why.")


def scaling_findings(folder: str | Path) -> str:
    frame, run = load(folder)
    ss = scales(frame, run)
    cpu = [s.cpu_per_trial for s in ss]
    big = max(ss, key=lambda s: s.gpus)
    loads = [s.load_s for s in ss]
    steady = max(loads) - min(loads) <= 2.0
    span = f"{min(loads):.0f}" if f"{min(loads):.0f}" == f"{max(loads):.0f}" else f"{min(loads):.0f}–{max(loads):.0f}"
    window = (f"The load windows themselves stay at {span} s for every N: once started, trials do not slow each "
              "other." if steady else f"The load windows range {span} s: trials slowed each other once started.")
    why = (f"Each trial costs {min(cpu):.0f}–{max(cpu):.0f} CPU-seconds that are not simulated (a Serve replica "
           f"process started and imported, the load generator, the sink and ledger calls); {big.gpus} trials "
           f"starting at once need ~{big.gpus * big.cpu_per_trial:.0f} CPU-seconds from {run['cpu_count']} cores, "
           f"so the simulated start ({run['startup_s']:.0f} s) measures {ss[0].startup_s:.0f} s at 1 GPU and "
           f"{big.startup_s:.0f} s at {big.gpus}, and the run's own processes keep {big.busy:.0%} of the cores busy. "
           f"{window} "
           "With real engines a trial's CPU work is the same few seconds against minutes of GPU time, and a cluster "
           "has cores per GPU, so this bound is the test machine's.")
    fits = all(u <= t for s in ss for u, t in s.peaks)
    packing = ("Packing: the last column is the most GPUs the ledger had leased at once on each node, from the rows' "
               "own timestamps and the node each replica really ran on: "
               + ("never more than the node has. " if fits else "**more than a node has** in a run. ")
               + "Mixed TP 1/2/4 trials on 2 x 4 GPUs are checked the same way in "
               "`tests/cluster/test_faults_cluster.py::test_tensor_parallel_trials_pack_without_oversubscribing` "
               "(and `--tp 1,2,4` here).")
    return bullets([f"{_verdict(ss)} {why}", packing])
