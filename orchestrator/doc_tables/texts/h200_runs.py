"""docs/benchmarks.md's prose on the H200 runs: ingress, the interactive SLO, fp8 KV, multi-turn.

Each function takes the dataset folders its block names and returns the block's markdown; the
claims (met, do not overlap, the right order) are decided here from the numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, count_word, paragraph, series, span
from orchestrator.doc_tables.h200 import initial_point, interval, journal_trials, param, ran, short_id, trials_of
from orchestrator.doc_tables.texts.common import gpu_name, run_id, stop_story, versions
from orchestrator.doc_tables.trained import probe_answers
from orchestrator.results.definition import read_study_definition
from orchestrator.results.levels import load_levels
from orchestrator.results.paired import compare


# ---------------------------------------------------------------- ingress
def _ingress(folder: str | Path) -> dict[str, dict]:
    """``{mode: {"deploy_s": s, "40": run, "inf": run}}`` of ``benchmarks/ingress_overhead.py``'s files."""
    out = {}
    for f in sorted(Path(folder).glob("ingress_*.json")):
        r = json.loads(f.read_text())
        out[r["mode"]] = {"deploy_s": r["deploy_s"], **{run["rate"]: run for run in r["runs"]}}
    return out


def ingress_targets(folder: str | Path) -> str:
    """The `engine` ingress against its targets (saturated throughput, TTFT p50, TPOT p50 vs bare)."""
    r = _ingress(folder)
    bare, eng = r["bare"], r["engine"]
    sat = eng["inf"]["request_throughput"] / bare["inf"]["request_throughput"]
    dttft = eng["40"]["median_ttft_ms"] - bare["40"]["median_ttft_ms"]
    dtpot = eng["40"]["median_tpot_ms"] / bare["40"]["median_tpot_ms"] - 1
    targets = [(sat >= 0.95, f"saturated throughput >= 95% of bare ({sat:.0%})"),
               (dttft <= 10, f"TTFT p50 at 40 req/s <= bare + 10 ms ({dttft:+.0f} ms)"),
               (abs(dtpot) <= 0.05, f"TPOT p50 within 5% ({dtpot:+.1%})")]
    missed = [t for ok, t in targets if not ok]
    head = ("Targets for the `engine` ingress, all met: " if not missed else
            f"Targets for the `engine` ingress ({len(missed)} missed): ")
    p99 = bare["40"]["p99_ttft_ms"], eng["40"]["p99_ttft_ms"]
    higher = "bare's p99 TTFT is higher than engine's here" if p99[0] > p99[1] else "engine's p99 TTFT is higher here"
    return paragraph(head + ", ".join(t for _, t in targets) + ".",
                     f"Run-to-run noise of single loads is of the same order ({higher}), so read the engine rows as "
                     "\"the same as bare\"." if not missed else "")


def ingress_findings(folder: str | Path) -> str:
    r = _ingress(folder)
    bare, eng, llm = r["bare"], r["engine"], r["serve_llm"]
    bench = json.loads((Path(folder) / f"engine_r40_s{eng['40']['seed']}.json").read_text())  # vllm bench serve's own
    per_request = [bench[k] / bench["completed"] for k in ("total_input_tokens", "total_output_tokens")]
    shape = "/".join(f"{x:.0f}" for x in per_request)
    kept_up = llm["40"]["request_throughput"] >= 0.95 * bare["40"]["request_throughput"]
    sat = [bare["inf"]["request_throughput"], eng["inf"]["request_throughput"]]
    deploy = {m: r[m]["deploy_s"] for m in r}
    return bullets([
        "**Through `ray.serve.llm`'s ingress a trial measures the serving path, not the engine.** At 40 req/s it "
        + ("kept up" if kept_up else "could not keep up")
        + f" ({llm['40']['request_throughput']:.1f} req/s served; TTFT p50 {llm['40']['median_ttft_ms'] / 1000:.1f} s "
        f"against {bare['40']['median_ttft_ms']:.0f} ms bare), and saturated it served "
        f"{llm['inf']['request_throughput'] / bare['inf']['request_throughput']:.2f}x of bare `vllm serve`. Its ITL "
        "p50 "
        f"is {llm['40']['median_itl_ms']:.2f} ms (50 ms stream batching delivers chunks in bursts).",
        f"**The saturated engine serves {span(sat)} req/s of fresh {shape} prompts** (bare and `engine`).",
        f"The `engine` ingress deploys {'faster' if deploy['engine'] < deploy['bare'] else 'slower'} than bare here "
        f"({deploy['engine']:.0f} s against {deploy['bare']:.0f} s: bare paid the first torch.compile of the session; "
        f"the cache served the later ones) and {'faster' if deploy['engine'] < deploy['serve_llm'] else 'slower'} "
        f"than `serve_llm` ({deploy['serve_llm']:.0f} s: the ingress replicas and `ray.serve.llm`'s engine-config "
        "task)."])


