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
``(LEVEL_KEY, k)``), so that no level replays a prompt the engine has already seen
and its prefix cache holds: vLLM caches prefixes by default, and a replayed prompt
is answered from the cache (measured on an H200: TTFT 30 ms instead of 79 ms).
The shared-prefix contents are the same at every level (sharing them is the point).
The arrival gaps, the lengths and the prefix groups are the same draw at every level
(time-scaled to the level's rate: a Poisson or gamma gap is the unit draw over the rate):
common random numbers. Every configuration of a study, at every rate, replays the same
sequence of requests, so two configurations are compared on the same requests wherever
each is measured, and a capacity search's levels differ by their rate alone, not by their
luck (a burst one level drew and the next did not). What one draw of the workload leaves
unknown, the bootstrap over blocks of its requests says (:mod:`orchestrator.measure.confidence`).
A level measured again (``replicate`` r > 0) is a fresh draw of all of these and of its
prompts (``(REPLICATE_KEY, r, 0)`` for the arrivals, lengths and groups: the same r-th draw
at every level).
Datasets take the next ``num_requests`` entries of their seeded order at each level
(entries ``k n .. (k + 1) n - 1``, cycling once the file is used up: only then does a
level repeat a text prompt). A trace's text prompts are the trace's own: every level
replays them (the user's file defines them; changing the text would change the
workload), so a capacity search over a trace with text prompts measures a warm
prefix cache after its first level; lines with an ``input_len`` get fresh prompts.

Arrivals are precomputed (as ``vllm bench serve``'s ``get_request``) and the first
measured request is due at t = 0. As vLLM does, Poisson and gamma gaps are rescaled so
that the window's realised rate is the requested one (:mod:`orchestrator.workload.arrivals`):
only the burstiness inside the window is a random draw. Every trial of a study sees the
same arrivals because the seed is shared.

Prompts are token-id tuples (:mod:`orchestrator.workload.tokens`: the id range, and the
spelling as text the chat API needs). Shared prefixes are drawn once per seed and a
request uses one with the spec's ``fraction`` (:mod:`orchestrator.workload.synthesis`).
Warm-up requests draw from the same prefixes (they warm the prefix cache as
steady-state traffic would).

Warm-up: first the burst of ``warmup_requests`` (sent at once and awaited), then,
unless ``workload.warmup.enabled`` is false, the steady warm-up
(:class:`~orchestrator.workload.warmup_stream.WarmupStream`), at the trial's own load
with prompts of its own.

Indexes: measured requests are ``0 .. num_requests-1``; the burst's are
``-warmup_requests .. -1``; the steady warm-up's count down from
``-warmup_requests - 1`` in the order they are sent. Every index of a
:class:`RequestSet` is unique; warm-up indexes are negative.

Multi-turn sessions (``workload.sessions``): :mod:`orchestrator.workload.sessions`.

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

from pathlib import Path
from typing import Optional, Union

import numpy as np

from orchestrator.workload.arrivals import nominal_rate, sample_arrivals
from orchestrator.workload.datasets import read_dataset
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request
from orchestrator.workload.sessions import build_session_requests
from orchestrator.workload.spec import ConcurrencyArrival, WorkloadSpec
from orchestrator.workload.synthesis import (draw_prefixes, entry_requests, level_streams, make_requests, make_rng,
                                             replicate_streams, sample_lengths, seed_streams)
from orchestrator.workload.tokens import MIN_TOKEN_ID, check_vocab, text_token_ids, token_ids_to_text
from orchestrator.workload.trace import TraceEntry, TraceError, read_trace, resolve_workload_file, select_window
from orchestrator.workload.warmup_stream import WarmupStream, steady_stream

__all__ = ["build_requests", "token_ids_to_text", "text_token_ids", "sample_lengths", "sample_arrivals",
           "load_entries", "MIN_TOKEN_ID", "WarmupStream"]


def build_requests(spec: WorkloadSpec, seed: int, vocab_size: int,
                   base_dir: Optional[Union[str, Path]] = None, level: int = 0, replicate: int = 0) -> RequestSet:
    """The deterministic requests of ``spec`` for ``seed`` at load ``level`` (see the module docstring).

    ``base_dir``: where relative trace and dataset paths start (the study file's folder).
    ``level``: a capacity search's load level; level k > 0 has prompts (and warm-up
    requests) of its own, level 0 the workload's. ``replicate`` r > 0: the level measured
    again, with arrivals, lengths, prefix groups and prompts of its own (streams
    ``(REPLICATE_KEY, r)``): an independent draw of the same workload, the same shared
    prefixes (a trace keeps its timestamps; a dataset its entries).
    """
    check_vocab(vocab_size)
    if level < 0 or replicate < 0:
        raise ValueError(f"level and replicate must be >= 0, got {level}, {replicate}")
    if spec.sessions is not None:
        return build_session_requests(spec, seed, vocab_size, base_dir, level, replicate)
    if spec.trace is not None or spec.dataset is not None:
        return _build_from_file(spec, seed, vocab_size, base_dir, level, replicate)
    seqs = seed_streams(seed)
    own = level_streams(seed, level, seqs, replicate)
    draws = replicate_streams(seed, replicate, seqs, 0)
    n = spec.num_requests

    prefix_rng = make_rng(seqs["prefix"])  # prefix contents first, then the measured requests' groups
    prefixes = draw_prefixes(spec.shared_prefix, prefix_rng, vocab_size) if spec.shared_prefix else None
    measured = make_requests(
        spec=spec, n=n,
        arrivals=sample_arrivals(spec.arrival, n, make_rng(draws["arrivals"])),
        len_rngs=(make_rng(draws["input_len"]), make_rng(draws["output_len"])),
        group_rng=prefix_rng if draws["groups"] is None else make_rng(draws["groups"]),
        prompt_rng=make_rng(own["prompts"]),
        prefixes=prefixes, vocab_size=vocab_size, first_index=0, warmup=False,
    )

    w = spec.warmup_requests
    warm: tuple[Request, ...] = ()
    if w:
        # The warm-up stream splits into its own input_len, output_len, group and prompt streams.
        wr = [make_rng(s) for s in own["warmup"].spawn(4)]
        warm = make_requests(
            spec=spec, n=w, arrivals=np.zeros(w),
            len_rngs=(wr[0], wr[1]), group_rng=wr[2], prompt_rng=wr[3],
            prefixes=prefixes, vocab_size=vocab_size, first_index=-w, warmup=True,
        )

    closed = spec.arrival.concurrency if isinstance(spec.arrival, ConcurrencyArrival) else None
    rate = nominal_rate(spec.arrival, n)
    return RequestSet(warmup=warm, measured=measured, closed_loop_concurrency=closed, requested_rate=rate,
                      warmup_stream=steady_stream(spec, seed, vocab_size, level, rate=rate, concurrency=closed))


def load_entries(spec: WorkloadSpec, base_dir: Optional[Union[str, Path]] = None) -> list[TraceEntry]:
    """Every entry of the workload's trace or dataset file, in file order (checked: :class:`TraceError`)."""
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


def _build_from_file(spec: WorkloadSpec, seed: int, vocab_size: int,
                     base_dir: Optional[Union[str, Path]], level: int = 0, replicate: int = 0) -> RequestSet:
    seqs = seed_streams(seed)
    own = level_streams(seed, level, seqs, replicate)
    draws = replicate_streams(seed, replicate, seqs, level)
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
            order = make_rng(seqs["dataset"]).permutation(len(entries))
        # Level k takes the next n entries of the order: other prompts, as long as the file lasts.
        chosen = [entries[order[(level * n + i) % len(entries)]] for i in range(n)]
        due = sample_arrivals(spec.arrival, n, make_rng(draws["arrivals"]))
        rate = nominal_rate(spec.arrival, n)
        default_prefix = None
        if isinstance(spec.arrival, ConcurrencyArrival):
            closed = spec.arrival.concurrency
    measured = entry_requests(chosen, due, seed=seed, vocab_size=vocab_size, prompt_rng=make_rng(own["prompts"]),
                              default_prefix_len=default_prefix, first_index=0, warmup=False)
    w = spec.warmup_requests
    warm = entry_requests([chosen[i % len(chosen)] for i in range(w)], [0.0] * w, seed=seed,
                          vocab_size=vocab_size, prompt_rng=make_rng(own["warmup"]),
                          default_prefix_len=default_prefix, first_index=-w, warmup=True) if w else ()
    stream = steady_stream(spec, seed, vocab_size, level, rate=rate, concurrency=closed, entries=tuple(chosen),
                           gaps=gaps, default_prefix_len=default_prefix)
    return RequestSet(warmup=warm, measured=measured, closed_loop_concurrency=closed, requested_rate=rate,
                      warmup_stream=stream)
