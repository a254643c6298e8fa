"""Turn a :class:`WorkloadSpec`, a seed and a load level into the exact requests of a trial.

Determinism: ``build_requests(spec, seed, vocab_size, level=k)`` returns an identical
:class:`RequestSet` for identical arguments, on any machine (numpy's
``default_rng`` over a ``SeedSequence``). Each random quantity has its own child
stream, so changing one distribution does not reshuffle the others:

* ``arrivals``: inter-arrival gaps;
* ``input_len`` and ``output_len``: the two length distributions;
* ``prefix``: the shared-prefix contents and which request uses which group;
* ``prompts``: the token ids of the prompts (their unique parts);
* ``warmup``: everything about the warm-up burst (own lengths, prompts, groups).

Load levels (a capacity search replays the workload at several rates on one engine):
``level`` 0 is the workload as it always was. Level k > 0 draws the unique parts of
its prompts, and its warm-up requests, from streams of its own (spawn key
``(_LEVEL_KEY, k)``), so that no level replays a prompt the engine has already seen
and its prefix cache holds: vLLM caches prefixes by default, and a replayed prompt
is answered from the cache (measured on an H200: TTFT 30 ms instead of 79 ms).
Everything else is the same at every level: the shared-prefix contents (sharing them
is the point), and, on purpose, the arrival gaps (before the level's rate scales
them), the lengths and the prefix groups: levels are then a paired comparison in
which only the rate and the prompt text differ, and the capacity search's
interpolation between two levels is not thrown off by a different draw of lengths.
Datasets take the next ``num_requests`` entries of their seeded order at each level
(entries ``k n .. (k + 1) n - 1``, cycling once the file is used up: only then does a
level repeat a text prompt). A trace's text prompts are the trace's own: every level
replays them (the user's file defines them; changing the text would change the
workload), so a capacity search over a trace with text prompts measures a warm
prefix cache after its first level; lines with an ``input_len`` get fresh prompts.

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

Warm-up: first the burst of ``warmup_requests`` (sent at once and awaited), then,
unless ``workload.warmup.enabled`` is false, the steady warm-up
(:class:`WarmupStream`): requests made on demand, as many as the engine needs to
become steady (:mod:`orchestrator.warmup`), at the trial's own load: its arrival
process at its rate (a ramp's start rate, a diurnal cycle's rate at t = 0; a closed
loop keeps its concurrency; a trace cycles its own gaps), its length distributions
(a trace or dataset cycles its entries' shapes) and its shared prefixes, with
prompts from a stream of their own (spawn key ``(_STEADY_KEY, level)``). A ``burst``
arrival has no steady state to wait for: it gets the burst only. Warm-up prompts are
never measured prompts, at any level.

Indexes: measured requests are ``0 .. num_requests-1``; the burst's are
``-warmup_requests .. -1``; the steady warm-up's count down from
``-warmup_requests - 1`` in the order they are sent. Every index of a
:class:`RequestSet` is unique; warm-up indexes are negative.

Traces and datasets (``workload.trace`` / ``workload.dataset``): the file gives each
request's output length and either its prompt text or its input length. A text
prompt is sent as text; its ``prompt_token_ids`` are the word-level encoding the
simulated engine uses (:func:`text_token_ids`), so the virtual and the served
simulator see the same tokens. An input length becomes a prompt drawn from the
``prompts`` stream, after the shared prefix of its ``prefix_group`` (drawn once per
group and seed, whatever the order of the lines). A trace's arrivals are its
timestamps (window, then time scale); a dataset's come from ``workload.arrival``,
taking ``num_requests`` entries in a seeded order (``dataset`` stream), cycling if
the file is shorter. Warm-up requests copy the shapes of the first entries with
prompts of their own (random ids of the same length), so they never put a measured
prompt into the prefix cache.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from orchestrator.workload.arrivals import diurnal_rate, nominal_rate, sample_arrivals
from orchestrator.workload.requests import Request, RequestSet
from orchestrator.workload.spec import (
    ChoiceLength,
    ConcurrencyArrival,
    ConstantArrival,
    DiurnalArrival,
    FixedLength,
    GammaArrival,
    LognormalLength,
    NormalLength,
    PoissonArrival,
    RampArrival,
    SharedPrefix,
    UniformLength,
    WorkloadSpec,
)
from orchestrator.workload.trace import TraceEntry, TraceError

__all__ = ["build_requests", "token_ids_to_text", "text_token_ids", "sample_lengths", "sample_arrivals",
           "load_entries", "MIN_TOKEN_ID", "WarmupStream"]

# Ids below this (and the last ``MIN_TOKEN_ID`` of the vocabulary) are never drawn.
MIN_TOKEN_ID = 10

# Child streams of the per-seed SeedSequence, by position. Append new ones at the
# end: reordering would change every existing workload.
_STREAMS = ("arrivals", "input_len", "output_len", "prefix", "prompts", "warmup", "dataset")


# Spawn keys of the streams that are not children of ``_streams`` (fixed numbers, far from
# the positions of ``_STREAMS`` and from a trace's group prefixes, ``(len(_STREAMS), group)``).
_LEVEL_KEY = 1000  # (_LEVEL_KEY, level): a load level's own prompts and warm-up burst
_STEADY_KEY = 1001  # (_STEADY_KEY, level): the steady warm-up's arrivals, lengths, groups, prompts
_CHUNK = 64  # the steady warm-up's requests are drawn this many at a time (fixed: determinism)


def _streams(seed: int) -> dict[str, np.random.SeedSequence]:
    return dict(zip(_STREAMS, np.random.SeedSequence(seed).spawn(len(_STREAMS))))


def _level_streams(seed: int, level: int, seqs: dict[str, np.random.SeedSequence]) -> dict[str, np.random.SeedSequence]:
    """The ``prompts`` and ``warmup`` streams of a load level (level 0: the workload's own)."""
    if level == 0:
        return {"prompts": seqs["prompts"], "warmup": seqs["warmup"]}
    return dict(zip(("prompts", "warmup"), np.random.SeedSequence(seed, spawn_key=(_LEVEL_KEY, level)).spawn(2)))


def _rng(seq: np.random.SeedSequence) -> np.random.Generator:
    return np.random.default_rng(seq)


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


def text_token_ids(text: str, vocab_size: int) -> tuple[int, ...]:
    """The word-level encoding of a text prompt, as the simulated engine reads it.

    Word ``t123`` is id 123 (the inverse of :func:`token_ids_to_text`); any other word
    is its CRC-32 modulo the vocabulary size.
    """
    ids = []
    for w in text.split():
        if w[:1] == "t" and w[1:].isdigit():
            ids.append(int(w[1:]) % vocab_size)
        else:
            ids.append(zlib.crc32(w.encode()) % vocab_size)
    return tuple(ids) or (0,)


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
    index_step: int = 1,
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
            index=first_index + index_step * i,
            arrival_s=float(arr[i]),
            prompt_token_ids=prompt,
            output_len=int(out_len[i]),
            prefix_group=g if g >= 0 else None,
            warmup=warmup,
        ))
    return tuple(reqs)