def readme_engines(folder: str | Path, reference_dir: str | Path) -> str:
    """The README's paragraph on the engines: the `engine` ingress against bare `vllm serve`, and the GPU
    the simulator was calibrated on."""
    r = _ingress(folder)
    ratios = [r["engine"][rate]["request_throughput"] / r["bare"][rate]["request_throughput"] for rate in ("40", "inf")]
    matched = all(x >= 0.95 for x in ratios)
    gpu = gpu_name(trials_of(reference_dir))
    return paragraph(
        "Engines: `vllm` (real vLLM in a Serve replica: by default vLLM's own server, measured directly, which "
        + (f"matched bare `vllm serve` ({series([f'{x:.2f}x' for x in ratios])} its requests per second at 40 req/s "
           "and saturated, docs/benchmarks.md)" if matched else
           "served less than bare `vllm serve` (docs/benchmarks.md)")
        + "; or `ray.serve.llm`'s app, with its serving settings searchable), `sim` (a model of vLLM's V1 scheduler "
        f"and GPU cost, calibrated against real vLLM on an {gpu}, served in real time or run in virtual time), "
        "`external` (an endpoint that already runs).")


# ---------------------------------------------------------------- the interactive SLO
def _limits(study_dir: str | Path) -> dict[str, float]:
    return {c.metric: c.value for c in read_study_definition(str(study_dir)).constraints}


def _searched(study) -> dict:
    """The study's searched parameters (fixed ones left out), by name."""
    return {k: p for k, p in study.space.root.items() if p.type != "fixed"}


def interactive_run(study_dir: str | Path) -> str:
    trials = trials_of(study_dir)
    study = read_study_definition(str(study_dir))
    cap = study.capacity
    return paragraph(
        f"The study searched {' x '.join(f'`{k}`' for k in _searched(study))} with `search.fidelity: "
        f"{study.search.fidelity}`, vLLM's defaults as its first real trial; levels of {cap.level_duration_s:g} s, "
        f"at most {cap.max_windows} windows. One {gpu_name(trials)}, {versions(trials, 'vllm', 'ray')}, run "
        f"`{run_id(trials)}` in {count_word(len(list(Path(study_dir).glob('run*.log'))))} calls "
        f"({stop_story(study_dir)}):")


def _straddles(level: pd.Series, metric: str, limit: float) -> bool:
    lo, hi = level.get(f"{metric}_low"), level.get(f"{metric}_high")
    return not (pd.isna(lo) or pd.isna(hi)) and lo <= limit <= hi


