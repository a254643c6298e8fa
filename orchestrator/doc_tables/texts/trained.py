"""The prose on the learned-weights studies on one H100 (docs/benchmarks.md, docs/trained-models.md).

The datasets: ``results/examples/trained-base-quant-h100`` and ``trained-base-spec-h100`` (trials,
levels, probe answers, the trainings' ``*training.json``, ``run.log`` and ``determinism.txt``). The
probe figures are recomputed from the stored answers by the product's own ``compare``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, count_word, paragraph, series, span
from orchestrator.doc_tables.h200 import missing, trials_of
from orchestrator.doc_tables.texts.common import gpu_name, run_id, versions
from orchestrator.doc_tables.trained import probe_answers
from orchestrator.results.levels import load_levels
from orchestrator.trial.probe import compare

_TRAINED = re.compile(r"trained (\w+) \(([0-9.]+) M parameters, (\w+)\) in ([0-9.]+) s .*?held-out perplexity "
                      r"([0-9.]+)")
_RUN = re.compile(r"^run (\S+): (\d+) trial\(s\) in (\d+) s", re.MULTILINE)
_HASH = re.compile(r"^([0-9a-f]{64})\s+\S+/(model(?:-again)?)/model\.safetensors$", re.MULTILINE)
_BENCH = "benchmarks.md#learned-weights-on-one-h100-fp8-and-speculative-decoding-with-their-quality-cost"
_CAPACITY = re.compile(r"\] (\S+) completed\s+num_speculative_tokens=(\d+).*\n\s+capacity_rps=([0-9.]+)")


def _training(folder: Path, name: str) -> dict:
    return json.loads((Path(folder) / f"{name}-training.json").read_text())


def _trainings(folder: Path) -> list[tuple[str, float, str, float, float]]:
    """(recipe, M parameters, device, seconds, held-out perplexity) of every training its run.log reports."""
    return [(m.group(1), float(m.group(2)), m.group(3), float(m.group(4)), float(m.group(5)))
            for m in _TRAINED.finditer((Path(folder) / "run.log").read_text())]


def _hashes(folder: Path) -> dict[str, str]:
    """The weights' sha256 of each training a folder records (``run.log`` or ``determinism.txt``)."""
    text = "\n".join(p.read_text() for p in (Path(folder) / "run.log", Path(folder) / "determinism.txt") if p.exists())
    return {m.group(2): m.group(1) for m in _HASH.finditer(text)}


def _runs(folder: Path) -> list[tuple[str, int, int]]:
    text = (Path(folder) / "run.log").read_text()
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in _RUN.finditer(text)]


def _probe(folder: Path) -> tuple[pd.DataFrame, list, dict]:
    trials = trials_of(folder)
    reference, answers = probe_answers(folder)
    return trials, reference, answers


