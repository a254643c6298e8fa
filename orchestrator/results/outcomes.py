"""How a study's trials ended, rendered once: counts by status, and the failures by status and
kind with an example message. The progress line's last word, ``show``, ``pareto``'s empty front
and the report all render what these return; ``pareto``'s empty front and ``recommend`` with
nothing to recommend say why no trial qualifies with :func:`why_no_trial_qualifies`."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from orchestrator.failures import TrialStatus
from orchestrator.measure import limits
from orchestrator.results.query import NO_STATUS
from orchestrator.study.goals import Constraint

EXAMPLE_CHARS = 240  # of a failure's message, in the table and in a line


def status_counts(trials: pd.DataFrame) -> str:
    """``"3 completed, 1 failed"``; a row without a status (a damaged file) is counted as such."""
    counts = trials["status"].fillna(NO_STATUS).value_counts().to_dict() if len(trials) else {}
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def failure_breakdown(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that did not complete cleanly (a completed trial's failure kind is a warning, such as a
    teardown leak), by status and failure kind, with a count and an example message, most first."""
    columns = ["status", "failure_kind", "trials", "example"]
    if trials.empty:
        return pd.DataFrame(columns=columns)
    kinds = trials["failure_kind"] if "failure_kind" in trials else pd.Series(None, index=trials.index, dtype=object)
    bad = trials[(trials["status"] != TrialStatus.COMPLETED) | kinds.notna()]
    if bad.empty:
        return pd.DataFrame(columns=columns)
    messages = bad["failure_message"] if "failure_message" in bad else pd.Series(None, index=bad.index, dtype=object)
    rows = []
    for (status, kind), group in bad.groupby([bad["status"].fillna(NO_STATUS), kinds[bad.index].fillna("-")],
                                             sort=True):
        message = next((m for m in messages[group.index] if isinstance(m, str) and m.strip()), "")
        rows.append({"status": status, "failure_kind": kind, "trials": len(group),
                     "example": message.strip().splitlines()[0][:EXAMPLE_CHARS] if message else ""})
    return pd.DataFrame(rows).sort_values("trials", ascending=False, kind="stable").reset_index(drop=True)


def failure_lines(trials: pd.DataFrame) -> list[str]:
    """:func:`failure_breakdown` as lines: ``3 infeasible, kv_cache_too_small: e.g. <message>``."""
    return [f"{r.trials} {r.status}, {r.failure_kind}" + (f": e.g. {r.example}" if r.example else "")
            for r in failure_breakdown(trials).itertuples()]


def outcome_summary(trials: pd.DataFrame) -> str:
    """Counts by status, then the failures by kind (saying so when no trial completed)."""
    if trials is None or len(trials) == 0:
        return "no trials recorded"
    lines = ["trials: " + status_counts(trials)]
    if not (trials["status"] == TrialStatus.COMPLETED).any():
        lines.append("  no configuration completed:")
    lines += ["  " + line for line in failure_lines(trials)]
    return "\n".join(lines)


def why_no_trial_qualifies(trials: pd.DataFrame, constraints: Sequence[Constraint],
                           objectives: Sequence[str] = ()) -> str:
    """Why no trial is on the front, or can be recommended: none recorded; none completed (the
    failures by kind); or no completed trial meets every SLO (the best value each SLO saw, or that
    it was never measured), or has an objective measured at all. A table without a ``status``
    column counts every row as completed."""
    if trials is None or len(trials) == 0:
        return "no trials recorded"
    completed = trials[trials["status"] == TrialStatus.COMPLETED] if "status" in trials else trials
    if completed.empty:
        return "\n".join(["no trial completed; nothing was measured:"] + ["  " + line for line in failure_lines(trials)])
    unmeasured = [m for m in objectives if _measured(completed, m).empty]
    head = ("no completed trial meets " + ", ".join(str(c) for c in constraints) if constraints
            else "no completed trial has its objectives measured")
    lines = [head + ":"] + [f"  {m}: never measured" for m in unmeasured]
    for c in constraints:
        values = _measured(completed, c.metric)
        if values.empty:
            lines.append(f"  {c}: never measured")
        else:
            best = values.min() if limits.upper(c.op) else values.max()
            lines.append(f"  {c}: best seen {best:,.4g}")
    return "\n".join(lines)


def _measured(trials: pd.DataFrame, metric: str) -> pd.Series:
    """The metric's values where a trial measured it (a damaged or missing column: none)."""
    if metric not in trials:
        return pd.Series(dtype=float)
    return pd.to_numeric(trials[metric], errors="coerce").dropna()
