"""The study's workload files checked against the study: readable, a sane time line, lengths that fit.

A trace or dataset that validates line by line can still break every trial: a request
longer than any configuration's context fails; a day between two requests is a broken
timestamp. :func:`workload_file_problems` says so at ``validate``, naming the line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.sim.models import ModelShape
from orchestrator.study_errors import Problem
from orchestrator.workload.generate import load_entries
from orchestrator.workload.trace import TraceError, select_window

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.study import Study

MAX_TRACE_GAP_S = 86400.0  # a day between two requests is a broken timestamp, not a workload


def workload_file_problems(study: "Study") -> list[Problem]:
    """A trace or dataset file that is missing or malformed (one problem naming its file and line)."""
    wl = study.workload
    if wl.trace is None and wl.dataset is None:
        return []
    key = "workload.trace.path" if wl.trace is not None else "workload.dataset.path"
    try:
        entries = load_entries(wl, study.base_dir)
        if wl.trace is not None:
            entries, due = select_window(entries, start_s=wl.trace.start_s, end_s=wl.trace.end_s,
                                         max_requests=wl.trace.max_requests)
            gaps = due[1:] - due[:-1] if len(due) > 1 else due[:0]
            if len(gaps) and gaps.max() > MAX_TRACE_GAP_S:
                i = int(gaps.argmax())
                return [Problem(key, f"line {entries[i + 1].line}: {gaps[i]:.3g} s after the request before it, "
                                     f"more than {MAX_TRACE_GAP_S:g} s; fix the timestamps (or time_unit), or "
                                     "replay a part with trace.start_s / trace.end_s")]
    except TraceError as e:
        return [Problem(key, str(e))]
    context = _largest_context(study)
    for e in entries:
        if e.input_len is not None and e.input_len + e.output_len > context:
            return [Problem(key, f"line {e.line}: input_len {e.input_len} + output_len {e.output_len} is more than "
                                 f"the largest max_model_len any configuration has ({context}); every such request "
                                 "would fail")]
        if e.output_len > context:
            return [Problem(key, f"line {e.line}: output_len {e.output_len} is more than the largest max_model_len "
                                 f"any configuration has ({context})")]
    return []


def _largest_context(study: "Study") -> int:
    """The longest sequence any configuration of the study accepts: ``max_model_len`` as searched or
    fixed, else the model's own maximum."""
    spec = study.space.params.get("max_model_len")
    values = [int(v) for v in spec.values()] if spec is not None else []
    fixed = (getattr(study.engine, "engine_kwargs", None) or {}).get("max_model_len")
    if fixed:
        values.append(int(fixed))
    return max(values) if values else ModelShape.load(study.model.name, study.base_dir).max_position_embeddings