def interactive_verdict(study_dir: str | Path) -> str:
    trials = trials_of(study_dir)
    levels = load_levels(study_dir)
    limits = _limits(study_dir)
    points = read_study_definition(str(study_dir)).search.initial_points
    is_default = trials.apply(lambda t: initial_point(t, points), axis=1)
    defaults = trials[is_default].iloc[0]
    tuned = trials[~is_default]
    best = tuned.sort_values("capacity_rps", ascending=False).iloc[0]
    other = tuned[tuned["trial_id"] != best["trial_id"]].iloc[0]
    apart = best["capacity_rps_low"] > defaults["capacity_rps_high"]
    after = list(tuned["trial_id"]).index(best["trial_id"]) + 1
    ordinal = {1: "the first", 2: "the second", 3: "the third"}.get(after, f"the {after}th")

    def knobs(t: pd.Series) -> str:
        return (f"`max_num_batched_tokens` {param('max_num_batched_tokens', t['max_num_batched_tokens'])} with "
                f"`max_num_seqs` {param('max_num_seqs', t['max_num_seqs'])}")

    lv_def = levels[levels["trial_id"] == defaults["trial_id"]].sort_values("rate")
    missed = lv_def[(lv_def["slo_met"] == False) & (lv_def["slo_decided"] == True)]  # noqa: E712
    itl, ttft = limits["itl_p99_ms"], limits["ttft_p99_ms"]
    itl_only = bool(len(missed)) and (missed["itl_p99_ms"] > itl).all() and (missed["ttft_p99_ms"] <= ttft).all()
    undecided_met = lv_def[(lv_def["slo_met"] == True) & (lv_def["slo_decided"] == False)]  # noqa: E712
    lv_other = levels[levels["trial_id"] == other["trial_id"]].sort_values("rate")
    none_decided = not lv_other["slo_decided"].fillna(False).astype(bool).any()
    each_straddles = all(_straddles(lv, "ttft_p99_ms", ttft) or _straddles(lv, "itl_p99_ms", itl)
                         for _, lv in lv_other.iterrows())
    tie = compare(other.to_dict(), best.to_dict(), "capacity_rps", "maximize")
    predicted = trials.set_index(trials["trial_id"].map(short_id))["predicted_capacity_rps"].round(1)
    measured = trials.set_index(trials["trial_id"].map(short_id))["capacity_rps"]
    right_order = all((predicted[a] < predicted[b]) == (measured[a] < measured[b])
                      for a in predicted.index for b in predicted.index if predicted[a] != predicted[b])
    by_value = {v: [k for k in predicted.index if predicted[k] == v] for v in sorted(set(predicted), reverse=True)}
    default_id = short_id(defaults["trial_id"])
    said = [f"{v:.1f} req/s for " + ("the defaults" if ids == [default_id] else
                                     "trials " + series(ids))
            for v, ids in by_value.items()]
    walls = trials["wall_time_s"]
    sentences = [
        f"**Verdict, as measured: {'a win beyond the noise' if apart else 'not a win beyond the noise'}.** "
        f"{knobs(best)} holds {interval(best, 'capacity_rps')} req/s within the SLOs; vLLM's defaults hold "
        f"{interval(defaults, 'capacity_rps')} req/s. The intervals {'do not overlap' if apart else 'overlap'}: "
        f"about {best['capacity_rps'] / defaults['capacity_rps']:.0f}x the defaults' capacity, from {ordinal} real "
        "trial after the defaults.",
        (f"Every level of the defaults decided missed failed on ITL p99 alone "
         f"({series([f'{v:.1f} ms at {r:g} req/s' for r, v in zip(missed['rate'], missed['itl_p99_ms'])])} against "
         f"{itl:g}), with TTFT p99 at most {missed['ttft_p99_ms'].max():.0f} ms against {ttft:g}"
         if itl_only else "Not every level of the defaults decided missed failed on ITL p99 alone")
        + (f"; at {undecided_met['rate'].iloc[-1]:.1f} req/s ITL p99 read "
           f"{undecided_met['itl_p99_ms'].iloc[-1]:.1f} ms, under the limit but not decided at 90%."
           if len(undecided_met) else "."),
        f"With {param('max_num_seqs', other['max_num_seqs'])} sequences (trial {short_id(other['trial_id'])}) the "
        f"same budget gave {interval(other, 'capacity_rps')} req/s: "
        + (f"none of its {len(lv_other)} levels was decided at 90% (at each rate it tried, "
           f"{span(lv_other['rate'], '.1f')} req/s, the interval of TTFT p99 ({span(lv_other['ttft_p99_ms'])} ms "
           f"against {ttft:g}) or of ITL p99 ({span(lv_other['itl_p99_ms'], '.1f')} ms against {itl:g}) held its "
           "limit), so the tuner says it does not know"
           if none_decided and each_straddles else "some of its levels were decided")
        + (f", and it is {tie.verdict} with the winner." if tie is not None else "."),
        f"The simulator predicted {series(said)}: "
        + ("the right order, not the right sizes." if right_order else "not the right order."),
        f"Trial walls {span(walls)} s, of which about {trials['startup_s'].median():.0f} s engine start."]
    return paragraph(*sentences)


