"""docs/benchmarks.md's prose on decisions: the simulator's pairs (``benchmarks/decisions.py``) and the
engine starts of one configuration (``benchmarks/starts_gpu.sh``, ``benchmarks/repeatability.py --starts``).

Every figure and every claim ("in every seed", "holds the median") is computed here from the
benchmarks' Parquet files, by the functions the tables use.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.doc_tables.blocks import bullets, count_word, paragraph, series, span
from orchestrator.doc_tables.decisions import _starts, decision_counts
from orchestrator.doc_tables.window_noise import estimate_window_noise
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE
from orchestrator.measure.engine_noise import CPU_START_NOISE, GPU_WINDOW_NOISE
from orchestrator.results.levels import load_levels
from orchestrator.results.definition import read_study_definition
from orchestrator.results.paired import BETTER, EQUIVALENT, PAIRED_WIDEN, TIED, WORSE, compare
from orchestrator.trial.load_phase import NEAR_LIMIT


def _of(n: int, total: int, noun: str = "") -> str:
    """``every seed``, ``16 of 20 seeds``."""
    if n == total:
        return f"every {noun}".strip()
    return f"{n} of {total} {noun}{'s' if noun and total != 1 else ''}".strip()


def _hold(n: int, total: int) -> str:
    """``Every interval holds``, ``3 of 4 intervals hold``."""
    return ("Every interval holds" if n == total
            else f"{n} of {total} interval{'s hold' if total != 1 else ' holds'}")


def _truth(folder: Path) -> tuple[pd.DataFrame, dict]:
    trials = pd.read_parquet(folder / "trials.parquet")
    truth = pd.read_parquet(folder / "truth.parquet")
    return trials, truth[truth["status"] == "completed"].groupby("config")["capacity_rps"].median().to_dict()


def _pair(trials: pd.DataFrame, true_cap: dict, pair: str) -> tuple[str, str, float, dict]:
    mine = trials[trials["pair"] == pair]
    a, b = (mine[mine["side"] == s]["config"].iloc[0] for s in ("a", "b"))
    true = true_cap[b] / true_cap[a] - 1
    return a, b, true, decision_counts(trials, pair, true_difference=true)


def decisions_findings(folder: str | Path) -> str:
    """The three pairs of the decisions table, one bullet each."""
    trials, true_cap = _truth(Path(folder))
    items = []
    for pair in dict.fromkeys(trials["pair"]):
        a, b, true, n = _pair(trials, true_cap, pair)
        seeds, ranked = n["seeds"], n[BETTER] + n[WORSE]
        where = f"`max_num_seqs` {a.lstrip('S')} against {b.lstrip('S')}" if a != b else f"{a.lstrip('S')} twice"
        if abs(true) >= 0.05:  # told apart by the truth: ranked is the right call
            right = n[BETTER] if true > 0 else n[WORSE]
            items.append(
                f"**{pair}** ({where}, true difference {true * 100:+.1f}%): ranked the right way in {_of(right, seeds, 'seed')}, and the paired interval holds the true difference in "
                f"{n['holding']} of {seeds}. With levels that drew their own requests (before this design), the "
                f"same pair was ranked in fewer seeds: two configurations measured at different rates had seen "
                f"different bursts. `PAIRED_WIDEN` ({PAIRED_WIDEN:g}, `orchestrator/results/paired.py`) widens the "
                f"paired bootstrap's interval around the measured difference: without it more pairs were ranked "
                f"but fewer intervals held the true difference than they said (a tie is honest, a confident wrong "
                f"interval is not).")
        elif a == b:
            items.append(
                f"**{pair}** ({where}, two trials): equivalent in {_of(n[EQUIVALENT], seeds, 'seed')}. On the simulator in virtual time the two replay the same requests "
                f"and get the same numbers, so this is what common random numbers buy, not a test of noise: the "
                f"served simulator's test (`tests/search/test_decisions_served.py`: real time, real HTTP) and the "
                f"real engines' replicate starts below are.")
        else:
            items.append(
                f"**{pair}** ({where}, true difference {true * 100:+.1f}%): equivalent in {_of(n[EQUIVALENT], seeds, 'seed')}" + (f", ranked in {ranked} (where the two searches stopped at different rates)"
                            if ranked else "") + (f", tied in {n[TIED]}" if n[TIED] else "")
                + f". The true difference sits inside {n['holding']} of {seeds} paired intervals, whose median "
                f"half-width is ±{n['half_width'] * 100:.1f}%: on one draw the two schedules are nearly the same; "
                f"equivalence is still the right call.")
    return bullets(items, "*")


def decisions_coverage(folder: str | Path) -> str:
    """Whether the single trials' capacity intervals hold the truth as often as their confidence says."""
    folder = Path(folder)
    trials, true_cap = _truth(folder)
    done = trials[trials["status"] == "completed"].drop_duplicates(["seed", "config"])
    shares = []
    for cfg, g in done.groupby("config"):
        high = g["capacity_rps_high"].fillna(np.inf)
        shares.append(float(((g["capacity_rps_low"] <= true_cap[cfg]) & (true_cap[cfg] <= high)).mean()))
    said = f"{DEFAULT_CONFIDENCE:.0%}"
    if max(shares) < DEFAULT_CONFIDENCE:
        verdict = f"They hold it less often than their {said} says ({span([s * 100 for s in shares])}% of trials)."
    elif min(shares) >= DEFAULT_CONFIDENCE:
        verdict = f"They hold it at least as often as their {said} says ({span([s * 100 for s in shares])}% of trials)."
    else:
        verdict = (f"Some hold it less often than their {said} says ({span([s * 100 for s in shares])}% of trials "
                   f"by configuration).")
    return paragraph(
        verdict, "A capacity interval covers what this draw of the workload gives on any engine start (its "
        "resamples, the engine's window and start noise); a different draw of 8 s levels moves the capacity "
        "further than the block bootstrap of one draw sees. Comparisons do not suffer from it (both trials replay "
        "the one draw); a fleet planned on an absolute capacity (`orchestrator plan`) should read the interval as "
        "this workload draw's.")


