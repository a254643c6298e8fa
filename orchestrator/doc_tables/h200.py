"""The H200 tables of the docs, each built from its dataset under ``results/examples``.

Every function takes dataset folders and returns one markdown table (no trailing
newline); :mod:`orchestrator.doc_tables.registry` registers them by name and keeps the
docs equal to what they return. The datasets are read with the product's own readers
(:func:`~orchestrator.results.query.load_trials`, :func:`~orchestrator.results.levels.load_levels`,
the study definition, the Optuna journal read-only); the formatting (rounding, thousands
separators, bold) is all here, so a table is only ever changed by changing its data or this
code. Commentary stays in the prose around a table; a cell says only what the rows say.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import pandas as pd

from orchestrator.apps.measured_replay import TABLE_HEADER, load_points, run, table_row
from orchestrator.failures import TrialStatus
from orchestrator.results.definition import read_study_definition
from orchestrator.results.levels import load_levels
from orchestrator.results.query import load_trials

# The searched engine arguments of the H200 studies, in the docs' column order: (column, header).
PARAMS = (("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"),
          ("gpu_memory_utilization", "gpu_memory_utilization"), ("kv_cache_dtype", "kv_cache_dtype"),
          ("enforce_eager", "enforce_eager"), ("enable_chunked_prefill", "chunked prefill"))
DASH = "–"


# ---------------------------------------------------------------- formatting
def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def fmt(value: Any, spec: str = "") -> str:
    """``value`` formatted with ``spec`` (``",.0f"``: thousands separators); a dash when missing."""
    return DASH if missing(value) else format(value, spec)


def bold(text: str, on: bool = True) -> str:
    return f"**{text}**" if on and text else text


def param(name: str, value: Any) -> str:
    if missing(value):
        return DASH
    if isinstance(value, (bool,)) or name in ("enforce_eager", "enable_chunked_prefill"):
        return "true" if bool(value) else "false"
    if name == "gpu_memory_utilization":
        return f"{float(value):.2f}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def round_half_up(value: float, digits: int = 1) -> str:
    """``52.25`` -> ``52.3`` (``format`` rounds to even): for targets a reader recomputes by hand."""
    scale = 10 ** digits
    return f"{math.floor(value * scale + 0.5) / scale:.{digits}f}"


def markdown(header: Sequence[str], align: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A pipe table; ``align``: ``l`` (``---``) or ``r`` (``---:``) per column."""
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def short_id(trial_id: str) -> str:
    """``r20261203-172156-nbxc-0005`` -> ``0005``."""
    return str(trial_id).rsplit("-", 1)[-1]


# ---------------------------------------------------------------- readers
def journal_trials(study_dir: str | Path) -> dict[int, Any]:
    """The study's Optuna trials by number (``FrozenTrial``), read from ``optuna.journal`` without
    writing anything (no lock file, no repair): Optuna replays the records, nothing is appended."""
    # deferred: optuna is slow to import; only reading a journal needs it
    import optuna
    from optuna.storages.journal import BaseJournalBackend, JournalStorage

    path = Path(study_dir) / "optuna.journal"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    class ReadOnly(BaseJournalBackend):
        def read_logs(self, log_number_from: int):
            return records[log_number_from:]

        def append_logs(self, logs):
            raise PermissionError(f"{path} is read here, never written")

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(ReadOnly())
    (study,) = storage.get_all_studies()
    return {t.number: t for t in storage.get_all_trials(study._study_id)}


def trials_of(path: str | Path) -> pd.DataFrame:
    return load_trials(path).sort_values("trial_number", kind="stable").reset_index(drop=True)


def params_of(row: pd.Series) -> dict:
    return json.loads(row["params_json"]) if isinstance(row.get("params_json"), str) else {}


def initial_point(row: pd.Series, points: Sequence[dict]) -> bool:
    """The row's parameters are one of the study's ``search.initial_points``."""
    params = params_of(row)
    return any(all(params.get(k) == v for k, v in p.items()) for p in points)


def ran(row: pd.Series) -> bool:
    """A real trial: it took the GPU (pruned rows never started an engine)."""
    return row["status"] != TrialStatus.PRUNED


