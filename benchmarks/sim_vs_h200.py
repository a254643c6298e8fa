"""The simulator against warm, engine-side H200 measurements (docs/simulator.md, "Against the H200
capacity study").

Three sources of real numbers, all measured through vLLM's own server after a warm-up, on
prompts the engine had not seen:

* ``ingress``: ``benchmarks/ingress_overhead.py`` JSON files (``vllm bench serve`` loads of
  512-in / 128-out random prompts, Poisson, against bare ``vllm serve`` and the ``engine``
  ingress). Each load is replayed in virtual time with the same request count, lengths,
  rate and arrival process (vLLM's: exponential gaps rescaled so the last arrival is at
  n / rate; ``inf``: all at once).
* ``study``: a capacity study's dataset (``orchestrator run search_spaces/llama3-8b-h200.yaml``,
  or the bare ``vllm serve`` reference): every load level of every completed trial is
  replayed in virtual time with the product's own request path (the study's workload at the
  level's rate, the level's own prompts, the trial's engine arguments).

Not every measured level can be compared with a simulation run to completion. Each point
gets one of these marks (the real run's own columns decide, never the simulator):

* ``aborted``: the capacity search stopped the level early once its SLO verdict was
  certain (``stopped_early``): the requests in flight were aborted (hundreds of
  ``failed_aborted``), so its served req/s and latencies describe a cut window. Listed,
  left out of every error statistic.
* ``overloaded``: the level ran to the end above what the configuration serves: the
  saturation detector fired (``saturated``), or its TTFT p50 is more than
  ``QUEUED_TTFT_RATIO`` times the same configuration's lowest TTFT p50 (the median request
  spent most of its TTFT waiting for a slot or a token budget, not being prefilled). Its
  TTFT p50 then measures how fast the backlog grew, which a few percent of capacity moves
  by tens of percent: listed, not scored; req/s and TPOT p50 are scored.
* ``harness-bound``: the product flagged the level ``harness_bound`` (its client-side TTFT
  p50 or throughput differs from the engine's own by more than 10%): the client's TTFT
  p50 is not the engine's, so it is listed, not scored; req/s and TPOT p50 are scored.
* no mark: every metric is scored.

Prints one table row per point (real / simulated and the relative error for request
throughput, TTFT p50 and TPOT p50) and, per metric, the max and median absolute error
over the scored points. Nothing is timed; the simulation is deterministic.

    python benchmarks/sim_vs_h200.py ingress results/examples/h200-ingress
    python benchmarks/sim_vs_h200.py study results/examples/llama3-8b-h200
    python benchmarks/sim_vs_h200.py all      # the three H200 datasets of docs/simulator.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.apps.measured_replay import TABLE_HEADER as HEADER  # noqa: E402,F401
from orchestrator.apps.measured_replay import Point, load_points, run, summary_lines
from orchestrator.apps.measured_replay import table_row as row

DATASETS = (("ingress", "results/examples/h200-ingress"),
            ("study", "results/examples/llama3-8b-h200-reference"),
            ("study", "results/examples/llama3-8b-h200"))


# ---------------------------------------------------------------- reporting
def report(points: list[Point]) -> None:
    dataset = None
    for p in points:
        if p.dataset != dataset:
            dataset = p.dataset
            print(f"\n{dataset}\n\n{HEADER}")
        print(row(p))
    marked = [p for p in points if p.mark]
    if marked:
        print("\nMarked points (italic cells are not scored):")
        for p in marked:
            print(f"  {p.dataset}: {p.label}: {p.mark} ({p.why})")
    print("\nScored points: " + "; ".join(summary_lines(points)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", choices=("ingress", "study", "all"))
    p.add_argument("path", nargs="?")
    a = p.parse_args()
    if a.source == "all":
        datasets = DATASETS
    elif a.path is None:
        p.error(f"{a.source} needs a results folder")
    else:
        datasets = ((a.source, a.path),)
    report(run(load_points(datasets)))


if __name__ == "__main__":
    main()