# ---------------------------------------------------------------- engine starts
def _levels(study_dir: Path) -> pd.DataFrame:
    return load_levels(study_dir).sort_values("level")


def _study_dirs(folder: Path, series_name: str) -> list[Path]:
    return sorted(d for d in folder.iterdir() if d.is_dir() and d.name.startswith(series_name + "-k"))


def _at(levels: pd.DataFrame, rate: float) -> pd.DataFrame:
    return levels[levels["rate"].apply(lambda r: math.isclose(r, rate, rel_tol=1e-3))]


def _common_rate(dirs: list[Path]) -> float:
    """The lowest rate every start measured (the grid's first: the same requests on every start)."""
    rates = [set(np.round(_levels(d)["rate"], 3)) for d in dirs]
    return float(min(set.intersection(*rates)))


def _limit(study_dir: Path, metric: str) -> float:
    """The study's SLO limit on ``metric``."""
    return next(c.value for c in read_study_definition(str(study_dir)).constraints if c.metric == metric)


def _ill_conditioned(folder: Path, series_name: str) -> str:
    df = _starts(folder)
    g = df[df["series"] == series_name]
    dirs = _study_dirs(folder, series_name)
    ill = int((g["capacity_conditioned"].astype("boolean") == False).sum())  # noqa: E712
    binding = g["capacity_binding"].dropna().mode()
    metric = str(binding.iloc[0]) if len(binding) else "itl_p99_ms"
    rate = _common_rate(dirs)
    limit_ms = _limit(dirs[0], metric)
    at = [float(_at(_levels(d), rate)[metric].iloc[0]) for d in dirs]
    none_met = [d for d in dirs if not _levels(d)["slo_met"].astype(bool).any()]
    sentence = (f"**The defaults' capacity is ill-conditioned, and the rows say so.** Their binding metric, "
                f"`{metric}`, reads {series([f'{v:.1f}' for v in at])} ms at {rate:g} req/s on the "
                f"{count_word(len(dirs))} starts, against its {limit_ms:g} ms limit, so a start that adds a "
                f"millisecond moves the capacity by tens of percent. {count_word(ill).capitalize()} of "
                f"{count_word(len(g))} rows are marked `capacity_conditioned: false`.")
    if none_met:
        low = _levels(none_met[0]).sort_values("rate").iloc[0]
        sentence += (f" {count_word(len(none_met)).capitalize()} start{'s' if len(none_met) != 1 else ''} met no "
                     f"level at all (`{metric}` {low[metric]:.1f} ms at {low['rate']:g} req/s): capacity 0, an "
                     f"interval from 0 to the lowest rate measured, ill-conditioned.")
    return sentence + (" Compare such a configuration by its margin at common rates, which the levels table holds, "
                       "not by one capacity number.")