# ---------------------------------------------------------------- benchmarks.md
def ingress_table(folder: str | Path) -> str:
    """``benchmarks/ingress_overhead.py`` results: one row per load, ratios against ``bare``;
    the product's default ingress (``engine``) and a ratio above bare's in bold."""
    results = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("ingress_*.json"))]
    bare = next((r for r in results if r["mode"] == "bare"), None)
    base = {run["rate"]: run for run in bare["runs"]} if bare else {}
    order = {"bare": 0, "engine": 1, "serve_llm": 2}
    rows = []
    for r in sorted(results, key=lambda r: (order.get(r["mode"], 3), r["label"])):
        for run_ in r["runs"]:
            b = base.get(run_["rate"])
            ratio = f"{run_['request_throughput'] / b['request_throughput']:.2f}x" if b else "-"
            dttft = f"{run_['median_ttft_ms'] - b['median_ttft_ms']:+.0f}" if b else "-"
            rows.append([bold(r["label"], r["mode"] == "engine"), f"{r['deploy_s']:.0f}", str(run_["rate"]),
                         f"{run_['request_throughput']:.1f}", f"{run_['output_throughput']:,.0f}",
                         f"{run_['median_ttft_ms']:.0f} / {run_['p99_ttft_ms']:.0f}",
                         f"{run_['median_tpot_ms']:.1f}", bold(ratio, b is not None and float(ratio[:-1]) > 1.0),
                         dttft])
    return markdown(["ingress", "deploy s", "rate", "req/s", "out tok/s", "TTFT p50 / p99 ms", "TPOT p50 ms",
                     "req/s vs bare", "TTFT p50 - bare ms"], "lrlrrrrrr", rows)


def capacity_levels_table(study_dir: str | Path) -> str:
    """Every load level of a one-trial capacity study; the level the capacity was read from in bold."""
    trial = load_trials(study_dir).iloc[0]
    rows = []
    for _, lv in load_levels(study_dir).sort_values("level").iterrows():
        at = math.isclose(lv["rate"], trial["capacity_rps"])
        rows.append([str(lv["level"]), bold(f"{lv['rate']:.1f}", at), bold("met" if lv["slo_met"] else "missed", at),
                     f"{lv['request_throughput']:.1f}", f"{lv['ttft_p50_ms']:.0f} / {lv['ttft_p99_ms']:.0f}",
                     f"{lv['tpot_p50_ms']:.1f}", fmt(lv["engine_ttft_p50_ms"], ".0f"),
                     f"{lv['output_throughput']:,.0f} / {fmt(lv['engine_output_throughput'], ',.0f')}"])
    return markdown(["level", "rate req/s", "SLOs", "served req/s", "TTFT p50 / p99 ms", "TPOT p50 ms",
                     "engine TTFT p50 ms", "out tok/s client / engine"], "lrlrrrrr", rows)


def best_trial(trials: pd.DataFrame) -> Optional[str]:
    """The highest capacity; among equal capacities the lower TTFT p99 (the one with more headroom)."""
    done = trials[trials["status"] == TrialStatus.COMPLETED]
    if done.empty:
        return None
    return str(done.sort_values(["capacity_rps", "ttft_p99_ms"], ascending=[False, True]).iloc[0]["trial_id"])


def capacity_trials_table(study_dir: str | Path) -> str:
    """A capacity study's trials: parameters, capacity and its latencies, start-up and wall time.
    The best trial's row in bold, and every capacity equal to the best; a pruned row says so
    (its reason is the row's ``failure_message``)."""
    trials = trials_of(study_dir)
    initial = read_study_definition(str(study_dir)).search.initial_points
    best = best_trial(trials)
    top = trials.loc[trials["trial_id"] == best, "capacity_rps"].max() if best else float("nan")
    rows = []
    for _, t in trials.iterrows():
        label = short_id(t["trial_id"]) + (" (initial point)" if initial_point(t, initial) else "")
        if t["status"] == TrialStatus.COMPLETED:
            capacity = bold(f"{t['capacity_rps']:.1f}", t["trial_id"] != best and math.isclose(t["capacity_rps"], top))
        else:
            capacity = f"{t['status']} ({t['failure_kind']})" if not missing(t["failure_kind"]) else str(t["status"])
        row = [label, *(param(c, t[c]) for c, _ in PARAMS), capacity, fmt(t["ttft_p99_ms"], ".0f"),
               fmt(t["tpot_p50_ms"], ".1f"), fmt(t["startup_s"], ".0f"), fmt(t["wall_time_s"], ".0f")]
        rows.append([bold(c, t["trial_id"] == best) for c in row])
    return markdown(["trial", *(h for _, h in PARAMS), "**capacity req/s**", "TTFT p99 ms at capacity",
                     "TPOT p50 ms at capacity", "start-up s", "trial wall s"], "lrrrlllrrrrr", rows)