# ---------------------------------------------------------------- fp8 KV cache
def kv_fp8_run(study_dir: str | Path) -> str:
    trials = trials_of(study_dir)
    levels = load_levels(study_dir)
    from_calls = [c for c in (Path(study_dir) / f for f in ("run1.log", "run2.log")) if c.exists()]
    seconds = [int(line.split(" in ")[1].split()[0]) for c in from_calls for line in c.read_text().splitlines()
               if line.startswith("run ") and " trial(s) in " in line]
    rates = [f"{r:g}" for r in levels.sort_values("level").drop_duplicates("level")["rate"]]
    later = sorted({f"{r:.1f}".rstrip("0").rstrip(".") for r in levels.loc[levels["level"] >= 2, "rate"]},
                   key=float, reverse=True)
    cap = trials["capacity_rps"].iloc[0]
    same = trials["capacity_rps"].nunique() == 1
    return paragraph(
        f"One {gpu_name(trials)}, {versions(trials, 'vllm', 'ray')}, run `{run_id(trials)}` "
        f"(`results/examples/{Path(study_dir).name}`: trials, levels, probe answers; trial walls "
        f"{series([f'{w:.1f}' for w in trials['wall_time_s']])} s; the {count_word(len(seconds))} `orchestrator run` "
        f"calls took {series([str(s) for s in seconds])} s). Capacity levels {series(rates[:2])} and then "
        f"{' / '.join(later)} req/s; TTFT and TPOT at the {cap:g} req/s level"
        + (" (the capacity level):" if same else ":"))


def kv_fp8_findings(study_dir: str | Path) -> str:
    trials = trials_of(study_dir).set_index("kv_cache_dtype")
    levels = load_levels(study_dir)
    auto, fp8 = trials.loc["auto"], trials.loc["fp8"]

    def at(t: pd.Series, rate: float) -> pd.Series:
        lv = levels[(levels["trial_id"] == t["trial_id"]) & levels["rate"].apply(lambda r: math.isclose(r, rate))]
        return lv.iloc[0]

    hi = 60.0
    a60, f60 = at(auto, hi), at(fp8, hi)
    missed = levels[levels["slo_met"] == False]["rate"]  # noqa: E712
    same_cap = auto["capacity_rps"] == fp8["capacity_rps"]
    reference, answers = probe_answers(study_dir)
    got = answers[fp8["trial_id"]]
    identical = sum(a.logprobs == b.logprobs for a, b in zip(reference, got))
    diff = max(max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) for a, b in zip(reference, got))
    chosen = {round(lp, 2) for a in reference for lp in a.logprobs}
    flat = f"every chosen token's logprob is {chosen.pop():.2f} = -ln 128,256" if len(chosen) == 1 else \
        "the chosen tokens' logprobs are nearly equal"
    return bullets([
        f"**Speed.** fp8 KV {'doubles' if 1.9 < fp8['kv_cache_tokens'] / auto['kv_cache_tokens'] < 2.1 else 'changes'} "
        f"the KV cache ({fp8['kv_cache_tokens'] / 1e6:.2f} M tokens against {auto['kv_cache_tokens'] / 1e6:.2f} M) and "
        + ("changes nothing this workload can use: with ~600-token requests, 0.9 M tokens already hold every request "
           f"the engine can run, so capacity is the same ({auto['capacity_rps']:g} req/s met the SLOs, "
           f"{span(missed, '.1f')} did not, for both)" if same_cap else "changes the capacity")
        + f", and fp8 is {'slightly slower' if fp8['tpot_p50_ms'] > auto['tpot_p50_ms'] else 'no slower'} per token "
        f"(TPOT {fp8['tpot_p50_ms'] / auto['tpot_p50_ms'] - 1:+.1%} at {auto['capacity_rps']:g} req/s, "
        f"{f60['tpot_p50_ms'] / a60['tpot_p50_ms'] - 1:+.0%} at {hi:g}; TTFT p99 "
        f"{fp8['ttft_p99_ms'] / auto['ttft_p99_ms'] - 1:+.0%} at {auto['capacity_rps']:g} req/s): the KV is quantized "
        "on write and read back through fp8 attention. The capacity search's steps (x1.5, 10% tolerance) are coarser "
        "than the difference; the search of the capacity study above found the same: fp8 configurations there were "
        "no faster.",
        "**Agreement.** On dummy weights the probe cannot tell the two apart, and this is a property of the weights, "
        "not of fp8: vLLM's dummy loader draws every weight uniformly from +-0.001, so the next-token distribution is "
        f"almost flat ({flat}) and the greedy tokens fall into short cycles that a small change in attention does not "
        f"move. {identical} of the {len(reference)} answers are bit-identical in their logprobs, the other "
        f"{count_word(len(reference) - identical)} differ by at most {diff:.1e}. The rows say `probe_reference: "
        "dummy`. With a real checkpoint (`engine.model_source`), the same study measures real drift; on the CPU "
        "below, a random model with larger weights shows that the probe does see a change of numerics."])


