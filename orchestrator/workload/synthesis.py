"""A workload's random parts, drawn from seeded streams: lengths, shared prefixes, prompts.

Each random quantity has its own child stream of the per-seed ``SeedSequence``
(:data:`STREAMS`), and a load level's and the steady warm-up's prompts have streams of
their own (spawn keys ``(LEVEL_KEY, level)`` and ``(STEADY_KEY, level)``): see
:mod:`orchestrator.workload.generate` for what each one draws and why.

Shared prefixes: ``groups`` random prefixes of ``length`` tokens are drawn once.
Each request uses a prefix with probability ``fraction``, with a group drawn
uniformly; its prompt is ``prefix + unique suffix`` and its total length is
``max(input_len, length + 1)``: at least one token of its own, so two requests
of a group never have identical prompts. Suffixes are random ids, unique with
overwhelming probability (not by construction). A trace's or dataset's groups get
their prefix from a stream keyed by ``(seed, group)``, whatever the order of the lines.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import numpy as np

from orchestrator.workload.requests import Request
from orchestrator.workload.spec import (ChoiceLength, FixedLength, LognormalLength, NormalLength, SharedPrefix,
                                        UniformLength, WorkloadSpec)
from orchestrator.workload.tokens import MIN_TOKEN_ID, text_token_ids
from orchestrator.workload.trace import TraceEntry

__all__ = ["LEVEL_KEY", "REPLICATE_KEY", "measurement_seed", "STEADY_KEY", "STREAMS", "draw_prefixes", "entry_requests", "group_prefix",
           "level_streams", "make_requests", "make_rng", "replicate_streams", "sample_lengths", "seed_streams"]

# Child streams of the per-seed SeedSequence, by position. Append new ones at the
# end: reordering would change every existing workload.
STREAMS = ("arrivals", "input_len", "output_len", "prefix", "prompts", "warmup", "dataset")


# Spawn keys of the streams that are not children of ``seed_streams`` (fixed numbers, far from
# the positions of ``STREAMS`` and from a trace's group prefixes, ``(len(STREAMS), group)``).
LEVEL_KEY = 1000  # (LEVEL_KEY, level): a load level's own prompts and warm-up burst
STEADY_KEY = 1001  # (STEADY_KEY, level): the steady warm-up's arrivals, lengths, groups, prompts
# (REPLICATE_KEY, r, level): the arrivals, lengths and prefix groups of load level k > 0 or of its
# r-th measurement again, and the prompts of a measurement again (r > 0).
REPLICATE_KEY = 1002
REMEASURE_KEY = 1003  # (REMEASURE_KEY, k): the seed of a configuration's k-th measurement again


def measurement_seed(seed: int, measurement: int) -> int:
    """The workload seed of a configuration's ``measurement``-th measurement (0: the study's seed):
    a trial that measures a configuration again sees other arrivals, lengths and prompts."""
    if measurement == 0:
        return seed
    return int(np.random.SeedSequence(seed, spawn_key=(REMEASURE_KEY, measurement)).generate_state(1)[0])


def seed_streams(seed: int) -> dict[str, np.random.SeedSequence]:
    return dict(zip(STREAMS, np.random.SeedSequence(seed).spawn(len(STREAMS))))


def level_streams(seed: int, level: int, seqs: dict[str, np.random.SeedSequence],
                  replicate: int = 0) -> dict[str, np.random.SeedSequence]:
    """The ``prompts`` and ``warmup`` streams of a load level (level 0: the workload's own), or of
    its ``replicate``-th measurement again."""
    if replicate > 0:
        key = (REPLICATE_KEY, replicate, level, 0)
    elif level == 0:
        return {"prompts": seqs["prompts"], "warmup": seqs["warmup"]}
    else:
        key = (LEVEL_KEY, level)
    return dict(zip(("prompts", "warmup"), np.random.SeedSequence(seed, spawn_key=key).spawn(2)))


def replicate_streams(seed: int, replicate: int, seqs: dict[str, np.random.SeedSequence],
                      level: int = 0) -> dict[str, np.random.SeedSequence]:
    """The arrival, length and prefix-group streams of load ``level``'s ``replicate``-th measurement
    (level 0, replicate 0: the workload's own; ``groups`` is then None: they follow the prefix
    contents). Every other level and measurement draws its own: independent draws, so that a
    capacity search's levels average the workload's noise instead of repeating one draw."""
    if replicate == 0 and level == 0:
        return {**seqs, "groups": None}
    fresh = np.random.SeedSequence(seed, spawn_key=(REPLICATE_KEY, replicate, level)).spawn(4)
    return {**seqs, **dict(zip(("arrivals", "input_len", "output_len", "groups"), fresh))}


def make_rng(seq: np.random.SeedSequence) -> np.random.Generator:
    return np.random.default_rng(seq)


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


def draw_prefixes(sp: SharedPrefix, rng: np.random.Generator, vocab_size: int) -> np.ndarray:
    return rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=(sp.groups, sp.length), dtype=np.int64)


def make_requests(
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
    index_step: int = 1,
) -> tuple[Request, ...]:
    """``n`` synthetic requests: lengths from the spec's distributions, prefix groups and prompt ids
    from the given streams; indexes ``first_index + index_step * i``."""
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

    prefix_lists = [token_list(p, vocab_size) for p in prefixes] if prefixes is not None else []
    arr = arrivals.tolist()
    out_len = output_len.tolist()
    group_list = groups.tolist()
    b = bounds.tolist()
    reqs = []
    block, block_start, block_end = [], 0, 0  # ids as ints a block at a time: never a list of every id
    for i in range(n):
        g = group_list[i]
        if b[i + 1] > block_end:
            block_start, block_end = b[i], max(b[i + 1], b[i] + ID_BLOCK)
            block = token_list(ids[block_start:block_end], vocab_size)
        own = block[b[i] - block_start:b[i + 1] - block_start]
        if spec.repetition is not None:
            own = repeat_spans(own, spec.repetition.fraction, spec.repetition.span, prompt_rng)
        prompt = tuple(prefix_lists[g] + own) if g >= 0 else tuple(own)
        reqs.append(Request(
            index=first_index + index_step * i,
            arrival_s=float(arr[i]),
            prompt_token_ids=prompt,
            output_len=int(out_len[i]),
            prefix_group=g if g >= 0 else None,
            warmup=warmup,
        ))
    return tuple(reqs)


ID_BLOCK = 1 << 20  # prompt ids converted to ints at a time


def repeat_spans(ids: list[int], fraction: float, span: int, rng: np.random.Generator) -> list[int]:
    """``ids`` cut into spans of ``span`` tokens; each whole span after the first is, with chance
    ``fraction``, replaced by a copy of ``span`` tokens that end before it (at a random offset),
    so later text repeats earlier text. Draws from ``rng`` only for prompts of two spans or more."""
    starts = range(span, len(ids) - span + 1, span)
    if not starts:
        return ids
    out = list(ids)
    copied = rng.random(len(starts)) < fraction
    offsets = rng.random(len(starts))
    for start, copy, u in zip(starts, copied.tolist(), offsets.tolist()):
        if copy:
            src = int(u * (start - span + 1))
            out[start:start + span] = out[src:src + span]
    return out


@functools.lru_cache(maxsize=4)
def _token_ints(vocab_size: int) -> np.ndarray:
    return np.array(list(range(vocab_size)), dtype=object)


def token_list(ids: np.ndarray, vocab_size: int) -> list[int]:
    """``ids`` as Python ints, each id one shared object: a prompt's tuple then costs 8 bytes a
    token, not 36 (a million 512-token prompts: ~4 GB instead of ~18 GB)."""
    return _token_ints(vocab_size)[ids].tolist()


def group_prefix(seed: int, group: int, length: int, vocab_size: int) -> list[int]:
    # Keyed by (seed, group), not drawn in file order: a window or a shuffle that drops
    # lines does not change the prefix of the groups that remain.
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(len(STREAMS), group)))
    return token_list(rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=length, dtype=np.int64), vocab_size)


def entry_requests(entries: Sequence[TraceEntry], arrivals: Sequence[float], *, seed: int, vocab_size: int,
                   prompt_rng: np.random.Generator, default_prefix_len: Optional[int], first_index: int,
                   warmup: bool, index_step: int = 1) -> tuple[Request, ...]:
    """Requests of trace or dataset entries: a text prompt is sent as text (a warm-up request gets
    random ids of its length instead); an input length becomes its group's prefix + drawn ids."""
    prefixes: dict[tuple[int, int], list[int]] = {}
    out = []
    for i, (e, due) in enumerate(zip(entries, arrivals)):
        text = e.prompt
        group = e.prefix_group
        if text is not None:
            ids = list(text_token_ids(text, vocab_size))
            if warmup:  # same length, a prompt of its own
                ids = token_list(prompt_rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=len(ids)), vocab_size)
                text = None
        else:
            plen = (e.prefix_len or default_prefix_len) if group is not None else None  # checked by load_entries
            prefix: list[int] = []
            if plen:
                key = (group, plen)
                if key not in prefixes:
                    prefixes[key] = group_prefix(seed, group, plen, vocab_size)
                prefix = prefixes[key]
            total = max(e.input_len, len(prefix) + 1) if prefix else e.input_len
            own = token_list(prompt_rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=total - len(prefix)),
                             vocab_size)
            ids = prefix + own
        out.append(Request(index=first_index + index_step * i, arrival_s=float(due), prompt_token_ids=tuple(ids),
                           output_len=e.output_len, prefix_group=group, warmup=warmup, prompt_text=text))
    return tuple(out)

