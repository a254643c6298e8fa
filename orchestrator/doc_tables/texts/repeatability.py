"""docs/benchmarks.md's prose on repeatability and window noise, and the other docs' sentences
that cite them (docs/nightly.md).

The datasets: ``benchmarks/repeatability.py``'s folders (one study per seed, ``<series>-s<seed>``
capacity searches and ``<series>-r<rate>-s<seed>`` fixed-rate windows) and the GPUs'
``windows.parquet``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from orchestrator.doc_tables.blocks import bullets, count_word, paragraph, ranges, series, span
from orchestrator.doc_tables.h200 import trials_of
from orchestrator.doc_tables.window_noise import estimate_window_noise, fixed_rate_windows
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, z_of
from orchestrator.measure.engine_noise import GPU_WINDOW_NOISE
from orchestrator.results.levels import load_levels
from orchestrator.results.repeatability import capacity_spread, series_of

# The H200 seeds decided with the first form of the intervals (the same factor below and above);
# the rows do not record which form decided them.
H200_FIRST_FORM_SEEDS = (0, 1)
_SERVE_UP = re.compile(r"vllm serve \(.*?\) up after (\d+) s")
_RECORDED_RUN = re.compile(r"^\S+-s(\d+): run (\S+) in", re.MULTILINE)
_ORDINALS = ("one", "a second", "a third", "a fourth", "a fifth")


def runs(folder: str | Path) -> pd.DataFrame:
    """One trials row per capacity search (``<series>-s<seed>``) under ``folder``, with its ``seed``,
    in seed order."""
    rows = []
    for d in sorted(Path(folder).iterdir()):
        series_name, rate, seed = series_of(d.name)
        if d.is_dir() and rate is None and seed is not None:
            t = trials_of(d).iloc[0].copy()
            t["seed"], t["dir"] = seed, d
            rows.append(t)
    return pd.DataFrame(rows).sort_values("seed").reset_index(drop=True)


def servers(folder: str | Path) -> list[list[int]]:
    """The seeds of each server of a GPU's capacity runs, in the order they ran: one ``run*.log`` per
    device call and server, holding the seeds whose recorded run it ran (a run it began and did not
    finish is recorded by a later server)."""
    r = runs(folder)
    recorded = dict(zip(r["run_id"], r["seed"]))
    start = dict(zip(r["seed"], r["started_at"]))
    groups = []
    for log in Path(folder).glob("run*.log"):
        seeds = sorted(recorded[m.group(2)] for m in _RECORDED_RUN.finditer(log.read_text())
                       if m.group(2) in recorded and int(m.group(1)) == recorded[m.group(2)])
        if seeds:
            groups.append(seeds)
    return sorted(groups, key=lambda g: min(start[s] for s in g))


def server_phrase(groups: Sequence[Sequence[int]]) -> str:
    """``seeds 0–1 on one server, 2–3 on a second, 4 on a third``."""
    parts = [f"{ranges(g)} on {_ORDINALS[i]}{' server' if i == 0 else ''}" for i, g in enumerate(groups)]
    return "seeds " + ", ".join(parts)


def levels_of(run: pd.Series) -> pd.DataFrame:
    return load_levels(run["dir"]).sort_values("level")


def fixed_spread(folder: str | Path, metric: str = "ttft_p99_ms") -> tuple[float, float, float, float]:
    """(rate, the largest distance from the median, min, max) of ``metric`` over a folder's fixed-rate runs."""
    frame = fixed_rate_windows(folder, source="")
    v = pd.to_numeric(frame[metric], errors="coerce").dropna().to_numpy(dtype=float)
    med = float(np.median(v))
    return float(frame["rate"].iloc[0]), float(np.max(np.abs(v - med)) / med), float(v.min()), float(v.max())


def _at(levels: pd.DataFrame, rate: float) -> pd.DataFrame:
    return levels[levels["rate"].apply(lambda r: math.isclose(r, rate, rel_tol=1e-3))]