def build_requests(spec: WorkloadSpec, seed: int, vocab_size: int,
                   base_dir: Optional[Union[str, Path]] = None, level: int = 0) -> RequestSet:
    """The deterministic requests of ``spec`` for ``seed`` at load ``level`` (see the module docstring).

    ``base_dir``: where relative trace and dataset paths start (the study file's folder).
    ``level``: a capacity search's load level; level k > 0 has prompts (and warm-up
    requests) of its own, level 0 the workload's.
    """
    _check_vocab(vocab_size)
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    if spec.trace is not None or spec.dataset is not None:
        return _build_from_file(spec, seed, vocab_size, base_dir, level)
    seqs = _streams(seed)
    own = _level_streams(seed, level, seqs)
    n = spec.num_requests

    prefix_rng = _rng(seqs["prefix"])  # prefix contents first, then the measured requests' groups
    prefixes = _prefixes(spec.shared_prefix, prefix_rng, vocab_size) if spec.shared_prefix else None
    measured = _make_requests(
        spec=spec, n=n,
        arrivals=sample_arrivals(spec.arrival, n, _rng(seqs["arrivals"])),
        len_rngs=(_rng(seqs["input_len"]), _rng(seqs["output_len"])),
        group_rng=prefix_rng, prompt_rng=_rng(own["prompts"]),
        prefixes=prefixes, vocab_size=vocab_size, first_index=0, warmup=False,
    )

    w = spec.warmup_requests
    warm: tuple[Request, ...] = ()
    if w:
        # The warm-up stream splits into its own input_len, output_len, group and prompt streams.
        wr = [_rng(s) for s in own["warmup"].spawn(4)]
        warm = _make_requests(
            spec=spec, n=w, arrivals=np.zeros(w),
            len_rngs=(wr[0], wr[1]), group_rng=wr[2], prompt_rng=wr[3],
            prefixes=prefixes, vocab_size=vocab_size, first_index=-w, warmup=True,
        )

    closed = spec.arrival.concurrency if isinstance(spec.arrival, ConcurrencyArrival) else None
    rate = nominal_rate(spec.arrival, n)
    return RequestSet(warmup=warm, measured=measured, closed_loop_concurrency=closed, requested_rate=rate,
                      warmup_stream=_steady_stream(spec, seed, vocab_size, level, rate=rate, concurrency=closed))


