"""docs/trained-models.md, "What the numbers mean": the tiny trained model probed on CPU vLLM.

The dataset, ``results/examples/trained-probe-cpu-vllm``, is what ``benchmarks/trained_probe.py
--output`` keeps: the study definition and trial rows, the baseline's probe answers, the journal, the
model's ``model-training.json`` (torch's held-out perplexity after training) and ``run.json``
(the command, its date and the configurations by label). The table reads the trials' probe columns;
the bullets read the same rows, the baseline's answers and the training record, and choose their
claims from the numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, paragraph, series
from orchestrator.doc_tables.h200 import fmt, markdown, missing, trials_of
from orchestrator.doc_tables.texts.common import versions
from orchestrator.doc_tables.trained import probe_answers

GUARDRAIL = 0.95  # the token_agreement threshold the docs' guardrail example sets


@dataclass(frozen=True)
class Probed:
    """One configuration of the run: its label, the parameters it set and its trial's row."""

    label: str
    params: dict
    row: pd.Series

    def changed(self, baseline: "Probed") -> dict:
        return {k: v for k, v in self.params.items() if baseline.params.get(k) != v}


def _command(folder: Path) -> dict:
    return json.loads((Path(folder) / "run.json").read_text())


def _training(folder: Path) -> dict:
    return json.loads((Path(folder) / "model-training.json").read_text())


def configurations(folder: Path) -> list[Probed]:
    """The run's configurations in the benchmark's order (the first is the baseline), each with its row."""
    trials = trials_of(Path(folder))
    out = []
    for c in _command(folder)["configurations"]:
        rows = trials[(trials[list(c["params"])] == list(c["params"].values())).all(axis=1)]
        if len(rows) != 1:
            raise ValueError(f"{folder}: {len(rows)} trials with the parameters of {c['label']!r}")
        out.append(Probed(c["label"], c["params"], rows.iloc[0]))
    return out


def _by_change(configs: list[Probed]) -> dict[str, Probed]:
    """``batch``, ``dtype``, ``speculation``: the configuration that changes only that from the baseline."""
    base, out = configs[0], {}
    for c in configs[1:]:
        keys = set(c.changed(base))
        kind = {frozenset({"max_num_seqs"}): "batch", frozenset({"dtype"}): "dtype",
                frozenset({"num_speculative_tokens"}): "speculation"}.get(frozenset(keys))
        if kind:
            out[kind] = c
    return out


def _label(c: Probed, base: Probed) -> str:
    if c is base:
        return "baseline"
    changed = ", ".join(f"{k}: {v}" for k, v in c.changed(base).items())
    if set(c.changed(base)) == {"max_num_seqs"}:
        return f"`{changed}` (noise floor)"
    if set(c.changed(base)) == {"num_speculative_tokens"}:
        p = c.row
        return f"`{changed}` (ngram, lookup {p['prompt_lookup_min']:.0f}..{p['prompt_lookup_max']:.0f})"
    return f"`{changed}`"


def _num(value, spec: str) -> str:
    """A probe figure as the table writes it: exact zeros and ones without decimals."""
    if missing(value):
        return "null"
    if value in (0, 1):
        return f"{value:g}"
    return format(value, spec)


def probe_table(folder: Path) -> str:
    """One row per configuration: agreement, drift, held-out perplexity and its delta, acceptance."""
    configs = configurations(folder)
    rows = [[_label(c, configs[0]), _num(c.row["token_agreement"], ".3f"), _num(c.row["prefix_agreement"], ".3f"),
             f"{_num(c.row['logprob_diff_mean'], '.2g')} / {_num(c.row['logprob_diff_p95'], '.2g')}",
             fmt(c.row["heldout_perplexity"], ".4f"), _num(c.row["perplexity_delta"], "+.2g"),
             _num(c.row["engine_spec_acceptance_rate"], ".3f")] for c in configs]
    return markdown(["configuration", "token_agreement", "prefix_agreement", "logprob_diff_mean / p95",
                     "heldout_perplexity", "perplexity_delta", "engine_spec_acceptance_rate"], "lrrrrrr", rows)


def probe_setup(folder: Path) -> str:
    """The paragraph above the table: the run, its probe and its baseline, from the stored study."""
    study = json.loads((Path(folder) / "study.json").read_text())["study"]
    probe, command = study["probe"], _command(folder)
    base = configurations(folder)[0].params
    spec = "no speculation" if not base.get("num_speculative_tokens") else "speculation"
    return paragraph(
        f"The tiny trained model on CPU {versions(trials_of(Path(folder)), 'vllm')} "
        f"(`{command['command']}`, run {command['started'][:10]}: one study, one engine start per configuration, the "
        f"probe's {probe['prompts']} prompts of {probe['min_input_tokens']}..{probe['max_input_tokens']} ids, "
        f"{probe['output_tokens']} greedy tokens each, at `probe.concurrency` {probe['concurrency']} so that batches "
        f"form; the baseline {base['dtype']}, `max_num_seqs` {base['max_num_seqs']}, {spec}):")