def _log_sd(values) -> float:
    return float(np.std(np.log(np.asarray(values, dtype=float)), ddof=1))


def _implied_sd(lv: pd.Series, metric: str = "ttft_p99_ms") -> float:
    """The log standard deviation a level's 90% interval implies."""
    return math.log(lv[f"{metric}_high"] / lv[f"{metric}_low"]) / (2 * z_of(DEFAULT_CONFIDENCE))


def _interval(t: pd.Series) -> str:
    return f"[{t['capacity_rps_low']:.1f}, {t['capacity_rps_high']:.1f}]"


def _not_sharp(folder: str | Path) -> list[str]:
    """Each search where a level missed its SLOs below a rate a later level was decided to meet."""
    out = []
    for _, run in runs(folder).iterrows():
        lv = levels_of(run)
        met = lv[(lv["slo_met"] == True) & (lv["slo_decided"] == True)]  # noqa: E712
        for _, miss in lv[lv["slo_met"] == False].iterrows():  # noqa: E712
            above = met[met["rate"] > miss["rate"]]
            if len(above):
                hit = above.sort_values("rate").iloc[-1]
                out.append(f"seed {run['seed']} missed at {miss['rate']:.4g} req/s "
                           f"(TTFT p99 {miss['ttft_p99_ms']:,.0f} "
                           f"ms) and was decided met at {hit['rate']:.3g} ({hit['ttft_p99_ms']:,.0f} ms)")
                break
    return out


def repeatability_findings(sim: Path, cpu: Path, h100: Path) -> str:
    spreads = {name: fixed_spread(folder) for name, folder in (("served simulator", sim), ("H100", h100),
                                                               ("CPU vLLM", cpu))}
    lo_name = min(spreads, key=lambda k: spreads[k][1])
    hi_name = max(spreads, key=lambda k: spreads[k][1])
    mid = [k for k in spreads if k not in (lo_name, hi_name)]
    served = {name: capacity_spread(runs(folder)) for name, folder in (("served simulator", sim), ("CPU vLLM", cpu))}
    met = [k for k, s in served.items() if s["within_3pct"]]
    missed = [k for k, s in served.items() if not s["within_3pct"]]
    target = ("The ±3% target is " + (f"met on {series(met)}" if met else "") + (" and " if met and missed else "")
              + (f"missed on {series(missed) if len(missed) < len(served) else 'both'}" if missed else "") + ".")
    knee = _not_sharp(cpu)
    return bullets([
        f"**One window is one draw.** At a fixed rate, TTFT p99 of one window moves by ±{spreads[lo_name][1]:.0%} "
        f"({lo_name}, {spreads[lo_name][0]:g} req/s) to ±{spreads[hi_name][1]:.0%} ({hi_name}, "
        f"{spreads[hi_name][0]:g} req/s) from seed to seed"
        + "".join(f" (the {k}: ±{spreads[k][1]:.0%} at {spreads[k][0]:g} req/s)" for k in mid)
        + ". A capacity decided from one window per level inherits that.",
        "**The capacity search now says how sure it is, and holds to it.** On the served simulator and on CPU vLLM "
        + ("every run's" if all(s["every_interval_holds"] for s in served.values()) else "not every run's")
        + " 90% interval held the median of all "
        + (count_word(counts.pop()) if len(counts := {s["runs"] for s in served.values()}) == 1 else "its runs")
        + " ("
        + ", ".join(f"{s['holding']} of {s['runs']}" for s in served.values()) + "), the estimates within "
        + " and ".join(f"±{s['spread']:.1%}" for s in served.values()) + " of the median, intervals "
        + " and ".join(f"{s['width']:.0%}" for s in served.values()) + f" wide. {target}"
        + (f" The CPU engine's knee is no sharp line: {series(knee)}; the capacity is the fit of every level, not "
           "the last crossing." if knee else "")])