# ---------------------------------------------------------------- the steady warm-up
def _steady_arrival(arrival):
    """The stationary arrival process the steady warm-up draws gaps from (None: closed loop or burst)."""
    if isinstance(arrival, (PoissonArrival, GammaArrival, ConstantArrival)):
        return arrival
    if isinstance(arrival, RampArrival):  # the rate the measured window starts at
        return GammaArrival(rate=arrival.start_rate, burstiness=arrival.burstiness)
    if isinstance(arrival, DiurnalArrival):
        return PoissonArrival(rate=float(diurnal_rate(arrival, np.zeros(1))[0]))
    return None


def _steady_stream(spec: WorkloadSpec, seed: int, vocab_size: int, level: int, *, rate: Optional[float],
                   concurrency: Optional[int], entries: tuple = (), gaps: tuple = (),
                   default_prefix_len: Optional[int] = None) -> Optional["WarmupStream"]:
    if not spec.warmup.enabled:
        return None
    arrival = None
    if spec.trace is not None:
        if not any(g > 0 for g in gaps):
            return None  # one request, or all at once: no rate to warm up at
    elif concurrency is None:
        arrival = _steady_arrival(spec.arrival)
        if arrival is None:  # a burst: nothing steady to wait for
            return None
        rate = arrival.rate
    return WarmupStream(settings=spec.warmup, spec=spec, seed=seed, vocab_size=vocab_size, level=level,
                        first_index=-spec.warmup_requests - 1, arrival=arrival, rate=rate,
                        concurrency=concurrency, entries=entries, gaps=gaps, default_prefix_len=default_prefix_len)