def _starts_named(ks: list[int]) -> str:
    """``starts 1–4`` (a run of numbers) or ``starts 5, 7 and 9``."""
    ks = sorted(ks)
    if len(ks) == 1:
        return f"start {ks[0]}"
    return f"starts {ks[0]}–{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) else f"starts {series([str(k) for k in ks])}"


def _binding_story(folder: Path, series_name: str, metric: str, ks: list[int]) -> str:
    """How the binding ``metric`` behaved on the starts ``ks`` that it bound: steep at its limit (a met level,
    then a missed one far past the limit), or near its limit at every rate (ill-conditioned)."""
    first = folder / f"{series_name}-k{min(ks)}-s0"
    limit = _limit(first, metric)
    levels = _levels(first).sort_values("rate")
    met = levels[levels["slo_met"].astype(bool)]
    missed = levels[~levels["slo_met"].astype(bool)]
    if len(met) and len(missed) and float(missed[metric].iloc[-1]) > 2 * limit:
        top, past = met.iloc[-1], missed[missed["rate"] > met["rate"].iloc[-1]].iloc[0]
        return (f"`{metric}` on {_starts_named(ks)}, turning steeply at its limit ({top[metric]:,.0f} ms at "
                f"{top['rate']:.1f} req/s, {past[metric]:,.0f} ms at {past['rate']:.1f} on start {min(ks)}; limit "
                f"{limit:g} ms)")
    values = levels[metric].to_numpy(dtype=float)
    return (f"`{metric}` on {_starts_named(ks)}, near its {limit:g} ms limit at every rate measured "
            f"({values.min():.0f}–{values.max():.0f} ms from {levels['rate'].min():g} to {levels['rate'].max():.1f} "
            f"req/s on start {min(ks)}), so the crossing is ill-conditioned")


def _steady(folder: Path, series_name: str) -> str:
    df = _starts(folder)
    g = df[df["series"] == series_name]
    cap = g["capacity_rps"].to_numpy(dtype=float)
    med = float(np.median(cap))
    spread = float(np.max(np.abs(cap - med)) / med)
    low, high = g["capacity_rps_low"].to_numpy(dtype=float), g["capacity_rps_high"].fillna(np.inf).to_numpy(float)
    holds = int(np.sum((low <= med) & (med <= high)))
    half = float(np.median((high - low) / 2 / cap))
    ill = int((g["capacity_conditioned"].astype("boolean") == False).sum())  # noqa: E712
    groups = sorted(((str(m), sorted(int(k) for k in s["start"])) for m, s in g.groupby("capacity_binding")),
                    key=lambda x: x[1][0])
    stories = [_binding_story(folder, series_name, m, ks) for m, ks in groups]
    paces = "; ".join(f"{span(g[g['start'].isin(ks)]['itl_p50_ms'])} ms on {_starts_named(ks)}" for _, ks in groups)
    dirs = _study_dirs(folder, series_name)
    windows = [int(_levels(d)["windows"].sum()) for d in dirs]
    again = [int((_levels(d)["windows"] - 1).clip(lower=0).sum()) for d in dirs]
    return (f"**The tuned configuration moves by up to {spread:.0%} between starts** "
            f"({series([f'{c:.1f}' for c in cap])}). Its binding metric was {series(stories)}. "
            f"The engine's token pace moved with it: ITL p50 {paces}. "
            + (f"{count_word(ill).capitalize()} of {count_word(len(g))} rows are marked `capacity_conditioned: "
               "false`; " if ill else "No row is marked `capacity_conditioned: false`; ") +
            f"{_hold(holds, len(g)).lower()} the median, at a median half-width of ±{half:.0%}. A search spent "
            f"{span(again)} of its {span(windows)} windows measuring levels again (a level is measured again only "
            f"within {math.exp(-NEAR_LIMIT):.2f}x to {math.exp(NEAR_LIMIT):.2f}x of its limit: where the binding "
            f"metric sits near its limit at every rate, every level qualifies).")


