"""Turn a :class:`WorkloadSpec` and a seed into the exact requests of a trial.

Determinism: ``build_requests(spec, seed, vocab_size)`` returns an identical
:class:`RequestSet` for identical arguments, on any machine (numpy's
``default_rng`` over a ``SeedSequence``). Each random quantity has its own child
stream, so changing one distribution does not reshuffle the others:

* ``arrivals``: inter-arrival gaps;
* ``input_len`` and ``output_len``: the two length distributions;
* ``prefix``: the shared-prefix contents and which request uses which group;
* ``prompts``: the token ids of the prompts (their unique parts);
* ``warmup``: everything about the warm-up requests (own lengths, prompts, groups).

Arrivals are precomputed (as ``vllm bench serve``'s ``get_request``) and the first
measured request is due at t = 0. Unlike vLLM, gaps are *not* rescaled so that the
last arrival lands exactly at ``num_requests / rate``: the realised rate of a short
run varies around the requested one, as a real Poisson process does, and every
trial of a study sees the same arrivals because the seed is shared.

Prompts are token-id tuples; ids are uniform in ``[10, vocab_size - 10)`` so they
stay clear of the special tokens most tokenizers keep at either end of the
vocabulary. The chat API needs text: :func:`token_ids_to_text` spells ids as
words (see there).

Shared prefixes: ``groups`` random prefixes of ``length`` tokens are drawn once.
Each request uses a prefix with probability ``fraction``, with a group drawn
uniformly; its prompt is ``prefix + unique suffix`` and its total length is
``max(input_len, length + 1)``: at least one token of its own, so two requests
of a group never have identical prompts. Suffixes are random ids, unique with
overwhelming probability (not by construction). Warm-up requests draw from the
same prefixes (they warm the prefix cache as steady-state traffic would).

Indexes: measured requests are ``0 .. num_requests-1``; warm-up requests are
``-warmup_requests .. -1``, so every index of a :class:`RequestSet` is unique and
sorting by index puts the warm-up first.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from orchestrator.workload.requests import Request, RequestSet
from orchestrator.workload.spec import (
    BurstArrival,
    ChoiceLength,
    ConcurrencyArrival,
    ConstantArrival,
    FixedLength,
    GammaArrival,
    LognormalLength,
    NormalLength,
    PoissonArrival,
    SharedPrefix,
    UniformLength,
    WorkloadSpec,
)

__all__ = ["build_requests", "token_ids_to_text", "sample_lengths", "sample_arrivals", "MIN_TOKEN_ID"]

# Ids below this (and the last ``MIN_TOKEN_ID`` of the vocabulary) are never drawn.
MIN_TOKEN_ID = 10

# Child streams of the per-seed SeedSequence, by position. Append new ones at the
# end: reordering would change every existing workload.
_STREAMS = ("arrivals", "input_len", "output_len", "prefix", "prompts", "warmup")


def _streams(seed: int) -> dict[str, np.random.SeedSequence]:
    return dict(zip(_STREAMS, np.random.SeedSequence(seed).spawn(len(_STREAMS))))


def _rng(seq: np.random.SeedSequence) -> np.random.Generator:
    return np.random.default_rng(seq)


# ---------------------------------------------------------------- arrivals
def sample_arrivals(arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Due times (seconds, first at 0, non-decreasing) of ``n`` requests."""
    if n <= 0:
        return np.zeros(0)
    if isinstance(arrival, PoissonArrival):
        gaps = rng.exponential(1.0 / arrival.rate, n - 1)
    elif isinstance(arrival, GammaArrival):
        # As vLLM's get_request: shape = burstiness, scale = 1 / (rate * burstiness),
        # so the mean gap is 1/rate and the gaps' coefficient of variation 1/sqrt(burstiness).
        b = arrival.burstiness
        gaps = rng.gamma(shape=b, scale=1.0 / (arrival.rate * b), size=n - 1)
    elif isinstance(arrival, ConstantArrival):
        gaps = np.full(n - 1, 1.0 / arrival.rate)
    elif isinstance(arrival, (BurstArrival, ConcurrencyArrival)):
        gaps = np.zeros(n - 1)
    else:  # pragma: no cover - the spec union is closed
        raise TypeError(f"unknown arrival spec {type(arrival).__name__}")
    out = np.empty(n)
    out[0] = 0.0
    np.cumsum(gaps, out=out[1:])
    return out


