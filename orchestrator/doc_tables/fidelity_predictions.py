"""A ``search.fidelity: sim`` study's predictions against its real trials, for docs/simulator.md: each
trial's configuration, each predicted metric with its stated error and what was measured, and the
share of trials within (:mod:`orchestrator.results.predictions`, what ``orchestrator show`` prints)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.failures import TrialStatus
from orchestrator.results.predictions import (describe_by_metric, describe_range, prediction_checks,
                                              prediction_share)
from orchestrator.results.query import load_trials

_SHOWN = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "kv_cache_dtype", "enforce_eager")


def predictions_table(folder: Path) -> str:
    """One row per completed trial and predicted metric, in the order the trials ran, then the share."""
    trials = load_trials(folder).sort_values("started_at", ignore_index=True)
    done = trials[trials["status"] == TrialStatus.COMPLETED]
    lines = ["| trial | configuration | metric | predicted (stated error) | measured | error | within |",
             "| ---: | --- | --- | --- | ---: | ---: | --- |"]
    for k, row in enumerate(done.to_dict("records"), start=1):
        params = json.loads(row["params_json"])
        config = ", ".join(f"{n} {params[n]}" for n in _SHOWN if n in params)
        for c in prediction_checks(row):
            lines.append(f"| {k} | {config} | {c.metric} | {c.predicted:.3g} ({describe_range(c.low, c.high)}) | "
                         f"{c.measured:.3g} | {c.error:+.0%} | {'yes' if c.within else 'no'} |")
    share = prediction_share(trials)
    if share is not None:
        lines.append(f"| all | | | | | | {share.within} of {share.trials} trials ({describe_by_metric(share)}) |")
    return "\n".join(lines)