# ---------------------------------------------------------------- multi-turn sessions
# What the simulator predicted for the study's points before the GPU run (the same file with
# `engine: {kind: sim, mode: virtual}`), as `orchestrator run` printed it; not stored in the dataset.
# (enable_prefix_caching, max_num_seqs) -> (session goodput sessions/s, TTFT p99 ms)
SIM_PREDICTED = {(True, 256): (3.74, 116.0), (False, 256): (2.85, 803.0), (False, 32): (0.10, 6571.0),
                 (True, 32): (1.38, 1651.0)}


def multiturn_intro(study_dir: str | Path) -> str:
    trials = trials_of(study_dir)
    first = next(t for _, t in trials.iterrows() if ran(t))
    n_turns = sum(t["requests"] for t in json.loads(first["extra_json"])["turns"])
    study = read_study_definition(str(study_dir))
    w = study.workload
    arrival, offered = w.arrival, w.num_requests  # sessions, for a session workload
    searched = _searched(study)
    limits = {c.metric: c for c in study.constraints}
    fixed = {k: p.value for k, p in study.space.root.items() if p.type == "fixed"}
    names = {"ttft_p99_ms": "p99 TTFT", "tpot_p50_ms": "TPOT p50"}
    return paragraph(
        f"Chat sessions of {w.sessions.turns.min} to {w.sessions.turns.max} turns, each turn resending the "
        f"conversation so far plus a new user message ({w.input_len.kind}, mean {w.input_len.mean:g} tokens; answers "
        f"mean {w.output_len.mean:g}), {w.sessions.think_time_ms.mean / 1000:g} s of thinking "
        f"({w.sessions.think_time_ms.kind}) "
        f"between an answer and the next turn, {w.shared_prefix.groups} system prompts of {w.shared_prefix.length} "
        "tokens: "
        f"the multi-turn workload of docs/workloads.md. Sessions arrive at {arrival.rate:g} a second for "
        f"{offered / arrival.rate:g} s ({offered} sessions); those whose first turn falls in the first {w.warmup_s:g} "
        "s "
        f"are left out, so {first['sessions']:.0f} sessions ({n_turns} turns, {first['turns_per_session_mean']:.2f} a "
        "session) are measured in every trial, each turn against "
        + " and ".join(f"{names.get(m, m)} {c.op} {c.value:g} ms" for m, c in limits.items())
        + f". A {' x '.join(str(len(p.choices)) for p in searched.values())} grid over "
        + " x ".join(f"`{k}`" for k in searched)
        + f" ({', '.join(str(c) for c in sorted(searched['max_num_seqs'].choices))}), the prefix cache's two points "
        f"first (`initial_points`). Llama-3.1-8B shape, dummy weights, bf16, `max_model_len` {fixed['max_model_len']}, "
        f"{versions(trials, 'vllm', 'ray')}, one {gpu_name(trials)}, run `{run_id(trials)}` in "
        f"{count_word(len(list(Path(study_dir).glob('run*.log'))))} calls:")