def h200_repeatability(h200: Path, study: Path) -> str:
    """The H200 bullet: five seeds, the one interval that misses the median, the windows that disagree."""
    r = runs(h200)
    groups = servers(h200)
    s = capacity_spread(r)
    med = s["median"]
    holds = (r["capacity_rps_low"] <= med) & (med <= r["capacity_rps_high"])
    miss = r[~holds]
    out = []
    for _, m in miss.iterrows():
        lv = levels_of(m)
        below = lv[lv["rate"].apply(lambda x: math.isclose(x, m["capacity_rps_low"], rel_tol=1e-3))].iloc[0]
        above = lv[lv["rate"].apply(lambda x: math.isclose(x, m["capacity_rps_high"], rel_tol=1e-3))].iloc[0]
        by = med - m["capacity_rps_high"] if med > m["capacity_rps_high"] else m["capacity_rps_low"] - med
        others = pd.concat([levels_of(o) for _, o in r.iterrows() if o["seed"] != m["seed"]])
        near = others[(others["rate"] > below["rate"] - 1) & (others["rate"] < above["rate"] + 1.5)]
        out.append(
            f"Seed {m['seed']}'s interval, {_interval(m)}, misses it by {by:.1f} req/s: it passed {below['rate']:.1f} "
            "req/s "
            f"in {count_word(int(below['windows']))} window (TTFT p99 {below['ttft_p99_ms']:.0f} ms "
            f"[{below['ttft_p99_ms_low']:.0f}, {below['ttft_p99_ms_high']:.0f}]) and failed {above['rate']:.1f} in "
            f"{count_word(int(above['windows']))} ({above['ttft_p99_ms']:.0f} ms [{above['ttft_p99_ms_low']:.0f}, "
            f"{above['ttft_p99_ms_high']:.0f}]), while other seeds passed "
            f"{series([f'{x:.1f}' for x in sorted(near.loc[near['slo_met'] == True, 'rate'])])} and failed "  # noqa: E712
            f"{series([f'{x:.1f}' for x in sorted(near.loc[near['slo_met'] == False, 'rate'])])}.")  # noqa: E712
    at60 = [_at(levels_of(run), 60.0).iloc[0] for _, run in r.iterrows()]
    at40 = [_at(levels_of(run), 40.0).iloc[0] for _, run in r.iterrows()]
    windows60 = sum(int(lv["windows"]) for lv in at60)
    today = r[~r["seed"].isin(H200_FIRST_FORM_SEEDS)].index
    imp60 = [_implied_sd(at60[i]) for i in today]
    imp40 = [_implied_sd(at40[i]) for i in today]
    lowest = min(range(len(at60)), key=lambda i: at60[i]["ttft_p99_ms_high"])
    highest = max(range(len(at60)), key=lambda i: at60[i]["ttft_p99_ms_low"])
    apart = at60[highest]["ttft_p99_ms_low"] > at60[lowest]["ttft_p99_ms_high"]
    wide = r[r["capacity_rps"] > 60]
    walls = r["wall_time_s"]
    ref = trials_of(study)
    start = ref["startup_s"].median()
    ref_wall = ref.loc[ref["trial_id"].str.endswith("-0000"), "wall_time_s"].iloc[0]
    ratio = (walls.median() + start) / ref_wall
    ratio_sd60 = _log_sd([lv["ttft_p99_ms"] for lv in at60]) / max(imp60)
    return bullets([
        "**H200: the target is " + ("missed" if s["spread"] > 0.03 else "met") + f".** {count_word(len(r)).capitalize()} "
        f"seeds on {count_word(len(groups))} servers ({server_phrase(groups).replace(' server,', ',')}; each server one "
        "engine start): capacities "
        f"{series([f'{c:.1f}' for c in r['capacity_rps']])} req/s, median {med:.1f}, the farthest ±{s['spread']:.0%} "
        f"from it; {s['holding']} of the {s['runs']} intervals hold the median. " + " ".join(out)
        + f" The windows at the same rate disagree by more than one window's bootstrap allows: at 60 req/s the "
        f"{count_word(len(at60))} levels ({windows60} windows) read TTFT p99 "
        f"{series([format(lv['ttft_p99_ms'], ',.0f') for lv in at60])} ms, and seed {r['seed'][highest]}'s interval "
        "there, "
        f"[{at60[highest]['ttft_p99_ms_low']:,.0f}, {at60[highest]['ttft_p99_ms_high']:,.0f}], "
        + ("lies wholly above" if apart else "overlaps") + f" seed {r['seed'][lowest]}'s "
        f"[{at60[lowest]['ttft_p99_ms_low']:,.0f}, {at60[lowest]['ttft_p99_ms_high']:,.0f}]; at 40 req/s, "
        f"{series([format(lv['ttft_p99_ms'], '.0f') for lv in at40])} ms. Past the knee the spread of TTFT p99 between "
        f"levels of one rate is {ratio_sd60:.0f}–{_log_sd([lv['ttft_p99_ms'] for lv in at60]) / min(imp60):.0f} times "
        f"what a level's interval says (log-scale standard deviation {_log_sd([lv['ttft_p99_ms'] for lv in at60]):.2f} "
        f"at 60 req/s, against {span(imp60, '.2f')} implied by the 90% intervals of seeds "
        f"{series([str(x) for x in r['seed'][today]])}; at 40 req/s {_log_sd([lv['ttft_p99_ms'] for lv in at40]):.2f} "
        f"against {span(imp40, '.2f')}), so a bracket made of two single-window decisions near the knee is too narrow; "
        f"the {count_word(len(wide))} runs above 60 req/s are the ones whose wide brackets "
        f"({series([_interval(t) for _, t in wide.iterrows()])}) admit it. Trial walls {span(walls)} s of load (median "
        f"{walls.median():.0f}); with an engine start of the study below (median {start:.0f} s), about {ratio:.1f}x "
        f"its {ref_wall:.0f} s trial of vLLM's defaults: {'within' if ratio <= 1.5 else 'beyond'} the 1.5x allowed. "
        f"Seeds {series([str(x) for x in H200_FIRST_FORM_SEEDS])} used the first form of the intervals (below), the "
        "others today's."])


