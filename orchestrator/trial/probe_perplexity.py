"""Held-out perplexity through the engine: the probe's ``heldout_perplexity`` and ``perplexity_delta``.

Token agreement says whether greedy answers moved; perplexity says how much worse the model
got at its own language. The text is the generated grammar's held-out stream
(:func:`orchestrator.models.corpus.heldout_sequences`) for the model's vocabulary: on a model made by
``make-model --weights trained`` it is text of the language the model learned and never saw;
on any other model it is a fixed token sequence whose perplexity means little alone, though
its change against the baseline still does.

vLLM's completions API returns the logprob of every prompt token given the tokens before it
when asked for ``prompt_logprobs`` (an extension of the API; ``0``: the prompt token's own
logprob only). One token is generated and ignored. Per text, the summed negative logprob and
the count of scored tokens are kept, so the perplexity (``exp`` of their pooled ratio) and the
baseline's can be set side by side later.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from orchestrator.models.corpus import Grammar, heldout_sequences
from orchestrator.models.modelgen import special_token_count
from orchestrator.study.probe import ProbeSpec
from orchestrator.trial.probe_http import post_all


@dataclass(frozen=True)
class Scored:
    """One held-out text through the engine: the sum of -logprob over its scored tokens."""

    nll: float = 0.0
    tokens: int = 0
    error: Optional[str] = None


def perplexity_texts(spec: ProbeSpec, vocab_size: int) -> list[tuple[int, ...]]:
    """The held-out texts the probe scores (none when ``perplexity_sequences`` is 0)."""

    if spec.perplexity_sequences == 0:
        return []
    grammar = Grammar(vocab_size, vocab_size - special_token_count(vocab_size))
    ids = heldout_sequences(grammar, spec.perplexity_sequences, spec.perplexity_tokens)
    return [tuple(int(t) for t in row) for row in ids]


def _body(model: str, ids: Sequence[int]) -> dict[str, Any]:
    return {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0,
            "stream": False}


def score(payload: dict, ids: Sequence[int]) -> Scored:
    """The summed -logprob of ``ids[1:]`` from a completions response with ``prompt_logprobs``."""
    entries = payload["choices"][0].get("prompt_logprobs")
    if not entries or len(entries) != len(ids):
        return Scored(error="the response has no prompt_logprobs for every prompt token "
                            "(does the endpoint support vLLM's 'prompt_logprobs'?)")
    nll = 0.0
    for tok, entry in zip(ids[1:], entries[1:]):
        got = (entry or {}).get(str(tok))
        value = got.get("logprob") if isinstance(got, dict) else got
        if value is None or not math.isfinite(float(value)):
            return Scored(error=f"no finite prompt logprob for token {tok}")
        nll -= float(value)
    return Scored(nll, len(ids) - 1)


def run_perplexity(base_url: str, model: str, texts: Sequence[Sequence[int]], spec: ProbeSpec,
                   api_key: Optional[str] = None) -> list[Scored]:
    """Score every held-out text through the engine, ``spec.concurrency`` at a time."""

    return asyncio.run(post_all(base_url, model, [_body(model, t) for t in texts],
                                lambda payload, body: score(payload, body["prompt"]),
                                lambda e: Scored(error=e), concurrency=spec.concurrency,
                                timeout_s=spec.timeout_s, api_key=api_key))


def perplexity(scored: Sequence[Scored]) -> Optional[float]:
    """exp(pooled mean -logprob); None when any text failed or none was scored."""
    tokens = sum(s.tokens for s in scored)
    if not scored or tokens == 0 or any(s.error for s in scored):
        return None
    return math.exp(sum(s.nll for s in scored) / tokens)


def perplexity_columns(scored: Sequence[Scored], reference: Optional[Sequence[Scored]]) -> dict[str, Optional[float]]:
    """``heldout_perplexity`` of this trial, and ``perplexity_delta``: it minus the baseline's."""
    mine = perplexity(scored)
    theirs = perplexity(reference) if reference is not None else None
    return {"heldout_perplexity": mine,
            "perplexity_delta": mine - theirs if mine is not None and theirs is not None else None}


def scored_to_json(scored: Sequence[Scored]) -> list[dict]:
    return [asdict(s) for s in scored]


def scored_from_json(items: Sequence[dict]) -> list[Scored]:
    return [Scored(float(s.get("nll", 0.0)), int(s.get("tokens", 0)), s.get("error")) for s in items]