def fidelity_trials_table(study_dir: str | Path) -> str:
    """A ``search.fidelity: sim`` study's real trials: the pick (as the journal recorded it), the
    simulator's prediction and the measurement."""
    trials = trials_of(study_dir)
    journal = journal_trials(study_dir)
    rows = []
    for _, t in trials.iterrows():
        attrs = journal[int(t["trial_number"])].user_attrs if int(t["trial_number"]) in journal else {}
        rows.append([short_id(t["trial_id"]), str(attrs.get("fidelity_pick", DASH)),
                     *(param(c, t[c]) for c, _ in PARAMS), fmt(t["predicted_capacity_rps"], ".1f"),
                     bold(fmt(t["capacity_rps"], ".1f")), fmt(t["prediction_error_capacity_rps"], "+.0%"),
                     f"{fmt(t['ttft_p99_ms'], '.0f')} ({fmt(t['predicted_ttft_p99_ms'], '.0f')})",
                     fmt(t["wall_time_s"], ".0f")])
    return markdown(["real trial", "pick", *(h for _, h in PARAMS), "predicted capacity req/s", "**measured**",
                     "error", "TTFT p99 ms at capacity (predicted)", "trial wall s"], "llrrrlllrrrrr", rows)


def _first_reaching(real: pd.DataFrame, target: float, eligible: pd.Series) -> Optional[tuple[int, pd.Series]]:
    """(position among the real trials, counted from 1; the row) of the first eligible trial at ``target``."""
    for pos, (i, t) in enumerate(real.iterrows(), start=1):
        if eligible.loc[i] and t["status"] == TrialStatus.COMPLETED and t["capacity_rps"] >= target:
            return pos, t
    return None


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def fidelity_vs_plain_table(fidelity_dir: str | Path, plain_dir: str | Path) -> str:
    """Real trials until 95% of a best capacity: the fidelity study against the plain one, counting
    the plain study's trials from its first (an initial point) and from TPE's first own draw."""
    fid = trials_of(fidelity_dir)
    plain = trials_of(plain_dir)
    fid, plain = fid[fid.apply(ran, axis=1)], plain[plain.apply(ran, axis=1)]
    initial = read_study_definition(str(plain_dir)).search.initial_points
    own = ~plain.apply(lambda t: initial_point(t, initial), axis=1)
    plain_best = plain["capacity_rps"].max()
    both_best = max(plain_best, fid["capacity_rps"].max())
    targets = [(f"95% of the plain search's best ({plain_best:.1f} -> {round_half_up(0.95 * plain_best)} req/s)",
                0.95 * plain_best),
               (f"95% of the best of both ({both_best:.1f} -> {round_half_up(0.95 * both_best)} req/s)",
                0.95 * both_best)]
    columns = [(fid, pd.Series(True, index=fid.index)), (plain, pd.Series(True, index=plain.index)), (plain, own)]
    rows, walls = [], [[] for _ in columns]
    for label, target in targets:
        cells = [label]
        for c, (real, eligible) in enumerate(columns):
            hit = _first_reaching(real, target, eligible)
            if hit is None:
                cells.append("not reached")
                continue
            pos, t = hit
            walls[c].append(real["wall_time_s"].iloc[:pos].sum())
            if c == 2:
                cells.append(f"{_ordinal(pos)} real trial ({short_id(t['trial_id'])}, {t['capacity_rps']:.1f})")
            else:
                cells.append(f"{bold(str(pos), c == 0)} ({t['capacity_rps']:.1f})")
        rows.append(cells)
    rows.append(["GPU time of those trials (trial wall)",
                 *(" / ".join(dict.fromkeys(f"{w:.0f} s" for w in ws)) or DASH for ws in walls)])
    return markdown(["target", "fidelity sim", "plain search: with vLLM's defaults as the first point",
                     "plain search: TPE's own draws"], "lrrr", rows)


_CALIBRATION = re.compile(r"fidelity sim: (\d+) real trial\(s\)( recorded before)?; calibration "
                          r"step_overhead (\S+), compute_efficiency (\S+), bandwidth_efficiency (\S+), "
                          r"frontend_latency (\S+), RMS log error (\S+)")


