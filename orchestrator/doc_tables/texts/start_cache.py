"""docs/benchmarks.md's prose beside the H100 start-cache tables: what the study's compile cache
saved, what a start still costs, and whether any measured number moved (``results/examples/
start-cache-h100``), and what a capacity study over the compile key pays (``fidelity-h100``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, span
from orchestrator.doc_tables.start_phases import arm_trials, measured_pairs, server_up_rows
from orchestrator.results.predictions import prediction_share
from orchestrator.results.query import load_trials


def start_cache_findings(folder: Path, study: Path) -> str:
    shared, cold = arm_trials(Path(folder) / "shared"), arm_trials(Path(folder) / "cold")
    starts = [r for arm in (shared, cold) for r in arm.to_dict("records")]
    cached = [r for r in starts if r["start_compile_cached"] is True]
    compiled = [r for r in starts if r["start_compile_cached"] is False]
    quick_profile = [r for r in cached if r["start_profile_s"] < 5]
    first, later = float(shared["startup_s"].iloc[0]), shared["startup_s"].iloc[1:]
    med = float(statistics.median(later))
    ratio = med / first
    goal = "within" if ratio <= 0.45 else ("just over" if ratio <= 0.5 else "over")
    pairs = measured_pairs(Path(folder))
    outside = sum(not p.inside for p in pairs)
    moved = ("No measured number moved: every estimate lies inside the other arm's interval."
             if not outside else f"{outside} of {len(pairs)} estimates lie outside the other arm's interval.")
    real = load_trials(Path(study))
    real_compiled = real[real["start_compile_cached"] == False]  # noqa: E712 - a column of booleans
    return bullets([
        f"From the cache, a start took {span((r['startup_s'] for r in cached))} s against "
        f"{span((r['startup_s'] for r in compiled))} s compiling: torch.compile fell from "
        f"{span((r['start_compile_s'] for r in compiled))} s to {span((r['start_compile_s'] for r in cached), '.1f')} s, "
        f"and the step vLLM does not name after graph capture (the profile column) from "
        f"{span((r['start_profile_s'] for r in compiled))} s to about {statistics.median(r['start_profile_s'] for r in quick_profile):.0f} s "
        f"on {len(quick_profile)} of the {len(cached)} starts from the cache. The later starts' median is {med:.1f} s, "
        f"{ratio:.1%} of the first start's {first:.1f} s: {'under' if med <= 50 else 'over'} 50 s, and {goal} the 45% "
        f"aimed at. What is left is the process and its imports ({span((r['start_import_s'] for r in cached))} s from "
        f"the Serve replica's start to vLLM's first line), which no cache shortens.",
        moved,
        f"The device-seconds here cover a short replay. A capacity trial adds its search, and a search over "
        f"`max_num_seqs` or `max_num_batched_tokens` changes the compile key with each new value: the H100 fidelity "
        f"study of [simulator.md](simulator.md#a-study-the-simulator-had-not-seen) compiled in "
        f"{len(real_compiled)} of its {len(real)} trials (`startup_s` {span(real['startup_s'])} s, trial walls "
        f"{span(real['wall_time_s'])} s). The cache pays where a study revisits a key (prefix caching, memory, "
        f"`stream_interval`, and any configuration tried twice).",
    ], mark="*")


def fidelity_h100_findings(study: Path) -> str:
    trials = load_trials(Path(study))
    levels = pd.read_parquet(Path(study) / "levels")
    limit = next(c["value"] for c in json.loads((Path(study) / "study.json").read_text())["study"]["constraints"]
                 if c["metric"] == "itl_p99_ms")
    share = prediction_share(trials)
    cap_sd = float(trials["predicted_capacity_rps_high"].iloc[0] / trials["predicted_capacity_rps"].iloc[0])
    itl = span(levels["itl_p99_ms"])
    low0 = int((trials["capacity_rps_low"] == 0).sum())
    return bullets([
        f"{share.within} of {share.trials} trials within their stated error: too few to say \"at least 80% of "
        "trials\". The device call that ran the study ended during the next trial, and the session's GPU time "
        "with it.",
        f"The stated errors are wide (capacity within a factor of {cap_sd:.2f} either way) because the H100's "
        "out-of-sample error is: a prediction within them says the simulator is as good as its table, not that it "
        "is good.",
        f"ITL p99 sat at {itl} ms at every level measured, against the {limit:.0f} ms limit: the capacities are "
        f"ill-conditioned, and {low0} of {len(trials)} intervals reach down to 0.",
    ], mark="*")


def start_wall_findings(folder: Path) -> str:
    """What the bare starts' table says: the first start of each configuration against those that found
    vLLM's compile cache, and how much of a cached start is Python processes starting."""
    rows = [r for r in server_up_rows(Path(folder)) if r["up_s"] is not None]
    compiled = [r for r in rows if r["phases"].compile_cached is False]
    cached = [r for r in rows if r["phases"].compile_cached]
    med = {k: statistics.median(r[k] for r in cached) for k in ("up_s", "before_log_s", "api_to_core_s")}
    python = med["before_log_s"] + med["api_to_core_s"]
    return bullets([
        f"A configuration's first start on the machine compiled ({span([r['up_s'] for r in compiled])} s to "
        f"`/health`); those that found vLLM's compile cache took {span([r['up_s'] for r in cached])} s (median "
        f"{med['up_s']:.0f} s, {med['up_s'] / statistics.median(r['up_s'] for r in compiled):.0%} of the first).",
        f"Of a cached start's median {med['up_s']:.0f} s, {python:.0f} s ({python / med['up_s']:.0%}) pass before "
        f"the engine does any GPU work: {med['before_log_s']:.0f} s before vLLM's first log line (the API server's "
        f"Python and vLLM's imports) and {med['api_to_core_s']:.0f} s from there until the engine-core process "
        "logs (its spawn, imports and the tokenizer). The GPU phases (weights, graphs from the cache, profile) "
        "take the rest. The compile cache has already done what it can; what is left of a start is processes "
        "starting, which only a process kept warm between trials could save (not measured here).",
    ], "*")