def h100_repeatability(h100: Path, study: Path) -> str:
    r = runs(h100)
    s = capacity_spread(r)
    med = s["median"]
    windows = [int(levels_of(run)["windows"].sum()) for _, run in r.iterrows()]
    decided = pd.concat([levels_of(run).assign(seed=run["seed"]) for _, run in r.iterrows()])
    sure = decided[decided["slo_decided"] == True]  # noqa: E712
    open_ = decided[decided["slo_decided"] != True]  # noqa: E712
    met_rates = sorted(set(sure.loc[sure["slo_met"] == True, "rate"].round(1)))  # noqa: E712
    miss_rates = sorted(set(sure.loc[sure["slo_met"] == False, "rate"].round(1)), reverse=True)  # noqa: E712
    from_levels = [(run["capacity_rps_low"] in set(sure["rate"])) and (run["capacity_rps_high"] in set(sure["rate"]))
                   for _, run in r.iterrows()]
    brackets = {}
    for (_, run), lv in zip(r.iterrows(), from_levels):
        brackets.setdefault(_interval(run), []).append((run["seed"], lv))
    said = [f"{b}" + (f" {count_word(len(v))} times" if len(v) > 1 else "") for b, v in brackets.items()]
    fitted = [seed for b, v in brackets.items() for seed, lv in v if not lv]
    one_window = open_[open_["windows"] == 1]
    rate, spread, lo, hi = fixed_spread(h100)
    _, tpot_spread, tlo, thi = fixed_spread(h100, "tpot_p50_ms")
    serve = [int(m.group(1)) for log in sorted(Path(h100).glob("run-*.log"))
             for m in _SERVE_UP.finditer(log.read_text())]
    ref = trials_of(study)
    ref_wall = ref.loc[ref["trial_id"].str.endswith("-0000"), "wall_time_s"].iloc[0]
    ratio = (r["wall_time_s"].median() + np.median(serve)) / ref_wall
    return bullets([
        "**H100, live with today's intervals: "
        + ("every interval holds the median" if s["every_interval_holds"] else "not every interval holds the median")
        + ", and says how wide the answer is.** Capacities "
        f"{series([f'{c:.1f}' for c in r['capacity_rps']])} req/s, median {med:.1f}, the farthest ±{s['spread']:.1%} "
        f"({'within' if s['within_3pct'] else 'so not within'} ±3%); {s['holding']} of {s['runs']} intervals hold the "
        f"median: {series(said)}. Each search spent "
        f"{'its ' + str(windows[0]) if len(set(windows)) == 1 else span(windows)} "
        f"windows: {series([f'{x:g}' for x in met_rates])} req/s decided met, {series([f'{x:g}' for x in miss_rates])} "
        f"decided missed, and the levels near the knee ({span(open_['rate'], '.1f')} req/s, one or two windows each"
        + (f"; seed {one_window['seed'].iloc[0]}'s {one_window['rate'].iloc[0]:.1f} req/s level had one"
           if len(one_window) else "")
        + ") stayed undecided under the window noise, so the bracket is the decided levels"
        + (f" (seed {series([str(x) for x in fitted])}'s comes from the knee fit)" if fitted else "") + ". That is the "
        f"honest answer of {windows[0]} windows of 12 s on this GPU: between {min(met_rates):g} and "
        f"{min(miss_rates):g} req/s at 90%, best estimated within ±{s['spread']:.0%}. A narrower one "
        "costs more windows near the knee (`capacity.max_windows`, `level_duration_s`). Trial walls "
        f"{span(r['wall_time_s'])} s of load (median {r['wall_time_s'].median():.0f}); `vllm serve` took "
        f"{series([f'{x}' for x in sorted(set(serve))])} s to start: about {ratio:.1f}x a {ref_wall:.0f} s trial of "
        "the "
        f"H200 study, {'within' if ratio <= 1.5 else 'beyond'} the 1.5x allowed. At {rate:g} req/s one window's TTFT "
        f"p99 moved {lo:.0f}–{hi:.0f} ms between seeds (±{spread:.0%}), TPOT p50 {tlo:.1f}–{thi:.1f} ms."])


