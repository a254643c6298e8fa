"""Multi-turn session metrics: pure functions from request records (their ``session`` and ``turn``).

* ``sessions``: sessions measured: those whose first turn is due inside the measurement window
  (:func:`orchestrator.measure.metrics.measurement_window`); all their turns count, wherever they fall.
* ``session_goodput``: sessions per second whose every turn met the per-request SLOs (the one
  rule, :meth:`orchestrator.measure.metrics.RequestSLO.met_by`; without SLOs: every turn succeeded),
  over the load window's ``duration_s``; ``session_slo_attainment``: their share.
* ``turns_per_session_mean``: turns sent per measured session.
* ``expected_prefix_hit_rate``: the share of prompt tokens the workload expects the prefix cache
  to hold (:func:`orchestrator.workload.sessions.expected_prefix_hit_rate`: each turn's previous
  prompt), to read beside the engine-measured ``prefix_cache_hit_rate``.
* ``ttft_p{50,99}_ms_first_turn`` / ``..._later_turns``: TTFT of successful first turns, and of
  every later turn (whose prompt carries history).

:func:`turn_table` is the per-turn breakdown (one dict per turn index): the trials row carries
it in ``extra_json["turns"]``; the requests table's ``session`` and ``turn`` columns give any
other cut.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

from orchestrator.measure.metrics import SESSION_METRIC_NAMES, RequestSLO, in_window
from orchestrator.measure.records import RequestRecord

__all__ = ["session_columns", "turn_table", "session_records"]


def _key(r: RequestRecord) -> tuple[int, int, int]:
    return r.level, r.window, r.session


def session_records(records: Sequence[RequestRecord], window: Optional[Mapping] = None
                    ) -> dict[tuple[int, int, int], list[RequestRecord]]:
    """The measured sessions' turns, by (level, window, session), in turn order."""
    turns = [r for r in records if not r.warmup and r.session is not None]
    first = {_key(r) for r in in_window(turns, window) if r.turn == 1}
    out: dict[tuple[int, int, int], list[RequestRecord]] = {}
    for r in turns:
        if _key(r) in first:
            out.setdefault(_key(r), []).append(r)
    for rs in out.values():
        rs.sort(key=lambda r: r.turn)
    return out


def _pct(values: list[float], p: float) -> Optional[float]:
    return float(np.percentile(np.asarray(values) * 1000.0, p)) if values else None


def session_columns(records: Sequence[RequestRecord], *, slo: RequestSLO, duration_s: float,
                    window: Optional[Mapping] = None) -> dict[str, Any]:
    """The ``SESSION_METRIC_NAMES`` columns (all None when no record belongs to a session)."""
    sessions = session_records(records, window)
    if not sessions:
        return dict.fromkeys(SESSION_METRIC_NAMES)
    good = sum(1 for turns in sessions.values() if all(slo.met_by(r) if not slo.empty else r.success for r in turns))
    turns = [r for rs in sessions.values() for r in rs]
    prompt = sum(r.expected_prompt_tokens for r in turns)
    first = [r.ttft_s for r in turns if r.turn == 1 and r.success]
    later = [r.ttft_s for r in turns if r.turn > 1 and r.success]
    return {
        "sessions": float(len(sessions)),
        "session_goodput": good / duration_s if duration_s > 0 else 0.0,
        "session_slo_attainment": good / len(sessions),
        "turns_per_session_mean": len(turns) / len(sessions),
        "expected_prefix_hit_rate": sum(r.expected_cached_tokens for r in turns) / prompt if prompt else None,
        "ttft_p50_ms_first_turn": _pct(first, 50),
        "ttft_p99_ms_first_turn": _pct(first, 99),
        "ttft_p50_ms_later_turns": _pct(later, 50),
        "ttft_p99_ms_later_turns": _pct(later, 99),
    }


def turn_table(records: Sequence[RequestRecord], *, slo: RequestSLO,
               window: Optional[Mapping] = None) -> list[dict[str, Any]]:
    """One row per turn index of the measured sessions: requests, completed, TTFT p50/p99, E2E p50,
    mean prompt tokens (the workload's), the expected prefix-cache share and the SLO attainment."""
    by_turn: dict[int, list[RequestRecord]] = {}
    for rs in session_records(records, window).values():
        for r in rs:
            by_turn.setdefault(r.turn, []).append(r)
    rows = []
    for turn in sorted(by_turn):
        rs = by_turn[turn]
        ok = [r for r in rs if r.success]
        prompt = sum(r.expected_prompt_tokens for r in rs)
        rows.append({
            "turn": turn, "requests": len(rs), "completed": len(ok),
            "ttft_p50_ms": _pct([r.ttft_s for r in ok], 50), "ttft_p99_ms": _pct([r.ttft_s for r in ok], 99),
            "e2el_p50_ms": _pct([r.latency_s for r in ok], 50),
            "prompt_tokens_mean": prompt / len(rs),
            "expected_prefix_hit_rate": sum(r.expected_cached_tokens for r in rs) / prompt if prompt else None,
            "slo_attainment": sum(1 for r in rs if (slo.met_by(r) if not slo.empty else r.success)) / len(rs),
        })
    return rows