def _first_divergences(reference: list, got: list) -> list[float]:
    """The baseline's chosen-token logprob at each diverging answer's first divergence."""
    out = []
    for a, b in zip(reference, got):
        d = next((j for j, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)
        if d is not None and a.logprobs and d < len(a.logprobs):
            out.append(a.logprobs[d])
    return out


def _diverged(reference: list, got: list) -> int:
    return sum(a.tokens != b.tokens for a, b in zip(reference, got))


# ---------------------------------------------------------------- docs/benchmarks.md
def trained_runs(quant: Path, spec: Path) -> str:
    q, s = trials_of(quant), trials_of(spec)
    qt, st = _training(quant, "model"), _training(spec, "model")
    again = _training(spec, "model-again")
    torch = qt["versions"]["torch"].replace("+", " ")
    return paragraph(
        f"Two runs of the script on one {gpu_name(q)} (the machine lent; the study files name the GPU the script "
        f"finds), {versions(q, 'vllm', 'ray')}, torch {torch}, each training its own `base` model:") + "\n" + bullets([
        f"`{run_id(q)}` (the quantization study, {_runs(quant)[0][1]} trials in {_runs(quant)[0][2]} s): "
        f"`results/examples/{Path(quant).name}`, with `run.log` and the model's `training.json` (trained in "
        f"{qt['seconds']:.1f} s, held-out perplexity {qt['heldout_perplexity']:.3f}, fused attention kernels).",
        f"`{run_id(s)}` (the speculation study, {_runs(spec)[0][1]} trials in {_runs(spec)[0][2]} s): "
        f"`results/examples/{Path(spec).name}`, with `run.log`, `determinism.txt` and the `training.json` of both "
        f"trainings of the model ({st['seconds']:.1f} and {again['seconds']:.1f} s, held-out perplexity "
        f"{series(list(dict.fromkeys(format(t['heldout_perplexity'], '.3f') for t in (st, again))))}, "
        "attention through the math kernel) and of the draft model."])


def quantization_findings(quant: Path) -> str:
    trials, reference, answers = _probe(quant)
    base = trials[trials["trial_id"] == trials["probe_baseline"]].iloc[0]
    same_cfg = trials[(trials["quantization"].isna()) & (trials["kv_cache_dtype"] == "auto")
                      & (trials["trial_id"] != base["trial_id"])].iloc[0]
    floor = compare(reference, answers[same_cfg["trial_id"]])
    fp8 = trials[(trials["quantization"] == "fp8") | (trials["kv_cache_dtype"] == "fp8")]
    label = {(True, False): "fp8 weights", (False, True): "the fp8 KV cache", (True, True): "both"}
    cols = {t["trial_id"]: compare(reference, answers[t["trial_id"]]) for _, t in fp8.iterrows()}
    which = lambda t: label[(t["quantization"] == "fp8", t["kv_cache_dtype"] == "fp8")]  # noqa: E731
    flips = [lp for t in fp8["trial_id"] for lp in _first_divergences(reference, answers[t])]
    gap = max(c["divergence_gap_max"] for c in cols.values())
    infeasible = (~fp8["feasible"].astype(bool)).all()
    levels = load_levels(quant)
    offered = levels["rate"].max()
    at_max = levels[levels["rate"] == offered].set_index("trial_id")["request_throughput"]
    alone = [at_max[t] for t in [base["trial_id"], *fp8[fp8.apply(lambda t: which(t) != "both", axis=1)]["trial_id"]]]
    both = fp8[fp8.apply(lambda t: which(t) == "both", axis=1)].iloc[0]
    kv = {"auto": base["kv_cache_tokens"],
          "fp8": trials.loc[trials["kv_cache_dtype"] == "fp8", "kv_cache_tokens"].max()}
    overlap = all(t["capacity_rps_low"] <= base["capacity_rps_high"]
                  and base["capacity_rps_low"] <= t["capacity_rps_high"]
                  for _, t in fp8.iterrows())
    ppl = {which(t): t["perplexity_delta"] for _, t in fp8.iterrows()}
    rel = {k: v / base["heldout_perplexity"] for k, v in ppl.items()}
    floor_ppl = abs(same_cfg["perplexity_delta"])
    return bullets([
        f"**The noise floor.** The baseline's configuration at `max_num_seqs` {same_cfg['max_num_seqs']:.0f} answers "
        + (f"all {len(reference)} prompts token for token as at {base['max_num_seqs']:.0f}"
           if _diverged(reference, answers[same_cfg["trial_id"]]) == 0 else
           f"{len(reference) - _diverged(reference, answers[same_cfg['trial_id']])} of {len(reference)} prompts as at "
           f"{base['max_num_seqs']:.0f}")
        + f": agreement {floor['token_agreement']:g}, a mean chosen-token drift of {floor['logprob_diff_mean']:.1e} "
        f"nats, and perplexities {floor_ppl:.4f} apart."
        + (" On this GPU a batch-size change does not flip this model's greedy tokens."
           if floor["token_agreement"] == 1 else ""),
        "**fp8 does, far above that floor.** "
        + series([(f"{which(t)} change{'s' if which(t) == 'both' else ''} "
                   f"{_diverged(reference, answers[t['trial_id']])} "
                   f"of the {len(reference)} answers (token agreement " if i == 0 else
                   f"{which(t)} {_diverged(reference, answers[t['trial_id']])} (") +
                  f"{cols[t['trial_id']]['token_agreement']:.3f})" for i, (_, t) in enumerate(fp8.iterrows())])
        + ". The guardrail `token_agreement >= 0.9` "
        + (f"makes all {count_word(len(fp8))} infeasible; the Pareto front is the baseline alone." if infeasible else
           "leaves some of them feasible."),
        "**Every one of those flips is a near-tie.** At each answer's first divergence, the baseline's chosen token "
        f"had a logprob between {min(flips):.2f} and {max(flips):.2f} (probability {math.exp(min(flips)):.2f} to "
        f"{math.exp(max(flips)):.2f}: the grammar offers two or more nearly equal successors there), and the two runs' "
        f"own chosen tokens are within {gap:.3f} nats of each other (`divergence_gap_max`): fp8 picks the other of two "
        "near-equal tokens. Once an answer takes the other branch it never returns, which is why agreement falls so "
        "far.",
        "**Perplexity hardly moves.** "
        + ", ".join(f"{k} {v:+.4f} ({rel[k]:+.2%})" for k, v in ppl.items())
        + f", against a floor of {floor_ppl:.4f}: on this model fp8 changes which of two near-equal tokens greedy "
        f"decoding takes in {span([_diverged(reference, answers[t]) for t in fp8['trial_id']], '.0f', ' to ')} of the "
        f"{len(reference)} answers, and leaves the model as good at its language to within "
        f"{max(abs(x) for x in rel.values()):.2%}. A guardrail on `token_agreement` asks \"the same answers\" "
        "(regression tests, caches of answers); one on `perplexity_delta` (say `<= 0.01 *` the baseline's perplexity) "
        f"asks \"the same quality\" and would accept all {count_word(len(fp8))} here.",
        f"**No speed-up to buy with it.** Every fp8 interval {'overlaps' if overlap else 'does not overlap'} the "
        f"baseline's ({'ties' if overlap else 'not ties'}). The baseline and each fp8 alone served {span(alone)} req/s "
        f"when offered {offered:g} (both fp8 together: {at_max[both['trial_id']]:.1f}), and fp8 KV "
        f"{'doubles' if 1.9 < kv['fp8'] / kv['auto'] < 2.1 else 'changes'} the cache ({kv['fp8'] / 1e6:.1f} M tokens "
        f"against {kv['auto'] / 1e6:.1f} M) while the baseline used at most {base['kv_cache_usage_peak']:.1%} of it: "
        "for "
        "a 100 M model neither weight bandwidth nor KV space limits capacity here, so fp8 has nothing to relieve. On a "
        "model whose weights or KV cache fill the GPU the same study measures the trade; on this one it measures the "
        "quality cost alone."])


def _spec_rows(spec: Path) -> tuple[pd.Series, pd.Series, pd.Series]:
    trials = trials_of(spec)
    off = trials[trials["num_speculative_tokens"].fillna(0) == 0].iloc[0]
    on = trials[trials["num_speculative_tokens"].fillna(0) > 0]
    ngram = on[on["speculative_model"].apply(missing)].iloc[0]
    draft = on[~on["speculative_model"].apply(missing)].iloc[0]
    return off, ngram, draft


def speculation_intro(spec: Path) -> str:
    draft = _training(spec, "draft")
    model = _training(spec, "model")
    off, ngram, draft_row = _spec_rows(spec)
    return paragraph(
        "A workload whose prompts copy earlier 16-token spans of themselves (`workload.repetition`: half of them), "
        f"`max_num_seqs` {off['max_num_seqs']:.0f}, {count_word(len(trials_of(spec)))} trials: no speculation (the "
        "probe's baseline), "
        f"{ngram['num_speculative_tokens']:.0f} tokens proposed by prompt lookup (n-gram, "
        f"{ngram['prompt_lookup_min']:.0f}..{ngram['prompt_lookup_max']:.0f}), and "
        f"{draft_row['num_speculative_tokens']:.0f} proposed by a draft model (the `{draft['recipe']['name']}` trained "
        f"recipe: {draft['params'] / 1e6:.1f} M parameters, the same tokenizer, trained on the "
        f"{draft['device'].upper()} "
        f"in {draft['seconds']:.1f} s, held-out perplexity {draft['heldout_perplexity']:.2f} against the target's "
        f"{model['heldout_perplexity']:.2f}).")


def speculation_findings(spec: Path, quant: Path) -> str:
    trials, reference, answers = _probe(spec)
    off, ngram, draft = _spec_rows(spec)
    c = {k: compare(reference, answers[t["trial_id"]]) for k, t in (("ngram", ngram), ("draft", draft))}
    floor = off["floor_token_agreement"], off["floor_logprob_diff_mean"], off["floor_divergence_gap_max"]
    above_floor = all(x["token_agreement"] > floor[0] for x in c.values())
    gaps = [x["divergence_gap_max"] for x in c.values()]
    levels = load_levels(spec)
    lv = {k: levels[levels["trial_id"] == t["trial_id"]].set_index("rate") for k, t in
          (("off", off), ("ngram", ngram), ("draft", draft))}
    low = min(levels["rate"])

    def iv(t: pd.Series, m: str, spec_: str) -> str:
        return f"{t[m]:{spec_}} [{t[m + '_low']:{spec_}}, {t[m + '_high']:{spec_}}]"

    def ties(a: pd.Series, b: pd.Series, m: str) -> bool:
        return a[m + "_low"] <= b[m + "_high"] and b[m + "_low"] <= a[m + "_high"]

    earlier = [(m.group(2), float(m.group(3))) for m in _CAPACITY.finditer((Path(quant) / "run.log").read_text())]
    slower = not ties(draft, off, "tpot_p50_ms") and draft["tpot_p50_ms"] > off["tpot_p50_ms"]
    every = all(lv["draft"].loc[r, "tpot_p50_ms"] > lv["off"].loc[r, "tpot_p50_ms"]
                for r in lv["draft"].index if r in lv["off"].index)
    shared = [r for r in lv["draft"].index if r in lv["off"].index and lv["draft"].loc[r, "slo_met"]]
    met_undecided = lv["draft"][(lv["draft"]["slo_met"] == True) & (lv["draft"]["slo_decided"] != True)]  # noqa: E712
    decided_met = lv["draft"][(lv["draft"]["slo_met"] == True) & (lv["draft"]["slo_decided"] == True)]  # noqa: E712
    return bullets([
        "**The noise floor.** The probe answers the baseline's prompts twice, the second time in another batch "
        f"composition (`floor_*` columns): on this model and GPU greedy decoding agrees with itself on {floor[0]:.3f} "
        "of "
        f"the tokens, with a mean chosen-token drift of {floor[1]:.4f} nats and near-ties up to {floor[2]:.3f} nats "
        "apart "
        "(`floor_divergence_gap_max`). The run says so: `token_agreement >= 0.9` \"asks for more agreement than the "
        f"baseline has with itself ({floor[0]:.3f}): numerics alone can fail it\"." if floor[0] < 0.9 else
        f"**The noise floor.** Greedy decoding agrees with itself on {floor[0]:.3f} of the tokens.",
        f"**Greedy answers: {'the same, up to the floor' if above_floor else 'not the same'}.** Both kinds of "
        f"speculation agree with the baseline {'more' if above_floor else 'less'} than the baseline agrees with itself "
        f"({c['ngram']['token_agreement']:.3f} and {c['draft']['token_agreement']:.3f}), and every answer that "
        "diverges "
        f"does so at a near-tie (`divergence_gap_max` {series(sorted({f'{g:.3f}' for g in gaps}))}"
        f"{' for both' if len({f'{g:.3f}' for g in gaps}) == 1 else ''}, the floor's {floor[2]:.3f}): the verification "
        "pass scores several tokens per sequence at once, a different kernel shape, which moves the last bits of a "
        "logit. vLLM states the same bound (speculative decoding is lossless up to the precision of the hardware's "
        "numerics). A speculation bug, a proposed token accepted where the model preferred another, would show as a "
        f"large gap; none does. Perplexity: {ngram['perplexity_delta']:+.4f} and {draft['perplexity_delta']:+.4f}.",
        f"**n-gram: accepted almost always, proposed rarely, and a tie.** {ngram['engine_spec_acceptance_rate']:.1%} "
        "of "
        f"proposed tokens are accepted ({ngram['engine_spec_accepted_per_draft']:.2f} of "
        f"{ngram['num_speculative_tokens']:.0f} per draft), but only {ngram['engine_spec_token_share']:.0%} of the "
        "output "
        "tokens came from proposals: the lookup proposes only where the text so far repeats. Capacity "
        f"{iv(ngram, 'capacity_rps', '.3g')} against {iv(off, 'capacity_rps', '.3g')} req/s and TPOT p50 at capacity "
        f"{iv(ngram, 'tpot_p50_ms', '.2f')} against {iv(off, 'tpot_p50_ms', '.2f')} ms: "
        + ("ties" if ties(ngram, off, "capacity_rps") and ties(ngram, off, "tpot_p50_ms") else "not ties")
        + f". At the lightest level ({low:g} req/s) TPOT p50 was {lv['ngram'].loc[low, 'tpot_p50_ms']:.2f} ms with the "
        f"lookup and {lv['off'].loc[low, 'tpot_p50_ms']:.2f} ms without"
        + (f" (the earlier run of the same two settings on another training of the model measured capacities "
           f"{series([f'{v:.1f}' for _, v in earlier])} req/s)" if earlier else "")
        + ". A 100 M model's decode step is a few milliseconds of mostly fixed cost, not the weight reads that "
        "speculation amortises.",
        f"**The draft model is {'slower, measured' if slower else 'not measurably slower'}.** The "
        f"{_training(spec, 'draft')['params'] / 1e6:.1f} M draft predicts the "
        f"{_training(spec, 'model')['params'] / 1e6:.1f} "
        f"M target poorly: {draft['engine_spec_acceptance_rate']:.1%} of its proposals are accepted "
        f"({draft['engine_spec_accepted_per_draft']:.2f} of {draft['num_speculative_tokens']:.0f} per draft), which "
        f"still makes {draft['engine_spec_token_share']:.0%} of the output tokens, yet each step now runs the draft "
        f"several times and verifies the proposals. TPOT p50 at capacity {iv(draft, 'tpot_p50_ms', '.2f')} ms against "
        f"{iv(off, 'tpot_p50_ms', '.2f')}: the intervals {'do not meet' if slower else 'meet'}"
        + (", so this is a measured slow-down" if slower else "")
        + (", at every level" if every else "") + " ("
        + ", ".join(f"{lv['draft'].loc[r, 'tpot_p50_ms']:.2f} against {lv['off'].loc[r, 'tpot_p50_ms']:.2f} ms "
                    f"at {r:g} "
                    "req/s" for r in shared)
        + f"). Its capacity, {iv(draft, 'capacity_rps', '.3g')} req/s, is a tie by interval: its levels at "
        f"{series([f'{r:g}' for r in met_undecided.index])} req/s met the SLO (p99 TTFT "
        f"{series([f'{v:.0f}' for v in met_undecided['ttft_p99_ms']])} ms against 500) but too close to the limit for "
        f"their windows to decide it, so the interval runs down to {decided_met.index.max():g} req/s, the last level "
        "decided.",
        f"**So the tuner's verdict** on this model and GPU: n-gram speculation is a tie on speed with no quality cost "
        f"beyond the floor; the draft model costs {draft['tpot_p50_ms'] / off['tpot_p50_ms'] - 1:.0%} in TPOT for "
        "nothing. Both keep `token_agreement >= 0.9`; the guardrail that matches this floor would sit below "
        f"{floor[0]:.3f}."])


def training_twice(spec: Path, quant: Path) -> str:
    h = _hashes(spec)
    first, again = _training(spec, "model"), _training(spec, "model-again")
    same = h.get("model") == h.get("model-again")
    earlier = _hashes(quant)
    fused = [t for t in _trainings(quant) if t[0] == "base"]
    slower = (first["seconds"] + again["seconds"]) / sum(t[3] for t in fused) - 1
    clean = not first.get("determinism_warnings") and not again.get("determinism_warnings")
    return paragraph(
        "The script trains the recipe a second time on the same GPU and compares the weights' bytes. With attention "
        "through the math kernel on CUDA (the fused kernels' backward passes accumulate with atomics), the two "
        f"trainings of run `{run_id(trials_of(spec))}` wrote {'the same bytes' if same else 'different bytes'} (sha256 "
        f"`{h['model'][:8]}...`{' both' if same else ' and `' + h['model-again'][:8] + '...`'}, `determinism.txt`), in "
        f"{first['seconds']:.1f} and {again['seconds']:.1f} s, and torch reported "
        + ("no non-deterministic operation (`determinism_warnings: []` in both `training.json`)." if clean else
           "non-deterministic operations.")
        + f" Before that change, the run of {trials_of(quant)['started_at'].min():%Y-%m-%d} (fused attention) wrote "
        + ("different" if earlier.get("model") != earlier.get("model-again") else "the same")
        + f" bytes (`{earlier['model'][:8]}...` and `{earlier['model-again'][:8]}...`, held-out perplexity "
        f"{series([f'{t[4]:.3f}' for t in fused])}) in {series([f'{t[3]:.1f}' for t in fused])} s: determinism costs "
        f"about {slower:.0%} more training time here, "
        f"{'within' if max(first['seconds'], again['seconds']) <= 300 else 'beyond'} the 5-minute bound. On CPU the "
        "same recipe writes the same bytes (the test trains twice).")


# ---------------------------------------------------------------- docs/trained-models.md
def models_gpu_training(quant: Path, spec: Path) -> str:
    q, s, again = _training(quant, "model"), _training(spec, "model"), _training(spec, "model-again")
    fused = [t for t in _trainings(quant) if t[0] == "base"]
    gpu = gpu_name(trials_of(quant))
    h = _hashes(spec)
    torch = q["versions"]["torch"].split("+")
    return paragraph(
        f"The `base` recipe on a GPU (torch {torch[0]} {torch[1] if len(torch) > 1 else ''}, bf16 autocast; "
        "`bash benchmarks/trained_gpu.sh RESULTS train`, which runs `orchestrator make-model tiny-llama RESULTS/model "
        f"--weights trained --recipe base`): {q['params']:,} parameters, {q['steps']} steps, "
        f"{q['train_tokens'] / 1e6:.1f} M training tokens, loss {q['loss_first']:.2f} to {q['loss_last']:.2f}; "
        f"**{series([f'{t[3]:.1f} s' for t in fused])}** wall in {count_word(len(fused))} runs on one {gpu}; "
        f"**held-out perplexity {series([f'{t[4]:.3f}' for t in fused])}** (a flat model: {q['uniform_perplexity']}). "
        f"Those {count_word(len(fused))} runs wrote different bytes: the fused attention kernels' backward passes "
        "accumulate with atomics. Training on CUDA now runs attention through the math kernel, sets "
        "`CUBLAS_WORKSPACE_CONFIG`, and records in `training.json` every operation torch reported as "
        "non-deterministic (`determinism_warnings`; empty on CPU). Measured on one "
        f"{gpu_name(trials_of(spec))} (`trained_gpu.sh RESULTS train,again` trains twice and compares the hashes): "
        f"**{'the same bytes twice' if h['model'] == h['model-again'] else 'different bytes'}** (sha256 "
        f"`{h['model'][:8]}...`), "
        + ("no operation reported" if not s.get("determinism_warnings") and not again.get("determinism_warnings")
           else "operations reported")
        + f", **{s['seconds']:.1f} s and {again['seconds']:.1f} s** wall, held-out perplexity "
        f"{s['heldout_perplexity']:.3f}: about {(s['seconds'] + again['seconds']) / sum(t[3] for t in fused) - 1:.0%} "
        "slower than the fused kernels, within the 5-minute bound (docs/benchmarks.md, \"Training on the GPU\").")


def models_gpu_floor(quant: Path, spec: Path) -> str:
    q, reference, answers = _probe(quant)
    base = q[q["trial_id"] == q["probe_baseline"]].iloc[0]
    same_cfg = q[(q["quantization"].isna()) & (q["kv_cache_dtype"] == "auto")
                 & (q["trial_id"] != base["trial_id"])].iloc[0]
    floor = compare(reference, answers[same_cfg["trial_id"]])
    off = _spec_rows(spec)[0]
    return bullets([
        f"On one {gpu_name(q)} one training of the `base` model read agreement {floor['token_agreement']:g} and drift "
        f"{floor['logprob_diff_mean']:.1e} at `max_num_seqs` {same_cfg['max_num_seqs']:.0f} against "
        f"{base['max_num_seqs']:.0f}, and another (the speculation study's) read a recorded floor of "
        f"{off['floor_token_agreement']:.3f} agreement, drift {off['floor_logprob_diff_mean']:.4f} and near-ties up to "
        f"{off['floor_divergence_gap_max']:.3f} nats apart: the floor is the model's and the GPU's, measured per study "
        f"([benchmarks.md]({_BENCH}))."], "*")


def models_gpu_guardrail(quant: Path) -> str:
    q, reference, answers = _probe(quant)
    fp8 = q[(q["quantization"] == "fp8") | (q["kv_cache_dtype"] == "fp8")]
    agree = [compare(reference, answers[t])["token_agreement"] for t in fp8["trial_id"]]
    flipped = [_diverged(reference, answers[t]) for t in fp8["trial_id"]]
    gaps = [compare(reference, answers[t])["divergence_gap_max"] for t in fp8["trial_id"]]
    base_ppl = q.loc[q["trial_id"] == q["probe_baseline"], "heldout_perplexity"].iloc[0]
    moved = fp8["perplexity_delta"].abs().max() / base_ppl
    return bullets([
        f"On the {gpu_name(q)}, fp8 weights and an fp8 KV cache changed {span(flipped, '.0f', ' to ')} of the "
        f"{len(reference)} answers of the `base` model (agreement {min(agree):.2f} to {max(agree):.2f}, every flip at "
        "a near-tie: "
        f"`divergence_gap_max` at most {max(gaps):.3f} nats) and moved its perplexity by at most {moved:.2%}: "
        "agreement "
        "rejects them, perplexity accepts them."], "*")


def models_gpu_speculation(spec: Path) -> str:
    trials, reference, answers = _probe(spec)
    off, ngram, draft = _spec_rows(spec)
    div = [_diverged(reference, answers[t["trial_id"]]) for t in (ngram, draft)]
    gaps = [compare(reference, answers[t["trial_id"]])["divergence_gap_max"] for t in (ngram, draft)]

    def apart(a: pd.Series, b: pd.Series, m: str) -> bool:
        return a[m + "_low"] > b[m + "_high"] or b[m + "_low"] > a[m + "_high"]

    return paragraph(
        f"On one {gpu_name(trials)} the engine accepted {ngram['engine_spec_acceptance_rate']:.0%} of the n-gram "
        "proposals and that speculation still bought "
        + ("no capacity or TPOT beyond the intervals" if not apart(ngram, off, "capacity_rps")
           and not apart(ngram, off, "tpot_p50_ms") else "capacity or TPOT beyond the intervals")
        + f" for this 100 M model; the `tiny` draft model had {draft['engine_spec_acceptance_rate']:.0%} of its "
        "proposals accepted and made TPOT "
        + (f"measurably worse ({draft['tpot_p50_ms']:.2f} against {off['tpot_p50_ms']:.2f} ms, disjoint intervals)"
           if apart(draft, off, "tpot_p50_ms") else "no measurably worse")
        + f". Both changed {span(div, '.0f', ' to ')} of {len(reference)} greedy answers, each at a near-tie (within "
        f"{max(gaps):.3f} nats, the baseline's own floor {off['floor_divergence_gap_max']:.3f}), as vLLM's "
        "lossless-up-to-numerics bound allows "
        f"([benchmarks.md]({_BENCH})).")
