"""The reference-agreement probe: how far a configuration's answers drift from the baseline's.

Every trial of a study with a ``probe`` section sends the same seeded prompt set
(:func:`probe_prompts`) through its engine before the warm-up, outside the measured load
window: greedy decoding (temperature 0, EOS ignored, so every answer has the same length),
the chosen token's logprob with each token (:func:`run_probe`). :func:`compare` then sets
the answers against the baseline configuration's (a pure function); its numbers are the
trial's probe columns, judged like any SLO.

Which trial is the baseline, where the answers are kept and what happens before a baseline
exists is :mod:`orchestrator.results.probe_store`'s business.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np

from orchestrator.measure.columns import ProbeColumns
from orchestrator.measure.metrics import FLOOR_METRIC_NAMES, PERPLEXITY_METRIC_NAMES, PROBE_METRIC_NAMES
from orchestrator.redaction import redact
from orchestrator.study.probe import ProbeSpec
from orchestrator.trial.plan import ProbePlan
from orchestrator.trial.probe_http import post_all
from orchestrator.trial.probe_perplexity import (perplexity_columns, perplexity_texts, run_perplexity, scored_from_json,
                                                 scored_to_json)
from orchestrator.workload.tokens import MIN_TOKEN_ID, check_vocab

# The columns compare() computes from the answers (perplexity and the duration are measured apart).
AGREEMENT_COLUMNS = tuple(m for m in PROBE_METRIC_NAMES
                          if m not in PERPLEXITY_METRIC_NAMES + FLOOR_METRIC_NAMES + ("probe_s",))
# Mixes the probe's stream apart from the workload's, which uses the same study seed.
_PROBE_STREAM = 0x9B0E


@dataclass(frozen=True)
class ProbePrompt:
    token_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class ProbeAnswer:
    """One prompt's greedy answer: its tokens as the server names them, and their logprobs."""

    tokens: tuple[str, ...] = ()
    logprobs: tuple[Optional[float], ...] = ()
    error: Optional[str] = None


def probe_prompts(spec: ProbeSpec, vocab_size: int, seed: int) -> list[ProbePrompt]:
    """The probe set: ``spec.prompts`` prompts, lengths log-uniform in [min, max] input tokens."""
    check_vocab(vocab_size)
    rng = np.random.default_rng([int(spec.seed if spec.seed is not None else seed) & 0xFFFFFFFF, _PROBE_STREAM])
    lo, hi = math.log(spec.min_input_tokens), math.log(spec.max_input_tokens + 1)
    lengths = np.minimum(np.exp(rng.uniform(lo, hi, spec.prompts)).astype(int), spec.max_input_tokens)
    return [ProbePrompt(tuple(int(t) for t in rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, int(n))),
                        spec.output_tokens) for n in np.maximum(lengths, spec.min_input_tokens)]


def probe_fingerprint(prompts: Sequence[ProbePrompt], texts: Sequence[Sequence[int]] = ()) -> str:
    """Names the probe set (its prompts, and its held-out texts if any): answers to two different
    sets are never compared."""
    named: list = [[p.token_ids, p.max_tokens] for p in prompts]
    if texts:
        named.append({"perplexity": [list(t) for t in texts]})
    return hashlib.sha256(json.dumps(named).encode()).hexdigest()[:16]


# ------------------------------------------------------------------ HTTP
def _body(model: str, prompt: ProbePrompt) -> dict[str, Any]:
    return {"model": model, "prompt": list(prompt.token_ids), "max_tokens": prompt.max_tokens, "temperature": 0,
            "logprobs": 1, "ignore_eos": True, "stream": False,
            # vLLM: tokens as "token_id:N", so two tokens that print alike still differ
            "return_tokens_as_token_ids": True}


def _answer(payload: dict, body: Optional[dict] = None) -> ProbeAnswer:
    choice = payload["choices"][0]
    lp = choice.get("logprobs") or {}
    tokens, logprobs = lp.get("tokens"), lp.get("token_logprobs")
    if tokens is None or logprobs is None:
        return ProbeAnswer(error="the response has no logprobs (does the endpoint support 'logprobs'?)")
    return ProbeAnswer(tuple(str(t) for t in tokens), tuple(None if x is None else float(x) for x in logprobs))