def multiturn_findings(study_dir: str | Path) -> str:
    rows = {(bool(t["enable_prefix_caching"]), int(t["max_num_seqs"])): t
            for _, t in trials_of(study_dir).iterrows() if ran(t)}
    on, off, few = rows[(True, 256)], rows[(False, 256)], rows[(False, 32)]
    turns = {k: {r["turn"]: r for r in json.loads(t["extra_json"])["turns"]} for k, t in rows.items()}
    on_turns = turns[(True, 256)]
    later = [on_turns[i]["ttft_p50_ms"] for i in sorted(on_turns) if i > 1]
    prompts = [on_turns[i]["prompt_tokens_mean"] for i in sorted(on_turns)]
    measured_keys = list(rows)
    rank = lambda values: sorted(measured_keys, key=lambda k: -values[k])  # noqa: E731
    same_rank = rank({k: SIM_PREDICTED[k][0] for k in measured_keys}) == rank(
        {k: rows[k]["session_goodput"] for k in measured_keys})
    missing = [k for k in SIM_PREDICTED if k not in rows]
    pct = lambda t: f"{100 * t['session_slo_attainment']:.0f}%"  # noqa: E731
    durations = [t["duration_s"] for t in rows.values()]
    return bullets([
        f"**The prefix cache is what makes later turns cheap.** With it, a turn's TTFT stays flat (p50 "
        f"{on_turns[1]['ttft_p50_ms']:.0f} ms on turn 1, {span(later)} ms on turns 2–{max(on_turns)}, while the "
        f"prompt grows from {prompts[0]:,.0f} to {prompts[-1]:,.0f} tokens): the engine's hit rate, "
        f"{on['prefix_cache_hit_rate']:.2f}, is what the sessions share ({on['expected_prefix_hit_rate']:.2f}: each "
        "turn's previous prompt, in whole blocks). Without it every turn prefills its whole history again: TTFT p99 "
        f"of later turns {off['ttft_p99_ms_later_turns']:.0f} ms against {on['ttft_p99_ms_later_turns']:.0f}, TPOT "
        f"p50 {off['tpot_p50_ms']:.1f} ms against {on['tpot_p50_ms']:.1f} (decode steps carry the recomputed "
        f"prefill), and {off['num_requests_running_peak']:.0f} requests running at the peak against "
        f"{on['num_requests_running_peak']:.0f}, since each turn takes longer. Both still pass at this rate "
        f"({pct(on)} and {pct(off)} of sessions meet the SLOs): the cache buys latency headroom here, and capacity "
        "beyond it.",
        f"**`max_num_seqs` {few['max_num_seqs']:.0f} breaks the workload.** Without the cache and with "
        f"{few['max_num_seqs']:.0f} sequences, turns queue for a slot: TTFT p50 "
        f"{few['ttft_p50_ms_first_turn'] / 1000:.1f} s on first turns and {few['ttft_p50_ms_later_turns'] / 1000:.1f} "
        "s "
        f"on later ones, {pct(few)} of sessions meet the SLOs."
        + (f" The peak running count sits at the cap ({few['num_requests_running_peak']:.0f})."
           if few["num_requests_running_peak"] == few["max_num_seqs"] else ""),
        f"**The simulator ranked them {'the same way' if same_rank else 'differently'} before the run** (the same file "
        "with `engine: {kind: sim, mode: virtual}`, calibrated to the H200 in docs/simulator.md): session goodput "
        f"{series([f'{SIM_PREDICTED[k][0]:.2f}' for k in measured_keys])} sessions/s and TTFT p99 "
        f"{series([f'{SIM_PREDICTED[k][1]:,.0f}' for k in measured_keys])} ms for the "
        f"{count_word(len(measured_keys))} points, against "
        f"{series([format(rows[k]['session_goodput'], '.2f') for k in measured_keys])} and "
        f"{series([format(rows[k]['ttft_p99_ms'], ',.0f') for k in measured_keys])} ms measured"
        + "".join(f"; for the unmeasured point (prefix cache {'on' if k[0] else 'off'}, {k[1]} sequences) it predicts "
                  f"{SIM_PREDICTED[k][0]:.2f} sessions/s at TTFT p99 {SIM_PREDICTED[k][1]:,.0f} ms" for k in missing)
        + ".",
        "Session goodput counts the sessions whose every turn met the SLOs over the load window (`duration_s`: "
        f"until the last measured turn ended, {span(durations)} s), so it reads below the "
        f"{read_study_definition(str(study_dir)).workload.arrival.rate:g} sessions a second sent; \"sessions meeting "
        "the SLOs\" is the share."])


def multiturn_measured(study_dir: str | Path) -> str:
    """How many of the grid's points were measured (the rest: the device time ran out)."""
    trials = trials_of(study_dir)
    measured = int(trials.apply(ran, axis=1).sum())
    running = [n for n, t in journal_trials(study_dir).items() if t.state.name == "RUNNING"]
    study = read_study_definition(str(study_dir))
    grid = math.prod(len(p.choices) for p in _searched(study).values())
    return paragraph(f"{count_word(measured).capitalize()} of the {count_word(grid)} points were measured"
                     + (f"; the device time ran out during the next (trial {running[0]:04d}), which the journal "
                        "leaves running and the same command resumes." if measured < grid and running else "."))


__all__ = ["SIM_PREDICTED", "ingress_findings", "ingress_targets", "interactive_run", "interactive_verdict",
           "kv_fp8_findings", "kv_fp8_run", "multiturn_findings", "multiturn_intro", "multiturn_measured"]