@dataclass(frozen=True)
class WarmupStream:
    """The steady warm-up's requests, made on demand: iterate for as many as the warm-up needs.

    Open loop (``concurrency`` None): ``arrival_s`` counts from the warm-up's first request
    (due at 0), with gaps from ``arrival`` at ``rate`` (or, for a trace, the trace's own
    gaps, cycled). Closed loop: every ``arrival_s`` is 0; keep ``concurrency`` in flight.
    Lengths and prefix groups come from the workload's distributions (synthetic) or cycle
    through ``entries`` (traces and datasets); prompts are the stream's own. Requests are
    drawn ``_CHUNK`` at a time from fixed streams: every iteration yields the same sequence.
    """

    settings: Any  # WarmupSpec
    spec: WorkloadSpec
    seed: int
    vocab_size: int
    level: int
    first_index: int  # the first request's index; later ones count down
    arrival: Any = None  # a Poisson, gamma or constant arrival (None: closed loop, or a trace's gaps)
    rate: Optional[float] = None  # nominal requests per second (None: closed loop)
    concurrency: Optional[int] = None
    entries: tuple = ()  # traces and datasets: TraceEntry shapes, cycled
    gaps: tuple = ()  # traces: the replayed window's gaps (seconds), cycled
    default_prefix_len: Optional[int] = None

    def _gaps(self, rng: np.random.Generator, n: int, done: int) -> np.ndarray:
        """Gaps before each of the next ``n`` requests (``done`` already drawn; the first is due at 0)."""
        a = self.arrival
        if self.concurrency is not None:
            g = np.zeros(n)
        elif self.entries and self.gaps:
            g = np.array([self.gaps[(done + i - 1) % len(self.gaps)] for i in range(n)], dtype=float)
        elif isinstance(a, PoissonArrival):
            g = rng.exponential(1.0 / a.rate, n)
        elif isinstance(a, GammaArrival):
            g = rng.gamma(shape=a.burstiness, scale=1.0 / (a.rate * a.burstiness), size=n)
        else:
            g = np.full(n, 1.0 / a.rate)
        if done == 0:
            g[0] = 0.0
        return g

    def __iter__(self) -> Iterator[Request]:
        r_arr, r_in, r_out, r_grp, r_prompt = (
            _rng(s) for s in np.random.SeedSequence(self.seed, spawn_key=(_STEADY_KEY, self.level)).spawn(5))
        prefixes = None
        sp = self.spec.shared_prefix
        if sp is not None and not self.entries:  # the workload's own prefixes (drawn first from its stream)
            prefixes = _prefixes(sp, _rng(_streams(self.seed)["prefix"]), self.vocab_size)
        t, done = 0.0, 0
        while True:
            arrivals = t + np.cumsum(self._gaps(r_arr, _CHUNK, done))
            first = self.first_index - done
            if self.entries:
                chunk = [self.entries[(done + i) % len(self.entries)] for i in range(_CHUNK)]
                reqs = _entry_requests(chunk, arrivals.tolist(), seed=self.seed, vocab_size=self.vocab_size,
                                       prompt_rng=r_prompt, default_prefix_len=self.default_prefix_len,
                                       first_index=first, warmup=True, index_step=-1)
            else:
                reqs = _make_requests(spec=self.spec, n=_CHUNK, arrivals=arrivals, len_rngs=(r_in, r_out),
                                      group_rng=r_grp, prompt_rng=r_prompt, prefixes=prefixes,
                                      vocab_size=self.vocab_size, first_index=first, warmup=True, index_step=-1)
            yield from reqs
            t = float(arrivals[-1])
            done += _CHUNK


# ---------------------------------------------------------------- traces and datasets
def load_entries(spec: WorkloadSpec, base_dir: Optional[Union[str, Path]] = None) -> list[TraceEntry]:
    """Every entry of the workload's trace or dataset file, in file order (checked: :class:`TraceError`)."""
    from orchestrator.workload.datasets import read_dataset
    from orchestrator.workload.trace import read_trace, resolve_workload_file

    if spec.trace is not None:
        path = resolve_workload_file(spec.trace.path, base_dir)
        entries = read_trace(path, time_unit=spec.trace.time_unit)
        default_prefix = spec.trace.prefix_len
    else:
        ds = spec.dataset
        path = resolve_workload_file(ds.path, base_dir)
        entries = read_dataset(ds.format, path, ds.output_len)
        default_prefix = None
    for e in entries:
        if e.prefix_group is not None and e.input_len is not None and not (e.prefix_len or default_prefix):
            raise TraceError(f"{path}:{e.line}: prefix_group {e.prefix_group} needs a prefix_len "
                             "(on the line, or trace.prefix_len)")
    return entries