def run_probe(base_url: str, model: str, prompts: Sequence[ProbePrompt], spec: ProbeSpec,
              api_key: Optional[str] = None, concurrency: Optional[int] = None) -> tuple[list[ProbeAnswer], float]:
    """Send the probe set to an OpenAI-compatible completions endpoint: (answers in prompt order, seconds).
    ``concurrency``: requests in flight (default ``spec.concurrency``)."""
    t0 = time.monotonic()

    answers = asyncio.run(post_all(base_url, model, [_body(model, p) for p in prompts], _answer,
                                   lambda e: ProbeAnswer(error=e), concurrency=concurrency or spec.concurrency,
                                   timeout_s=spec.timeout_s, api_key=api_key))
    return answers, time.monotonic() - t0


def answers_to_json(answers: Sequence[ProbeAnswer]) -> list[dict]:
    return [asdict(a) for a in answers]


def answers_from_json(items: Sequence[dict]) -> list[ProbeAnswer]:
    return [ProbeAnswer(tuple(a.get("tokens") or ()), tuple(a.get("logprobs") or ()), a.get("error")) for a in items]


# ------------------------------------------------------------------ comparison (pure)
def compare(reference: Sequence[ProbeAnswer], answers: Sequence[ProbeAnswer]) -> dict[str, Optional[float]]:
    """The probe columns of ``answers`` against the baseline's ``reference`` (same prompts, same order).

    Per prompt, with n = the longer answer's length and d = the first position where the tokens
    differ (the shorter length if none differs; a failed request is an empty answer):

    * ``token_agreement``: positions with the same token / n, pooled over prompts;
    * ``prefix_agreement``: d / n, pooled (agreement up to the first divergence);
    * ``logprob_diff_mean`` / ``_p95``: |logprob difference| of the chosen token at the
      positions before d (after it the contexts differ), pooled; null if there are none;
    * ``first_divergence_mean``: d averaged over prompts (an answer that never diverges counts
      its full length);
    * ``divergence_gap_max``: the largest |logprob difference| of the two answers' chosen tokens
      at d, over the prompts that diverge (each answer's own token, the same context); null if
      none diverges. A flip between two tokens the model holds nearly equally likely, which
      numerics alone can cause, reads about the size of ``logprob_diff``; a confident token
      replaced by another (a changed model, or an engine that accepted a token it should not
      have) reads large.
    """
    if len(reference) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(reference)} reference answers")
    same = prefix = total = 0
    firsts: list[int] = []
    diffs: list[float] = []
    gaps: list[float] = []
    for ref, got in zip(reference, answers):
        n, m = max(len(ref.tokens), len(got.tokens)), min(len(ref.tokens), len(got.tokens))
        if n == 0:
            continue
        eq = [ref.tokens[j] == got.tokens[j] for j in range(m)]
        d = eq.index(False) if False in eq else m
        same, prefix, total = same + sum(eq), prefix + d, total + n
        firsts.append(d)
        if d < m:
            a, b = _lp(ref, d), _lp(got, d)
            if a is not None and b is not None:
                gaps.append(abs(a - b))
        for j in range(d):
            a, b = _lp(ref, j), _lp(got, j)
            if a is not None and b is not None:
                diffs.append(abs(a - b))
    out: dict[str, Optional[float]] = dict.fromkeys(AGREEMENT_COLUMNS)
    if total:
        out.update(token_agreement=same / total, prefix_agreement=prefix / total,
                   first_divergence_mean=float(np.mean(firsts)))
    if diffs:
        out.update(logprob_diff_mean=float(np.mean(diffs)), logprob_diff_p95=float(np.percentile(diffs, 95)))
    if gaps:
        out.update(divergence_gap_max=max(gaps))
    return out


