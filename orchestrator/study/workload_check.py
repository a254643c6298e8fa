"""The study's workload checked against the study: readable files, a sane time line, lengths that fit.

A trace or dataset that validates line by line can still break every trial: a request
longer than any configuration's context fails; a day between two requests is a broken
timestamp. :func:`workload_file_problems` says so at ``validate``, naming the line. A
synthetic workload whose shortest request is longer than any configuration's context
would fail every request (and a simulated one would decode it for nothing): the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.study.errors import Problem
from orchestrator.workload.generate import load_entries
from orchestrator.workload.spec import BurstArrival, ConstantArrival, GammaArrival, PoissonArrival
from orchestrator.workload.trace import TraceError, select_window

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.study.spec import Study

MAX_TRACE_GAP_S = 86400.0  # a day between two requests is a broken timestamp, not a workload


def workload_file_problems(study: "Study") -> list[Problem]:
    """A trace or dataset file that is missing or malformed (one problem naming its file and line), or
    synthetic lengths no configuration can serve."""
    wl = study.workload
    if wl.trace is None and wl.dataset is None:
        return synthetic_length_problems(study) + window_problems(study)
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


def shortest(spec) -> int:
    """The fewest tokens a length distribution gives a request."""
    kind = spec.kind
    if kind == "fixed":
        return spec.value
    if kind == "choice":
        return min(spec.values)
    return spec.min  # uniform, normal, lognormal: clipped there


def synthetic_length_problems(study: "Study") -> list[Problem]:
    """Lengths so long that every request is longer than any configuration's context."""
    wl = study.workload
    if wl.input_len is None or wl.output_len is None:
        return []
    try:
        context = _largest_context(study)
    except (KeyError, OSError, ValueError):  # a model the catalog does not know: the engine will say
        return []
    inp, out = shortest(wl.input_len), shortest(wl.output_len)
    if out > context:
        return [Problem("workload.output_len", f"at least {out} tokens, more than the largest max_model_len any "
                                               f"configuration has ({context}); every request would fail")]
    if inp + out > context:
        return [Problem("workload.input_len", f"input_len (at least {inp}) + output_len (at least {out}) is more "
                                              f"than the largest max_model_len any configuration has ({context}); "
                                              "every request would fail")]
    sp = wl.shared_prefix
    if sp is not None and sp.fraction > 0 and sp.length + 1 + out > context:  # a prompt is prefix + >= 1 token
        return [Problem("workload.shared_prefix.length", f"{sp.length} tokens + 1 of the request's own + output_len "
                                                         f"(at least {out}) is more than the largest max_model_len any "
                                                         f"configuration has ({context}); every request with a "
                                                         "prefix would fail")]
    return []


def window_problems(study: "Study") -> list[Problem]:
    """``warmup_s`` and ``cooldown_s`` that leave no request to measure, where the span of the due
    times is known before the run: arrivals rescaled to their rate ((n - 1) / rate), or a burst (0)."""
    wl = study.workload
    if (wl.warmup_s <= 0 and wl.cooldown_s <= 0) or study.capacity is not None:
        return []  # a capacity search scales the windows with each level's length
    if isinstance(wl.arrival, (PoissonArrival, GammaArrival, ConstantArrival)):
        span = (wl.num_requests - 1) / wl.arrival.rate
    elif isinstance(wl.arrival, BurstArrival):
        span = 0.0
    else:  # a closed loop, a ramp or a daily cycle: the span is the run's
        return []
    if wl.warmup_s + wl.cooldown_s < span:
        return []
    key = "workload.warmup_s" if wl.warmup_s > 0 else "workload.cooldown_s"
    fix = "set them to 0" if span == 0 else "lower them, or send more requests (num_requests)"
    return [Problem(key, f"warmup_s ({wl.warmup_s:g} s) + cooldown_s ({wl.cooldown_s:g} s) leave no request to "
                         f"measure: the {wl.num_requests} requests are due within {span:.3g} s of the first; {fix}")]


def _largest_context(study: "Study") -> int:
    """The longest sequence any configuration of the study accepts: ``max_model_len`` as searched or
    fixed, else the model's own maximum."""
    spec = study.space.params.get("max_model_len")
    values = [int(v) for v in spec.values()] if spec is not None else []
    fixed = (getattr(study.engine, "engine_kwargs", None) or {}).get("max_model_len")
    if fixed:
        values.append(int(fixed))
    return max(values) if values else study.model_shape.max_position_embeddings
