"""The learned-weights tables of docs/benchmarks.md (docs/trained-models.md), each built from its dataset.

The probe columns are recomputed from the stored answers (``probe/<set>/*.json``) by the
product's own :func:`orchestrator.trial.probe.compare`, so columns added after a dataset was
recorded (``divergence_gap_max``) read the same as in a new run; the rest comes from the
trials table. Intervals are the capacity search's and the level's own ([low, high]).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.h200 import DASH, fmt, interval, markdown, missing, param, trials_of
from orchestrator.trial.probe import answers_from_json, compare


def probe_answers(study_dir: str | Path) -> tuple[list, dict[str, list]]:
    """The baseline's answers and every probed trial's, by trial id (one probe set per study)."""
    sets = sorted(p for p in (Path(study_dir) / "probe").iterdir() if p.is_dir())
    if len(sets) != 1:
        raise ValueError(f"{study_dir}: expected one probe set, found {len(sets)}")
    load = lambda f: answers_from_json(json.loads(f.read_text())["answers"])  # noqa: E731
    answers = {f.stem: load(f) for f in sets[0].glob("*.json") if f.stem != "baseline"}
    return load(sets[0] / "baseline.json"), answers


def _diverged(reference: list, answers: list) -> int:
    return sum(a.tokens != b.tokens for a, b in zip(reference, answers))


def _probe_cells(row: pd.Series, reference: list, answers: dict[str, list]) -> list[str]:
    got = answers.get(row["trial_id"])
    if got is None:
        return [DASH] * 5
    cols = compare(reference, got)
    return [fmt(cols["token_agreement"], ".3f"), f"{_diverged(reference, got)} of {len(reference)}",
            fmt(cols["divergence_gap_max"], ".3f"),
            f"{fmt(cols['logprob_diff_mean'], '.1e')} / {fmt(cols['logprob_diff_p95'], '.1e')}",
            f"{fmt(row['heldout_perplexity'], '.4f')} ({fmt(row['perplexity_delta'], '+.4f')})"]


_PROBE_HEADER = ["token_agreement", "answers diverged", "divergence_gap_max", "logprob_diff mean / p95",
                 "heldout_perplexity (delta)"]


def quantization_table(study_dir: str | Path) -> str:
    """One row per trial of the fp8 weights x fp8 KV x max_num_seqs study: capacity with its
    interval, latencies at capacity, the probe against the baseline, the guardrail's verdict."""
    trials = trials_of(study_dir)
    reference, answers = probe_answers(study_dir)
    rows = []
    for _, t in trials.iterrows():
        itself = t["trial_id"] == t["probe_baseline"]
        rows.append([param("quantization", t["quantization"]) if not missing(t["quantization"]) else "none",
                     str(t["kv_cache_dtype"]), param("max_num_seqs", t["max_num_seqs"])
                     + (" (baseline)" if itself else ""),
                     fmt(t["kv_cache_tokens"], ",.0f"), interval(t, "capacity_rps", ".3g"),
                     f"{t['ttft_p99_ms']:.0f}", f"{t['tpot_p50_ms']:.2f}", *_probe_cells(t, reference, answers),
                     "yes" if bool(t["feasible"]) else "no"])
    return markdown(["quantization", "kv_cache_dtype", "max_num_seqs", "KV cache tokens", "capacity req/s [interval]",
                     "TTFT p99 ms", "TPOT p50 ms", *_PROBE_HEADER, "feasible"], "lllrrrrrrrrrl", rows)


def _speculation(row: pd.Series) -> str:
    """``off``, ``n-gram, 3 tokens`` or ``draft model (<its folder's name>), 3 tokens``."""
    k = row["num_speculative_tokens"]
    if missing(k) or not k:
        return "off"
    draft = row.get("speculative_model")
    how = "n-gram" if missing(draft) or not draft else f"draft model ({Path(str(draft)).name})"
    return f"{how}, {int(k)} tokens"


def speculation_table(study_dir: str | Path) -> str:
    """One row per trial of the speculation study: capacity, TPOT and TTFT with their
    intervals, the engine's acceptance counters (``output share``: ``engine_spec_token_share``,
    a dash in datasets recorded before it), the probe against speculation off."""
    trials = trials_of(study_dir)
    reference, answers = probe_answers(study_dir)
    rows = []
    for _, t in trials.iterrows():
        rows.append([_speculation(t),
                     interval(t, "capacity_rps", ".3g"), interval(t, "tpot_p50_ms", ".2f"),
                     interval(t, "ttft_p99_ms", ".0f"), fmt(t["engine_spec_acceptance_rate"], ".3f"),
                     fmt(t["engine_spec_accepted_per_draft"], ".2f"), fmt(t.get("engine_spec_token_share"), ".2f"),
                     *_probe_cells(t, reference, answers)])
    return markdown(["speculation", "capacity req/s [interval]", "TPOT p50 ms [interval]",
                     "TTFT p99 ms [interval]", "acceptance rate", "accepted per draft", "output share", *_PROBE_HEADER],
                    "lrrrrrrrrrrr", rows)
