"""docs/planning.md's sentence on sizing a fleet on a capacity's validated low end, from a study whose
rows carry intervals (the product's own :func:`orchestrator.apps.plan.replicas_for`)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.apps.plan import DEFAULT_HEADROOM, replicas_for
from orchestrator.doc_tables.blocks import paragraph
from orchestrator.doc_tables.h200 import trials_of

RATE = 400.0  # the example's target, as the `orchestrator plan ... --rate 400` above


def interval_sizing(study_dir: Path) -> str:
    trials = trials_of(study_dir)
    done = trials[trials["status"] == "completed"]
    best = done.sort_values("capacity_rps", ascending=False).iloc[0]
    on_low = replicas_for(RATE, best["capacity_rps_low"], DEFAULT_HEADROOM)
    on_point = replicas_for(RATE, best["capacity_rps"], DEFAULT_HEADROOM)
    return paragraph(
        f"On `results/examples/{Path(study_dir).name}`, whose rows carry intervals, the best configuration's capacity "
        f"is {best['capacity_rps']:.1f} req/s with a validated low end of {best['capacity_rps_low']:.1f}: at "
        f"{RATE:g} req/s sized on the low end it takes {on_low} replicas, where the point estimate would have given "
        f"{on_point}.")