def _paired(folder: Path, better: str, baseline: str) -> str:
    df = _starts(folder)
    a = df[df["series"].str.endswith(better)]
    b = df[df["series"].str.endswith(baseline)]
    ks = sorted(set(a["start"]) & set(b["start"]))
    verdicts = [compare(a[a["start"] == k].iloc[0].to_dict(), b[b["start"] == k].iloc[0].to_dict(), "capacity_rps",
                        "maximize").verdict for k in ks]
    ratio = float(np.median(a["capacity_rps"])) / float(np.median(b["capacity_rps"]))
    return (f"**The paired difference excludes 0 on {_of(verdicts.count(BETTER), len(ks), 'start')}**: the tuned configuration holds {ratio:.1f} times the defaults' load "
            f"under this SLO (medians), as `vllm bench serve` found on the same kind of GPU (it held 48 req/s with "
            f"the tuned setting, at most 24 with the defaults).")


def _cpu(folder: Path) -> str:
    df = _starts(folder)
    cap = df["capacity_rps"].to_numpy(dtype=float)
    med = float(np.median(cap))
    low, high = df["capacity_rps_low"].to_numpy(dtype=float), df["capacity_rps_high"].to_numpy(dtype=float)
    holds = int(np.sum((low <= med) & (med <= high)))
    half = float(np.median((high - low) / 2 / cap))
    dirs = [d for d in sorted(folder.iterdir()) if (d / "levels").is_dir()]
    common = sorted(set.intersection(*[set(np.round(_levels(d)["rate"], 3)) for d in dirs]))
    rate = float([r for r in common if r < med][-1])  # the highest rate every start measured, below the median
    ttft = [float(_at(_levels(d), rate)["ttft_p99_ms"].iloc[0]) for d in dirs]
    prior_text = f" (`capacity_rps` {CPU_START_NOISE.sd_of('capacity_rps'):g} in `CPU_START_NOISE`)"
    return (f"**CPU vLLM: the engine's own speed moves between starts.** {count_word(len(df)).capitalize()} starts "
            f"of one configuration on the same requests: capacities from {cap.min():.0f} to {cap.max():.0f} req/s "
            f"(TTFT p99 at {rate:g} req/s from {min(ttft):,.0f} to {max(ttft):,.0f} ms). "
            f"{_hold(holds, len(df))} the median because "
            f"the CPU prior carries a start-to-start shift of the engine's speed{prior_text}. The median half-width "
            f"is ±{half:.0%}: the ±5% target is not met on this machine, where no interval narrower than the starts' "
            f"own spread (±{float(np.max(np.abs(cap - med)) / med):.0%} around the median) could hold their median.")


def starts_findings(h100: str | Path, cpu: str | Path) -> str:
    """The starts table's findings: the H100's two configurations, their paired difference, CPU vLLM."""
    h100, cpu = Path(h100), Path(cpu)
    walls = _starts(h100)["wall_time_s"]
    return bullets([
        _ill_conditioned(h100, "starts-h100-defaults"),
        _steady(h100, "starts-h100-tuned"),
        _paired(h100, "tuned", "defaults"),
        _cpu(cpu),
        f"A search took {span(walls)} s of wall time on the H100 (its windows, the warm-up and drains), the "
        f"engine start outside the trial's timer.",
    ], "*")