def calibration_events(study_dir: str | Path) -> dict[str, str]:
    """``{after: "step, compute, bandwidth, frontend (RMS)"}`` from the run logs (``run*.log``), as printed."""
    events = {}
    for log in sorted(Path(study_dir).glob("run*.log")):
        for m in _CALIBRATION.finditer(log.read_text()):
            n, before, *values, rms = m.groups()
            after = f"resumed: {n} trials recorded before, refitted" if before else f"trial {n}"
            events[after] = f"{', '.join(values)} ({rms})"
    return events


def calibration_table(per_level_dir: str | Path, per_trial_dir: str | Path) -> str:
    """The calibration each fidelity run printed after each real trial (a dash: none printed)."""
    runs = [calibration_events(per_level_dir), calibration_events(per_trial_dir)]
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return markdown(["after", "this run (per level)", "the run above (per trial)"], "lll",
                    [[k, *(r.get(k, DASH) for r in runs)] for k in keys])


def kv_dtype_table(study_dir: str | Path, above_rate: float = 60.0) -> str:
    """One row per ``kv_cache_dtype``: KV cache, capacity, latencies at capacity and at ``above_rate``,
    the probe's agreement with the baseline trial."""
    trials = trials_of(study_dir)
    levels = load_levels(study_dir)
    base = trials[trials["trial_id"] == trials["probe_baseline"]]
    base_capacity = base["capacity_rps"].iloc[0] if len(base) else float("nan")
    rows = []
    for _, t in trials.iterrows():
        itself = t["trial_id"] == t["probe_baseline"]
        lv = levels[(levels["trial_id"] == t["trial_id"]) & levels["rate"].apply(lambda r: math.isclose(r, above_rate))]
        at = (f"{lv['request_throughput'].iloc[0]:.1f}, {lv['ttft_p99_ms'].iloc[0]:.0f}, "
              f"{lv['tpot_p50_ms'].iloc[0]:.1f}") if len(lv) else DASH
        rows.append([str(t["kv_cache_dtype"]) + (" (baseline)" if itself else ""), fmt(t["kv_cache_tokens"], ",.0f"),
                     fmt(t["capacity_rps"], "g"), fmt(t["capacity_rps"] / base_capacity, ".2f"),
                     f"{t['ttft_p50_ms']:.0f} / {t['ttft_p99_ms']:.0f}", f"{t['tpot_p50_ms']:.2f}", at,
                     fmt(t["token_agreement"], "g") + (" (itself)" if itself else ""), fmt(t["prefix_agreement"], "g"),
                     f"{fmt(t['logprob_diff_mean'], '.2g')} / {fmt(t['logprob_diff_p95'], '.2g')}",
                     fmt(t["first_divergence_mean"], "g")])
    return markdown(["kv_cache_dtype", "KV cache tokens", "capacity req/s", "ratio vs auto", "TTFT p50 / p99 ms",
                     "TPOT p50 ms", f"at {above_rate:g} req/s: served req/s, TTFT p99 ms, TPOT p50 ms",
                     "token_agreement", "prefix_agreement", "logprob_diff_mean / p95", "first_divergence_mean"],
                    "lrrrrrrrrrr", rows)


# ---------------------------------------------------------------- simulator.md
@functools.lru_cache(maxsize=None)
def simulated_points(kind: str, folder: str) -> tuple:
    """One dataset's points (``kind``: ``ingress`` or ``study``) replayed in virtual time with the
    simulator's current constants, levels stopped early left out; kept for the process, so the
    tables and texts that read the same dataset simulate it once."""
    return tuple(p for p in run(load_points([(kind, folder)])) if p.mark != "aborted")


def sim_vs_real_table(datasets: Sequence[tuple[str, str | Path]]) -> str:
    """``benchmarks/sim_vs_h200.py``'s points (``(kind, folder)``: ``ingress`` or ``study``), replayed
    in virtual time with the simulator's current constants; levels stopped early left out."""
    points = [p for kind, path in datasets for p in simulated_points(kind, str(Path(path).resolve()))]
    return "\n".join([TABLE_HEADER, *(table_row(p) for p in points)])


def sim_ingress_table(folder: str | Path) -> str:
    return sim_vs_real_table([("ingress", folder)])


def sim_capacity_table(*study_dirs: str | Path) -> str:
    return sim_vs_real_table([("study", d) for d in study_dirs])


def interval(row: pd.Series, metric: str, spec: str = ".1f") -> str:
    """``value [low, high]`` of a row's metric (``inf`` for an unbounded high end)."""
    lo, hi = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    band = "" if missing(lo) else f" [{fmt(lo, spec)}, {'inf' if missing(hi) else fmt(hi, spec)}]"
    return fmt(row.get(metric), spec) + band