def probe_findings(folder: Path) -> str:
    """The bullets under the table: vLLM against torch, what the model predicts, the noise floor."""
    configs = configurations(folder)
    base, batch = configs[0], _by_change(configs)["batch"]
    training = _training(folder)
    torch_ppl, vllm_ppl = training["heldout_perplexity"], base.row["heldout_perplexity"]
    same = f"{torch_ppl:.4f}" == f"{vllm_ppl:.4f}"
    reference, _ = probe_answers(Path(folder))
    chosen = [lp for a in reference for lp in a.logprobs if lp is not None]
    flat = -math.log(training["grammar"]["vocab_size"])
    distinct = len({a.tokens for a in reference})
    exact = batch.row["token_agreement"] == 1 and batch.row["logprob_diff_mean"] == 0
    floor = base.row["floor_token_agreement"], base.row["floor_logprob_diff_mean"]
    return bullets([
        f"vLLM in {base.params['dtype']} scores the held-out text "
        + (f"exactly as torch did after training ({vllm_ppl:.4f} both): the weights load as trained, and "
           "`heldout_perplexity` is the model's own number." if same else
           f"at {vllm_ppl:.4f}, torch after training at {torch_ppl:.4f}."),
        ("The model predicts: " if median(chosen) > flat / 2 else "The model barely predicts: ")
        + f"the baseline's chosen tokens have a median logprob of {median(chosen):.2f} (mean "
        f"{sum(chosen) / len(chosen):.2f}; "
        f"a flat model's are -ln {training['grammar']['vocab_size']} = {flat:.1f}), and its {len(reference)} answers "
        + (f"are {distinct} different ones." if distinct < len(reference) else "are all different."),
        f"**Noise floor**: the baseline's configuration at another batch size (`max_num_seqs` "
        f"{batch.params['max_num_seqs']}) reads agreement {batch.row['token_agreement']:g} and drift "
        f"{batch.row['logprob_diff_mean']:g} on CPU vLLM in {base.params['dtype']}"
        + ("" if missing(floor[0]) else f"; the baseline's own recorded floor (the probe set answered again at "
           f"`probe.floor_concurrency`) reads agreement {floor[0]:g} and drift {floor[1]:g}")
        + ". Every study with a probe records it: every row carries `floor_token_agreement` and "
        "`floor_logprob_diff_mean`; the run's summary prints them and names an agreement constraint the floor itself "
        "would fail. "
        + ("On CPU the floor is exact because vLLM's CPU kernels give each sequence the same numbers whatever the "
           "batch. " if exact else "Even on CPU the floor is not exact here. ")
        + "On a GPU, batch composition can move the last bits of a logit: read the recorded floor (or measure the "
        "baseline at another `max_num_seqs`) before choosing a threshold."], "*")


def probe_guardrail(folder: Path) -> str:
    """The guardrail bullet: what the dtype change does to agreement and to perplexity, and a threshold."""
    configs = configurations(folder)
    base, by = configs[0], _by_change(configs)
    bf16 = by["dtype"].row
    moved = abs(bf16["perplexity_delta"]) / base.row["heldout_perplexity"]
    passes = {k: by[k].row["token_agreement"] >= GUARDRAIL for k in ("batch", "speculation", "dtype")}
    floor = by["batch"].row["token_agreement"]
    names = {"batch": "batch-size changes", "speculation": "speculation", "dtype": "a dtype change"}
    passed = [names[k] for k, ok in passes.items() if ok]
    failed = [names[k] for k, ok in passes.items() if not ok]
    return bullets([
        f"**Where a guardrail sits**: {by['dtype'].params['dtype']} compute flips "
        f"{1 - bf16['token_agreement']:.0%} of the greedy tokens of this model ({bf16['token_agreement']:.3f} "
        f"agreement, {bf16['logprob_diff_mean']:.2g} nats mean drift) while its "
        f"perplexity moves by {moved:.2%}: agreement is the sensitive column (greedy answers diverge at near-ties and "
        "never reconverge), perplexity the one that says whether the model got worse. A threshold must sit above the "
        f"floor and below the change it should catch: with a floor of {floor:g}, `token_agreement >= {GUARDRAIL}` "
        + (f"passes {series(passed)}" if passed else "passes nothing here")
        + (f" and fails {series(failed)}" if failed else " and fails nothing here")
        + "; on a GPU, set it a margin below the measured floor. `perplexity_delta <= 0.01 * heldout_perplexity` (1 %) "
        "bounds the quality loss itself. Which question the guardrail asks, the same answers or the same quality, is "
        "the user's choice."], "*")


def training_measured(folder: Path) -> str:
    """The `tiny` recipe's training as the probe's model recorded it (``model-training.json``): machine,
    load, steps, tokens, wall and CPU seconds, loss and held-out perplexity."""
    t = _training(folder)
    v, load = t["versions"], t["load_average"]
    return paragraph(
        f"The `{t['recipe']['name']}` recipe trained on {t['threads']} {t['device'].upper()} threads of this "
        f"repository's machine, `torch` {v['torch'].split('+')[0]}, Python {'.'.join(v['python'].split('.')[:2])}, "
        f"the load average {min(load):.1f} to {max(load):.1f} when it ended (1, 5 and 15 minutes): {t['steps']} steps, "
        f"{t['train_tokens']:,} training tokens, **{t['seconds']:.0f} s wall, {t['cpu_seconds']:.0f} CPU s** "
        f"(`training.json` records both), loss {t['loss_first']:.2f} to {t['loss_last']:.2f}, **held-out perplexity "
        f"{t['heldout_perplexity']:.2f}** (a flat model: {t['uniform_perplexity']:g}). Recorded with the probe's "
        "dataset; earlier trainings' files are not kept.")