def _lower_side(folder: Path, series_name: str, target: float = 0.10) -> str:
    """What sets the lower side of a steady configuration's capacity intervals: the met levels below
    its capacity that no start could decide (an interval reaching the limit)."""
    df = _starts(folder)
    g = df[df["series"] == series_name]
    cap, low = g["capacity_rps"].to_numpy(dtype=float), g["capacity_rps_low"].to_numpy(dtype=float)
    high = g["capacity_rps_high"].fillna(np.inf).to_numpy(dtype=float)
    half = float(np.median((high - low) / 2 / cap))
    below = float(np.median((cap - low) / cap))
    above = float(np.median((high - cap) / cap))
    metric = str(g["capacity_binding"].dropna().mode().iloc[0])
    undecided = []
    for d, c in zip(_study_dirs(folder, series_name), cap):
        lv = _levels(d)
        met = lv[(lv["rate"] < c) & lv["slo_met"].astype(bool)].sort_values("rate")
        open_ = met[~met["slo_decided"].astype(bool)]
        if len(open_):
            undecided.append(open_.iloc[-1])
    limit = _limit(_study_dirs(folder, series_name)[0], metric)
    verdict = "meets" if half <= target else "misses"
    told = (f"The median half-width, ±{half:.0%}, {verdict} the ±{target:.0%} target.")
    if not undecided:
        return told
    rates = sorted({round(float(r["rate"]), 2) for r in undecided})
    return (f"{told} The interval is lopsided: {below:.0%} below the estimate, {above:.0%} above it (median). "
            f"The met levels just below the estimate ({series([f'{r:.1f}' for r in rates])} req/s) were not "
            f"decided on {'any start' if len(undecided) == len(g) else _of(len(undecided), len(g), 'start')}: "
            f"`{metric}` read {span([r[metric] for r in undecided])} ms there, but its interval reached "
            f"{span([r[metric + '_high'] for r in undecided])} ms against the {limit:g} ms limit (8 s windows of "
            f"{span([r['num_requests'] for r in undecided])} requests, widened by the tail's window noise), so the "
            f"fit's resampled crossings reach down to {span(low)} req/s. Longer windows at the levels near the "
            f"limit would narrow it; this run did not try them.")


def one_machine_findings(folder: str | Path) -> str:
    """The starts of ``benchmarks/starts_gpu.sh`` on one machine with the current search: the defaults,
    the tuned configuration and what bounds its interval, the paired difference, each start's wall."""
    folder = Path(folder)
    walls = _starts(folder)["wall_time_s"]
    done = [int(m) for call in sorted((folder / "calls").glob("*.txt"))
            for m in re.findall(r"start \d+: done after (\d+) s", call.read_text())]
    windows = pd.read_parquet(folder / "windows.parquet")
    noise = {m: estimate_window_noise(windows, m) for m in ("ttft_p99_ms", "ttft_p90_ms")}
    return bullets([
        _ill_conditioned(folder, "starts-h100-defaults"),
        _steady(folder, "starts-h100-tuned") + " " + _lower_side(folder, "starts-h100-tuned"),
        _paired(folder, "tuned", "defaults"),
        f"**Window noise on these starts** (`windows.parquet`: {noise['ttft_p99_ms']['groups']} levels measured in "
        f"two windows, as `benchmarks/window_noise.py windows` writes them): TTFT p99 "
        f"{noise['ttft_p99_ms']['noise']:.2f} (log sd), p90 {noise['ttft_p90_ms']['noise']:.2f}, against the GPU "
        f"prior every interval above carries, {GPU_WINDOW_NOISE.sd_of('ttft_p99_ms'):.2f} and "
        f"{GPU_WINDOW_NOISE.sd_of('ttft_p90_ms'):.2f} (`GPU_WINDOW_NOISE`, the H200's). Not acted on yet: one "
        "workload on one machine.",
        f"A search took {span(walls)} s of wall time; a whole start, from launching `vllm serve` to its process "
        f"gone after the search, {span(done)} s.",
    ], "*")