def interactive_table(study_dir: str | Path) -> str:
    """A capacity study's real trials with each capacity's interval: the pick, the simulator's
    prediction, the measurement [low, high], what binds at capacity, and the trial's wall time."""
    trials = trials_of(study_dir)
    journal = journal_trials(study_dir)
    points = read_study_definition(str(study_dir)).search.initial_points
    rows = []
    for _, t in trials.iterrows():
        attrs = journal[int(t["trial_number"])].user_attrs if int(t["trial_number"]) in journal else {}
        pick = "vLLM's defaults (initial point)" if initial_point(t, points) else str(attrs.get("fidelity_pick", DASH))
        rows.append([short_id(t["trial_id"]), pick, param("max_num_batched_tokens", t["max_num_batched_tokens"]),
                     param("max_num_seqs", t["max_num_seqs"]), fmt(t.get("predicted_capacity_rps"), ".1f"),
                     bold(interval(t, "capacity_rps")), fmt(t["ttft_p99_ms"], ".0f"), fmt(t["itl_p99_ms"], ".1f"),
                     fmt(t["wall_time_s"], ".0f")])
    return markdown(["real trial", "pick", "max_num_batched_tokens", "max_num_seqs", "predicted capacity req/s",
                     "**measured capacity req/s [low, high]**", "TTFT p99 ms at capacity", "ITL p99 ms at capacity",
                     "trial wall s"], "llrrrrrrr", rows)


def multiturn_table(study_dir: str | Path) -> str:
    """A fixed-rate multi-turn study's trials: the searched knobs, session goodput and attainment,
    TTFT of first and later turns, TPOT, the prefix cache's hit rate beside the sessions' share."""
    rows = []
    for _, t in trials_of(study_dir).iterrows():
        if not ran(t):
            continue
        rows.append([short_id(t["trial_id"]), param("enable_prefix_caching", t["enable_prefix_caching"]),
                     param("max_num_seqs", t["max_num_seqs"]), fmt(t["session_goodput"], ".2f"),
                     fmt(100 * t["session_slo_attainment"], ".0f") + "%",
                     f"{fmt(t['ttft_p50_ms_first_turn'], ',.0f')} / {fmt(t['ttft_p99_ms_first_turn'], ',.0f')}",
                     f"{fmt(t['ttft_p50_ms_later_turns'], ',.0f')} / {fmt(t['ttft_p99_ms_later_turns'], ',.0f')}",
                     fmt(t["tpot_p50_ms"], ".1f"),
                     f"{fmt(t['prefix_cache_hit_rate'], '.2f')} ({fmt(t['expected_prefix_hit_rate'], '.2f')})",
                     fmt(t["num_requests_running_peak"], ".0f"), fmt(t["wall_time_s"], ".0f")])
    return markdown(["trial", "enable_prefix_caching", "max_num_seqs", "session goodput sessions/s",
                     "sessions meeting the SLOs", "TTFT p50 / p99 ms, first turns",
                     "TTFT p50 / p99 ms, later turns", "TPOT p50 ms", "prefix-cache hit rate (sessions share)",
                     "peak running requests", "trial wall s"], "llrrrrrrrrr", rows)


def multiturn_turns_table(study_dir: str | Path) -> str:
    """TTFT p50 by turn index, one column per trial (the row's per-turn table, ``extra_json["turns"]``),
    with the workload's mean prompt length at that turn."""
    trials = [t for _, t in trials_of(study_dir).iterrows() if ran(t)]
    turns = {short_id(t["trial_id"]): {r["turn"]: r for r in json.loads(t["extra_json"]).get("turns", [])}
             for t in trials}
    indexes = sorted({i for by_turn in turns.values() for i in by_turn})
    rows = []
    for i in indexes:
        first = next(by_turn[i] for by_turn in turns.values() if i in by_turn)
        rows.append([str(i), fmt(first["requests"], "d"), fmt(first["prompt_tokens_mean"], ",.0f")]
                    + [fmt(by_turn.get(i, {}).get("ttft_p50_ms"), ",.0f") for by_turn in turns.values()])
    header = [f"trial {k}: prefix cache {'on' if bool(t['enable_prefix_caching']) else 'off'}, "
              f"{param('max_num_seqs', t['max_num_seqs'])} seqs" for k, t in zip(turns, trials)]
    return markdown(["turn", "requests", "prompt tokens (mean)", *(f"TTFT p50 ms, {h}" for h in header)],
                    "r" * (3 + len(header)), rows)