def _group_prefix(seed: int, group: int, length: int, vocab_size: int) -> list[int]:
    # Keyed by (seed, group), not drawn in file order: a window or a shuffle that drops
    # lines does not change the prefix of the groups that remain.
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(len(_STREAMS), group)))
    return rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=length, dtype=np.int64).tolist()


def _entry_requests(entries: Sequence[TraceEntry], arrivals: Sequence[float], *, seed: int, vocab_size: int,
                    prompt_rng: np.random.Generator, default_prefix_len: Optional[int], first_index: int,
                    warmup: bool, index_step: int = 1) -> tuple[Request, ...]:
    prefixes: dict[tuple[int, int], list[int]] = {}
    out = []
    for i, (e, due) in enumerate(zip(entries, arrivals)):
        text = e.prompt
        group = e.prefix_group
        if text is not None:
            ids = list(text_token_ids(text, vocab_size))
            if warmup:  # same length, a prompt of its own
                ids = prompt_rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=len(ids)).tolist()
                text = None
        else:
            plen = (e.prefix_len or default_prefix_len) if group is not None else None  # checked by load_entries
            prefix: list[int] = []
            if plen:
                key = (group, plen)
                if key not in prefixes:
                    prefixes[key] = _group_prefix(seed, group, plen, vocab_size)
                prefix = prefixes[key]
            total = max(e.input_len, len(prefix) + 1) if prefix else e.input_len
            own = prompt_rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=total - len(prefix)).tolist()
            ids = prefix + own
        out.append(Request(index=first_index + index_step * i, arrival_s=float(due), prompt_token_ids=tuple(ids),
                           output_len=e.output_len, prefix_group=group, warmup=warmup, prompt_text=text))
    return tuple(out)


def _build_from_file(spec: WorkloadSpec, seed: int, vocab_size: int,
                     base_dir: Optional[Union[str, Path]], level: int = 0) -> RequestSet:
    from orchestrator.workload.trace import select_window

    seqs = _streams(seed)
    own = _level_streams(seed, level, seqs)
    entries = load_entries(spec, base_dir)
    closed = None
    gaps: tuple = ()
    if spec.trace is not None:
        t = spec.trace
        chosen, due = select_window(entries, start_s=t.start_s, end_s=t.end_s, time_scale=t.time_scale,
                                    max_requests=t.max_requests)
        span = float(due[-1] - due[0]) if len(due) > 1 else 0.0
        rate = (len(due) - 1) / span if span > 0 else None
        default_prefix = t.prefix_len
        gaps = tuple(np.diff(np.asarray(due, dtype=float)).tolist())
    else:
        n = spec.num_requests
        order = np.arange(len(entries))
        if spec.dataset.shuffle:
            order = _rng(seqs["dataset"]).permutation(len(entries))
        # Level k takes the next n entries of the order: other prompts, as long as the file lasts.
        chosen = [entries[order[(level * n + i) % len(entries)]] for i in range(n)]
        due = sample_arrivals(spec.arrival, n, _rng(seqs["arrivals"]))
        rate = nominal_rate(spec.arrival, n)
        default_prefix = None
        if isinstance(spec.arrival, ConcurrencyArrival):
            closed = spec.arrival.concurrency
    measured = _entry_requests(chosen, due, seed=seed, vocab_size=vocab_size, prompt_rng=_rng(own["prompts"]),
                               default_prefix_len=default_prefix, first_index=0, warmup=False)
    w = spec.warmup_requests
    warm = _entry_requests([chosen[i % len(chosen)] for i in range(w)], [0.0] * w, seed=seed,
                           vocab_size=vocab_size, prompt_rng=_rng(own["warmup"]),
                           default_prefix_len=default_prefix, first_index=-w, warmup=True) if w else ()
    stream = _steady_stream(spec, seed, vocab_size, level, rate=rate, concurrency=closed, entries=tuple(chosen),
                            gaps=gaps, default_prefix_len=default_prefix)
    return RequestSet(warmup=warm, measured=measured, closed_loop_concurrency=closed, requested_rate=rate,
                      warmup_stream=stream)