def window_noise_findings(h200: Path, h100: Path, cpu: Path, sim: Path) -> str:
    w200 = pd.read_parquet(Path(h200) / "windows.parquet")
    w100 = pd.read_parquet(Path(h100) / "windows.parquet")
    est = lambda w, m: estimate_window_noise(w, m)  # noqa: E731
    n200 = {m: est(w200, m) for m in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                                       "itl_p99_ms", "e2el_p50_ms", "e2el_p99_ms")}
    n100 = {m: est(w100, m) for m in n200}
    pooled = {m: est(pd.concat([w200, w100]), m) for m in ("ttft_p99_ms", "ttft_p90_ms")}
    none200 = [m for m, r in n200.items() if r["noise"] < 0.005]
    cpu_w = fixed_rate_windows(cpu, source="cpu")
    sim_w = fixed_rate_windows(sim, source="sim")
    cpu_moved = {m: est(cpu_w, m)["noise"] for m in n200 if est(cpu_w, m)["noise"] >= 0.005}
    sim_moved = {m: est(sim_w, m)["noise"] for m in n200 if est(sim_w, m)["noise"] >= 0.005}
    # the first run's first two levels measured in two windows, as the file lists them
    (first_g, first), (_, second) = list(w200.groupby("group", sort=False))[:2]
    widest, second_rate = first["ttft_p99_ms"].tolist(), second["rate"].iloc[0]
    second = second["ttft_p99_ms"].tolist()
    seed = re.search(r"-s(\d+)/", first_g).group(1)
    rate = first["rate"].iloc[0]
    named = {"ttft_p50_ms": "TTFT's median", "itl_p99_ms": "ITL", "e2el_p50_ms": "E2E latency",
             "e2el_p99_ms": "E2E latency"}
    kept = all(math.isclose(GPU_WINDOW_NOISE.sd_of(m), round(n200[m]["noise"], 2)) for m in
               ("ttft_p90_ms", "ttft_p99_ms", "tpot_p99_ms"))
    moved100 = [m for m, r in n100.items() if r["noise"] >= 0.005]
    return bullets([
        "**On the H200, TTFT's tails move between windows** by more than their requests show: the two windows of one "
        f"level read TTFT p99 {widest[0]:,.0f} and {widest[1]:,.0f} ms (seed {seed} at {rate:.0f} req/s), "
        f"{second[0]:,.0f} and {second[1]:,.0f} ms ({second_rate:.0f} req/s). Noise {n200['ttft_p99_ms']['noise']:.2f} "
        f"(log sd) for p99, {n200['ttft_p90_ms']['noise']:.2f} for p90, {n200['tpot_p99_ms']['noise']:.2f} for TPOT "
        f"p99; none for {series(list(dict.fromkeys(named[m] for m in none200 if m in named)))}; "
        f"{n200['tpot_p50_ms']['noise']:.2f} for TPOT's median, left out (inside the estimate's own error). "
        f"{count_word(n200['ttft_p99_ms']['groups']).capitalize()} levels near the knee, so the estimates are rough (a "
        f"standard deviation from {n200['ttft_p99_ms']['groups']} degrees of freedom is known to about "
        f"+-{1 / math.sqrt(2 * n200['ttft_p99_ms']['groups']):.0%}).",
        f"**On CPU vLLM {'only ' + series([named.get(m, m) for m in cpu_moved]) if cpu_moved else 'nothing'} moved** "
        f"beyond its intervals ({series([f'{v:.2f}' for v in cpu_moved.values()])}, from one group of "
        f"{count_word(len(fixed_rate_windows(cpu, source='')))} runs, each "
        "its own engine start); **the served simulator shows "
        + ("none**" if not sim_moved else f"{series(list(sim_moved))}**")
        + " (its intervals are wider than its spread, as the coverage table above says).",
        f"**On the H100 the tails moved less**: {n100['ttft_p99_ms']['groups']} levels measured in two windows, TTFT "
        f"p99 noise {n100['ttft_p99_ms']['noise']:.2f}, p90 {n100['ttft_p90_ms']['noise']:.2f}, "
        + ("none elsewhere" if set(moved100) <= {"ttft_p99_ms", "ttft_p90_ms"} else "some elsewhere")
        + f". Pooled with the H200's windows ({pooled['ttft_p99_ms']['groups']} levels) TTFT p99's noise is "
        f"{pooled['ttft_p99_ms']['noise']:.2f} and p90's {pooled['ttft_p90_ms']['noise']:.2f}. The product "
        + ("keeps the H200's larger values for every GPU (`GPU_WINDOW_NOISE`)" if kept else
           "no longer keeps the H200's values (`GPU_WINDOW_NOISE`)")
        + ": with them every H100 run's interval held the median live, and the H200 seed whose interval missed it "
        "holds it judged again (below)."])


def nightly_spread(h200: Path, h100: Path) -> str:
    """docs/nightly.md's sentence on how far one configuration's capacity moves between runs on a GPU."""
    said, widest, counts = [], 0.0, set()
    for name, folder in (("H200", h200), ("H100", h100)):
        s = capacity_spread(runs(folder))
        counts.add(s["runs"])
        widest = max(widest, s["spread"])
        said.append(f"{s['min']:.1f}–{s['max']:.1f} req/s on an {name} (±{s['spread']:.0%} from its median)")
    each = f"{count_word(counts.pop())} runs each" if len(counts) == 1 else "its runs"
    return paragraph(f"One configuration's capacity spread {series(said)} across {each} "
                     "([benchmarks.md](benchmarks.md#repeatability-one-configuration-measured-again-and-again)): a "
                     + ("fixed 10% threshold flags noise, and misses nothing the intervals would not catch."
                        if widest > 0.10 else "fixed 10% threshold sits just outside that noise."))