# ---------------------------------------------------------------- lengths
def sample_lengths(spec, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` token counts (int64, each >= 1) drawn from a length spec."""
    if isinstance(spec, FixedLength):
        return np.full(n, spec.value, dtype=np.int64)
    if isinstance(spec, UniformLength):
        return rng.integers(spec.min, spec.max, size=n, endpoint=True, dtype=np.int64)
    if isinstance(spec, NormalLength):
        return _round_clip(rng.normal(spec.mean, spec.std, size=n), spec.min, spec.max)
    if isinstance(spec, LognormalLength):
        # ``mean`` is the mean of the lognormal, not its median: E[X] = exp(mu + sigma^2 / 2).
        mu = np.log(spec.mean) - spec.sigma ** 2 / 2.0
        return _round_clip(rng.lognormal(mu, spec.sigma, size=n), spec.min, spec.max)
    if isinstance(spec, ChoiceLength):
        p = None
        if spec.weights is not None:
            w = np.asarray(spec.weights, dtype=float)
            p = w / w.sum()
        return rng.choice(np.asarray(spec.values, dtype=np.int64), size=n, p=p)
    raise TypeError(f"unknown length spec {type(spec).__name__}")  # pragma: no cover


def _round_clip(x: np.ndarray, lo: int, hi: Optional[int]) -> np.ndarray:
    upper = float(hi) if hi is not None else np.inf
    return np.clip(np.rint(x), lo, upper).astype(np.int64)


# ---------------------------------------------------------------- prompts
def token_ids_to_text(ids) -> str:
    """Spell token ids as text for the chat API: id 123 becomes the word ``t123``.

    This is a WordLevel-style mapping (one word per id, joined by spaces). A real
    tokenizer splits these words into a different number of tokens, and the chat
    template adds its own, so the server's prompt length differs from
    ``len(ids)``; metrics use the server's ``usage.prompt_tokens``, never this count.
    """
    return " ".join([f"t{i}" for i in ids])


def _check_vocab(vocab_size: int) -> None:
    if vocab_size < 2 * MIN_TOKEN_ID + 1:
        raise ValueError(f"vocab_size must be at least {2 * MIN_TOKEN_ID + 1}, got {vocab_size}")


def _prefixes(sp: SharedPrefix, rng: np.random.Generator, vocab_size: int) -> np.ndarray:
    return rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=(sp.groups, sp.length), dtype=np.int64)


def _make_requests(
    *,
    spec: WorkloadSpec,
    n: int,
    arrivals: np.ndarray,
    len_rngs: tuple[np.random.Generator, np.random.Generator],
    group_rng: np.random.Generator,
    prompt_rng: np.random.Generator,
    prefixes: Optional[np.ndarray],
    vocab_size: int,
    first_index: int,
    warmup: bool,
) -> tuple[Request, ...]:
    input_len = sample_lengths(spec.input_len, n, len_rngs[0])
    output_len = sample_lengths(spec.output_len, n, len_rngs[1])

    groups = np.full(n, -1, dtype=np.int64)
    prefix_len = 0
    sp = spec.shared_prefix
    if sp is not None and prefixes is not None:
        uses = group_rng.random(n) < sp.fraction
        chosen = group_rng.integers(0, sp.groups, size=n)
        groups = np.where(uses, chosen, -1)
        prefix_len = sp.length

    has_prefix = groups >= 0
    total_len = np.where(has_prefix, np.maximum(input_len, prefix_len + 1), input_len)
    own_len = total_len - np.where(has_prefix, prefix_len, 0)
    ids = prompt_rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=int(own_len.sum()), dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(own_len)))

    prefix_lists = [p.tolist() for p in prefixes] if prefixes is not None else []
    id_list = ids.tolist()
    arr = arrivals.tolist()
    out_len = output_len.tolist()
    group_list = groups.tolist()
    b = bounds.tolist()
    reqs = []
    for i in range(n):
        g = group_list[i]
        own = id_list[b[i]:b[i + 1]]
        prompt = tuple(prefix_lists[g] + own) if g >= 0 else tuple(own)
        reqs.append(Request(
            index=first_index + i,
            arrival_s=float(arr[i]),
            prompt_token_ids=prompt,
            output_len=int(out_len[i]),
            prefix_group=g if g >= 0 else None,
            warmup=warmup,
        ))
    return tuple(reqs)


def build_requests(spec: WorkloadSpec, seed: int, vocab_size: int) -> RequestSet:
    """The deterministic requests of ``spec`` for ``seed`` (see the module docstring)."""
    _check_vocab(vocab_size)
    seqs = _streams(seed)
    n = spec.num_requests

    prefix_rng = _rng(seqs["prefix"])  # prefix contents first, then the measured requests' groups
    prefixes = _prefixes(spec.shared_prefix, prefix_rng, vocab_size) if spec.shared_prefix else None
    measured = _make_requests(
        spec=spec, n=n,
        arrivals=sample_arrivals(spec.arrival, n, _rng(seqs["arrivals"])),
        len_rngs=(_rng(seqs["input_len"]), _rng(seqs["output_len"])),
        group_rng=prefix_rng, prompt_rng=_rng(seqs["prompts"]),
        prefixes=prefixes, vocab_size=vocab_size, first_index=0, warmup=False,
    )

    w = spec.warmup_requests
    warm: tuple[Request, ...] = ()
    if w:
        # The warm-up stream splits into its own input_len, output_len, group and prompt streams.
        wr = [_rng(s) for s in seqs["warmup"].spawn(4)]
        warm = _make_requests(
            spec=spec, n=w, arrivals=np.zeros(w),
            len_rngs=(wr[0], wr[1]), group_rng=wr[2], prompt_rng=wr[3],
            prefixes=prefixes, vocab_size=vocab_size, first_index=-w, warmup=True,
        )

    closed = spec.arrival.concurrency if isinstance(spec.arrival, ConcurrencyArrival) else None
    return RequestSet(warmup=warm, measured=measured, closed_loop_concurrency=closed)