def noise_floor(first: Sequence[ProbeAnswer], second: Sequence[ProbeAnswer], concurrency: int) -> dict[str, Any]:
    """The baseline against itself at another batch composition (``second``: the same prompts with
    ``concurrency`` in flight): the ``floor_*`` columns every row records. A failed request in the
    second pass is an empty answer, so it lowers the floor rather than hiding it."""
    cols = compare(first, second)
    return {"floor_token_agreement": cols["token_agreement"], "floor_logprob_diff_mean": cols["logprob_diff_mean"],
            "floor_divergence_gap_max": cols["divergence_gap_max"], "concurrency": concurrency}


def _lp(answer: ProbeAnswer, j: int) -> Optional[float]:
    x = answer.logprobs[j] if j < len(answer.logprobs) else None
    return x if x is not None and math.isfinite(x) else None


def is_baseline(spec: ProbeSpec, args: Any) -> bool:
    """Whether a trial's resolved engine arguments are the baseline configuration's."""
    extra = getattr(args, "extra", None) or {}
    return all((getattr(args, k) if hasattr(args, k) else extra.get(k)) == v for k, v in spec.reference().items())


def probe_trial(plan: ProbePlan, *, base_url: str, model: str, api_key: Optional[str], trial_id: str,
                params: dict, args: Any, store) -> tuple[ProbeColumns, Optional[str]]:
    """Probe a deployed engine and compare with the baseline: (the probe columns, a note on failed requests).

    ``store`` is a :class:`orchestrator.results.probe_store.ProbeStore` or one with its methods:
    ``keep(probe_set, trial_id, record, eligible)`` stores the answers and returns the baseline's
    record, or None while there is none; ``baseline(probe_set)`` reads that record.
    """

    spec: ProbeSpec = plan.spec
    vocab_size = plan.vocab_size
    prompts = probe_prompts(spec, vocab_size, plan.seed)
    texts = perplexity_texts(spec, vocab_size)
    answers, seconds = run_probe(base_url, model, prompts, spec, api_key)
    t0 = time.monotonic()
    scored = run_perplexity(base_url, model, texts, spec, api_key) if texts else []
    seconds += time.monotonic() - t0
    failed = [a.error for a in answers if a.error is not None]
    failed_ppl = [s.error for s in scored if s.error is not None]
    # Kept on disk beside the results: an engine argument that names a secret is "***" (orchestrator.redaction).
    record = {"trial_id": trial_id, "params": dict(params),
              "engine_args": redact(asdict(args)) if args is not None else None,
              "answers": answers_to_json(answers), "perplexity": scored_to_json(scored)}
    eligible = not failed and is_baseline(spec, args)
    probe_set = probe_fingerprint(prompts, texts)
    # The floor pass only for a trial that may become the baseline: once one is claimed, every row
    # reads the floor from its record, and a second pass would cost each baseline-like trial a probe.
    if eligible and spec.floor_pass_concurrency() and store.baseline(probe_set) is None:
        again, more = run_probe(base_url, model, prompts, spec, api_key, concurrency=spec.floor_pass_concurrency())
        seconds += more
        record["floor"] = noise_floor(answers, again, spec.floor_pass_concurrency())
    # An endpoint without prompt_logprobs still has a baseline for agreement (its perplexity stays null).
    baseline = store.keep(probe_set, trial_id, record, eligible)
    columns: dict[str, Any] = {"probe_s": seconds, "probe_reference": plan.reference, "probe_baseline": None}
    floor = (baseline or {}).get("floor") or {}
    columns.update({name: floor.get(name) for name in FLOOR_METRIC_NAMES})
    if baseline is not None:
        columns.update(compare(answers_from_json(baseline["answers"]), answers))
        columns["probe_baseline"] = baseline["trial_id"]
    else:
        columns.update({k: None for k in AGREEMENT_COLUMNS})
    reference = baseline.get("perplexity") if baseline is not None else None
    columns.update(perplexity_columns(scored, scored_from_json(reference) if reference else None))
    notes = [f"{len(failed)} of {len(answers)} probe requests failed; first: {failed[0]}" if failed else "",
             f"{len(failed_ppl)} of {len(scored)} perplexity requests failed; first: {failed_ppl[0]}"
             if failed_ppl else ""]
    return ProbeColumns(columns), "; ".join(n for n in notes if n) or None
