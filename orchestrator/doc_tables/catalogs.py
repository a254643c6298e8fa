"""Docs tables whose source is the code's own catalog or the files the repository ships, not a study:
the GPU-hour list prices (docs/metrics.md), the shipped traces (docs/workloads.md) and the fleet
sizing example (docs/planning.md). Each is computed by the functions the product uses on the same
source, so a price, a trace or the sizing rule that changes changes its table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from orchestrator.apps.plan import DEFAULT_HEADROOM, Candidate, FleetPlan, plan_fleet
from orchestrator.doc_tables.blocks import paragraph
from orchestrator.doc_tables.h200 import markdown
from orchestrator.hardware.pricing import DEFAULT_PRICE_PER_GPU_HOUR
from orchestrator.workload.samples import SAMPLE_TRACES
from orchestrator.workload.trace import TraceEntry, read_trace, select_window


# ---------------------------------------------------------------- prices (docs/metrics.md)
def price_table(_source: Path) -> str:
    """:data:`DEFAULT_PRICE_PER_GPU_HOUR` (``_source``: the module that holds it), in its order."""
    prices = DEFAULT_PRICE_PER_GPU_HOUR
    return "\n".join([f"| GPU | {' | '.join(prices)} |", "| --- |" + " --- |" * len(prices),
                      f"| $/GPU-hour | {' | '.join(f'{p:.2f}' for p in prices.values())} |"])


# ---------------------------------------------------------------- traces (docs/workloads.md)
# What the shared prefix of a shipped trace stands for (samples.py says so); "prefix" otherwise.
PREFIX_NOUNS = {"chat": ("system prompt", "system prompts"), "rag": ("context", "contexts")}


@dataclass(frozen=True)
class Burst:
    """Requests that fill one context exactly (prompt + output = ``total``), arriving in clusters."""

    total: int
    every_s: float  # median time between the clusters' first requests
    size: tuple[int, ...]  # requests per cluster
    within_s: float  # the widest cluster, first to last request


@dataclass(frozen=True)
class TraceSummary:
    name: str
    requests: int
    span_s: float
    rate: float  # requests per second over the span: (requests - 1) / span
    gap_cv: float  # coefficient of variation of the gaps between due times
    inputs: np.ndarray
    outputs: np.ndarray
    prefixed: float  # share of the lines behind a shared prefix
    groups: int
    prefix_len: Optional[int]
    burst: Optional[Burst]


def _burst(entries: Sequence[TraceEntry], due: np.ndarray) -> Optional[Burst]:
    """Lines whose prompt + output is the trace's largest total, when they are at least a tenth of it,
    clustered where more than a second separates two of them."""
    totals = np.array([e.input_len + e.output_len for e in entries])
    full = np.flatnonzero(totals == totals.max())
    if len(full) < max(2, len(entries) / 10):
        return None
    times = due[full]
    breaks = np.flatnonzero(np.diff(times) > 1.0) + 1
    clusters = np.split(times, breaks)
    starts = [c[0] for c in clusters]
    every = float(np.median(np.diff(starts))) if len(starts) > 1 else math.nan
    return Burst(int(totals.max()), every, tuple(len(c) for c in clusters), max(float(c[-1] - c[0]) for c in clusters))


def summarize_trace(path: Path) -> TraceSummary:
    """A shipped trace as the product replays it whole (:func:`read_trace`, :func:`select_window`)."""
    entries, due = select_window(read_trace(path))
    gaps = np.diff(due)
    groups = {e.prefix_group for e in entries if e.prefix_group is not None}
    plens = {e.prefix_len for e in entries if e.prefix_group is not None}
    return TraceSummary(path.stem, len(entries), float(due[-1]), (len(entries) - 1) / float(due[-1]),
                        float(np.std(gaps) / np.mean(gaps)),
                        np.array([e.input_len for e in entries]), np.array([e.output_len for e in entries]),
                        sum(e.prefix_group is not None for e in entries) / len(entries), len(groups),
                        plens.pop() if len(plens) == 1 else None, _burst(entries, due))


def _lengths(x: np.ndarray) -> str:
    """``247.5 (87-1531)``: the median length, and the range."""
    return f"{np.median(x):g} ({x.min()}-{x.max()})"


def _prefix_text(t: TraceSummary) -> str:
    one, many = PREFIX_NOUNS.get(t.name, ("prefix", "prefixes"))
    size = f"{t.prefix_len:,}-token" if t.prefix_len is not None else "shared"
    if t.groups == 1:
        return f"{t.prefixed:.0%} behind one {size} {one}"
    share = "each" if t.prefixed == 1 else f"{t.prefixed:.0%}"
    return f"{share} behind one of {t.groups} shared {size} {many}"


def _burst_text(b: Burst) -> str:
    size = f"{b.size[0]}" if len(set(b.size)) == 1 else f"{min(b.size)}-{max(b.size)}"
    return (f"every {b.every_s:.0f} s, {size} requests within {math.ceil(b.within_s * 10) / 10:g} s whose prompt + "
            f"output is exactly {b.total:,}")


def _order(path: Path) -> tuple[int, str]:
    names = list(SAMPLE_TRACES)
    return (names.index(path.stem) if path.stem in names else len(names), path.stem)


def traces_table(folder: Path) -> str:
    """Every ``*.jsonl`` of ``folder`` (the shipped traces, in :data:`SAMPLE_TRACES`' order)."""
    rows = []
    for path in sorted(Path(folder).glob("*.jsonl"), key=_order):
        t = summarize_trace(path)
        inputs = _lengths(t.inputs)
        if t.groups:
            inputs += f", {_prefix_text(t)}"
        if t.burst is not None:
            inputs += f": {_burst_text(t.burst)}"
        rows.append([f"`{t.name}`", str(t.requests), f"{t.span_s:.0f}", f"{t.rate:.2f}", f"{t.gap_cv:.1f}", inputs,
                     _lengths(t.outputs)])
    return markdown(["name", "requests", "span s", "req/s", "gap CV", "input tokens, median (range)",
                     "output tokens, median (range)"], "lrrrrll", rows)


# ---------------------------------------------------------------- fleet sizing (docs/planning.md)
# The worked example: two configurations' validated capacities per replica, and the target loads.
EXAMPLE = (("TP 1", 48.0, 1), ("TP 2", 110.0, 2))  # (name, capacity_rps_low, GPUs per replica)
EXAMPLE_RATES = (100.0, 400.0, 500.0)


def _candidates() -> list[Candidate]:
    return [Candidate(trial_id=name, gpus_per_replica=gpus, tensor_parallel_size=gpus, capacity_rps=cap,
                      capacity_rps_low=cap) for name, cap, gpus in EXAMPLE]


def fleet_example_setup(_source: Path) -> str:
    (n1, c1, g1), (n2, c2, g2) = EXAMPLE
    return paragraph(
        "Configurations are ranked by the fleet's cost per hour (GPUs when no price is known), then fewer GPUs, then "
        "the larger validated capacity of the whole fleet. The best configuration per GPU is not always the cheapest "
        f"fleet, because replicas round up. With capacities of {c1:g} req/s for a {n1} replica and {c2:g} req/s for a "
        f"{n2} one ({c2 / g2:g} per GPU), at {DEFAULT_HEADROOM:.0%} headroom:")


def _sizing(p: FleetPlan) -> str:
    need = p.rate * (1 + p.headroom)
    return (f"ceil({need:g} / {p.candidate.sizing_rps:g}) = {p.replicas} replica{'s' if p.replicas > 1 else ''}, "
            f"{p.gpus} GPU{'s' if p.gpus > 1 else ''}")


def _cheaper(plans: Sequence[FleetPlan]) -> str:
    first, second = plans[0], plans[1]
    if first.gpus != second.gpus:
        return first.candidate.trial_id
    spare = [f"{p.replicas * p.candidate.sizing_rps:g}" for p in (first, second)]
    return f"same cost; {first.candidate.trial_id} has more spare ({spare[0]} vs {spare[1]} req/s)"


def fleet_example_table(_source: Path) -> str:
    """:func:`orchestrator.apps.plan.plan_fleet` on :data:`EXAMPLE` at each of :data:`EXAMPLE_RATES`."""
    rows = []
    for rate in EXAMPLE_RATES:
        plans = plan_fleet(_candidates(), rate, headroom=DEFAULT_HEADROOM).plans
        by = {p.candidate.trial_id: p for p in plans}
        rows.append([f"{rate:g} req/s", *(_sizing(by[name]) for name, _, _ in EXAMPLE), _cheaper(plans)])
    return markdown(["target", *(f"{name} ({cap:g} req/s)" for name, cap, _ in EXAMPLE), "cheaper"], "llll", rows)
