"""How a study's trials ended, rendered once: counts by status, and the failures by status and
kind with an example message. The progress line's last word, ``show``, ``pareto``'s empty front
and the report all render what these return."""

from __future__ import annotations

import pandas as pd

from orchestrator.failures import TrialStatus
from orchestrator.results.query import NO_STATUS

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
