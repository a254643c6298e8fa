"""Multi-turn sessions as requests: every turn resends the conversation so far plus a new user message.

``workload.sessions`` makes the measured requests the turns of ``num_requests`` sessions.
Sessions start at the arrival process's times (``workload.arrival``: sessions per second), or
at a session trace's timestamps. Turn k of a session asks for ``output_len`` tokens (with
``ignore_eos``, as every workload) and its prompt is::

    [shared prefix] user_1 answer_1 user_2 answer_2 ... user_k

The answers in the history are the workload's, not the engine's: each turn's answer is
pre-generated (random token ids of the turn's ``output_len``, or, for ShareGPT, the recorded
answer's text), so the requests are fixed before the load starts, identical for every trial,
and the virtual and served simulator send the same tokens. The price: vLLM's prefix cache
hits only on tokens it has seen, and the engine's own answer (sampled from its weights) is not
the pre-generated one, so a turn's cache hit ends where the previous turn's *prompt* ended
(``Request.history_len``), not after the previous answer. :func:`expected_prefix_hit_rate` is
that share of the prompt tokens; it is what the engine-measured ``prefix_cache_hit_rate`` should
approach (less the partial last block of each prompt, and less whatever the cache evicted).

Turn k+1 is sent ``think_s`` after turn k's answer *ended* (closed loop within a session, open
loop across sessions): its ``arrival_s`` is its session's start and ``think_s`` its think time;
the load generator (:mod:`orchestrator.loadgen.load_window`) and the virtual simulator
(:mod:`orchestrator.sim.virtual`) schedule it when the answer ends. A failed turn does not
end its session (the history is the workload's, so the next prompt is the same either way).

Seeded streams (see :mod:`.generate`): the session starts use the ``arrivals`` stream (or the
level's, as single requests do); turns, user lengths, answer lengths and think times come from
``(SESSION_KEY, replicate, level)``; the user messages' and answers' token ids from the level's
``prompts`` stream; shared prefixes (system prompts on the first turn) as single requests do.
Warm-up: ``warmup_requests`` single requests shaped like sessions' first turns (prompts of their
own); no steady warm-up (its judge compares windows of independent requests; a session
workload's windows are not independent: use ``warmup_s`` to leave the first sessions out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from orchestrator.workload.arrivals import nominal_rate, sample_arrivals
from orchestrator.workload.request_set import RequestSet
from orchestrator.workload.requests import Request
from orchestrator.workload.session_files import SessionShape, SessionTurn, read_session_file
from orchestrator.workload.spec import WorkloadSpec
from orchestrator.workload.synthesis import (draw_prefixes, level_streams, make_rng, replicate_streams, sample_lengths,
                                             seed_streams, token_list)
from orchestrator.workload.tokens import MIN_TOKEN_ID, text_token_ids, token_ids_to_text
from orchestrator.workload.trace import resolve_workload_file

__all__ = ["SESSION_KEY", "build_session_requests", "expected_prefix_hit_rate", "load_sessions", "session_shapes"]

# Spawn key of the sessions' own streams: (SESSION_KEY, replicate, level) -> turns, input_len,
# output_len, think (a fixed number beside synthesis's LEVEL_KEY..REMEASURE_KEY).
SESSION_KEY = 1004


def load_sessions(spec: WorkloadSpec, base_dir: Optional[Union[str, Path]] = None) -> list[SessionShape]:
    """Every session of ``sessions.file``, in file order (checked: :class:`TraceError`)."""
    f = spec.sessions.file
    return read_session_file(f.format, resolve_workload_file(f.path, base_dir), f.output_len, f.timestamps)


def session_shapes(spec: WorkloadSpec, n: int, streams: Sequence[np.random.SeedSequence]) -> list[SessionShape]:
    """``n`` synthetic sessions: turns, user lengths, answer lengths, think times from the spec."""
    rng_turns, rng_in, rng_out, rng_think = (make_rng(s) for s in streams)
    turns = sample_lengths(spec.sessions.turns, n, rng_turns)
    total = int(turns.sum())
    user = sample_lengths(spec.input_len, total, rng_in).tolist()
    out = sample_lengths(spec.output_len, total, rng_out).tolist()
    think = (sample_lengths(spec.sessions.think_time_ms, total, rng_think) / 1000.0).tolist() \
        if spec.sessions.think_time_ms is not None else [0.0] * total
    shapes, i = [], 0
    for t in turns.tolist():
        shapes.append(SessionShape(tuple(SessionTurn(output_len=int(out[j]), user_len=int(user[j]), think_s=think[j])
                                         for j in range(i, i + t))))
        i += t
    return shapes


def _think_times(shapes: list[SessionShape], spec: WorkloadSpec, rng: np.random.Generator,
                 scale: float) -> list[list[float]]:
    """Each turn's think time: the file's (scaled), else a draw from ``think_time_ms`` (else 0)."""
    dist = spec.sessions.think_time_ms
    need = sum(len(s.turns) for s in shapes)
    drawn = (sample_lengths(dist, need, rng) / 1000.0).tolist() if dist is not None else [0.0] * need
    out, i = [], 0
    for s in shapes:
        out.append([t.think_s * scale if t.think_s is not None else drawn[i + k] for k, t in enumerate(s.turns)])
        i += len(s.turns)
    return out


def build_session_requests(spec: WorkloadSpec, seed: int, vocab_size: int,
                           base_dir: Optional[Union[str, Path]] = None, level: int = 0,
                           replicate: int = 0) -> RequestSet:
    """The turns of ``num_requests`` sessions as measured requests, and a warm-up burst."""
    sp = spec.sessions
    seqs = seed_streams(seed)
    own = level_streams(seed, level, seqs, replicate)
    draws = replicate_streams(seed, replicate, seqs, level)
    mine = np.random.SeedSequence(seed, spawn_key=(SESSION_KEY, replicate, level)).spawn(4)
    n = spec.num_requests
    scale = 1.0
    if sp.file is None:
        shapes = session_shapes(spec, n, mine)
    else:
        every = load_sessions(spec, base_dir)
        order = make_rng(seqs["dataset"]).permutation(len(every)) if sp.file.shuffle else np.arange(len(every))
        shapes = [every[order[(level * n + i) % len(every)]] for i in range(n)]  # level k: the next n sessions
        scale = sp.file.time_scale
    thinks = _think_times(shapes, spec, make_rng(mine[3]), scale) if sp.file is not None \
        else [[t.think_s for t in s.turns] for s in shapes]
    if sp.file is not None and sp.file.timestamps:
        first = min(s.start_s for s in shapes)
        starts = np.sort(np.array([(s.start_s - first) * scale for s in shapes]))
        span = float(starts[-1] - starts[0]) if n > 1 else 0.0
        rate = (n - 1) / span if span > 0 else None
    else:
        starts = sample_arrivals(spec.arrival, n, make_rng(draws["arrivals"]))
        rate = nominal_rate(spec.arrival, n)

    prefix_rng = make_rng(seqs["prefix"])
    prefixes = draw_prefixes(spec.shared_prefix, prefix_rng, vocab_size) if spec.shared_prefix else None
    groups = [-1] * n
    if prefixes is not None:
        group_rng = prefix_rng if draws["groups"] is None else make_rng(draws["groups"])
        uses = group_rng.random(n) < spec.shared_prefix.fraction
        groups = np.where(uses, group_rng.integers(0, spec.shared_prefix.groups, size=n), -1).tolist()

    prompt_rng = make_rng(own["prompts"])
    measured: list[Request] = []
    seen: set[int] = set()  # groups whose prefix an earlier session sent: a first turn hits it
    for s, (shape, start) in enumerate(zip(shapes, starts.tolist())):
        prefix = token_list(prefixes[groups[s]], vocab_size) if groups[s] >= 0 and not shape.text else []
        measured += _session_turns(shape, s, float(start), thinks[s], prefix, groups[s], sp.max_prompt_len,
                                   prompt_rng, vocab_size, first_index=len(measured),
                                   first_hit=len(prefix) if groups[s] in seen else 0)
        seen.add(groups[s])
    warm = _warmup(shapes, spec.warmup_requests, make_rng(own["warmup"]), vocab_size)
    return RequestSet(warmup=warm, measured=tuple(measured), requested_rate=rate, sessions=n)


def _ids(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    return token_list(rng.integers(MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID, size=n, dtype=np.int64), vocab_size)


def _session_turns(shape: SessionShape, session: int, start: float, thinks: list[float], prefix: list[int],
                   group: int, max_prompt_len: Optional[int], rng: np.random.Generator, vocab_size: int,
                   first_index: int, first_hit: int = 0) -> list[Request]:
    """The requests of one session's turns (ids drawn in turn order: user message, then its answer)."""
    text = shape.text
    history: list = list(prefix) if not text else []
    segments: list[int] = []
    out: list[Request] = []
    prev_len = first_hit
    for k, turn in enumerate(shape.turns):
        if text:
            user = turn.user_text.split()
        else:
            user = _ids(rng, turn.user_len, vocab_size)
        prompt = history + user
        if max_prompt_len is not None and len(prompt) > max_prompt_len:
            if k > 0:
                break  # the conversation outgrew the context: the session ends here
            prompt, user = prompt[:max_prompt_len], user[:max(0, max_prompt_len - len(history))]
        segs = segments + [len(prompt) - sum(segments)] if k == 0 else segments + [len(user)]
        if text:
            prompt_text = " ".join(prompt)
            ids, ptext = text_token_ids(prompt_text, vocab_size), prompt_text
        else:
            ids, ptext = tuple(prompt), None
        out.append(Request(index=first_index + k, arrival_s=start, prompt_token_ids=tuple(ids),
                           output_len=turn.output_len, prefix_group=group if group >= 0 else None,
                           prompt_text=ptext, session=session, turn=k + 1, think_s=float(thinks[k]) if k else 0.0,
                           segments=tuple(segs), history_len=prev_len))
        prev_len = len(prompt)
        if turn.answer_text is not None:
            answer = turn.answer_text.split()
        else:
            answer = _ids(rng, turn.output_len, vocab_size)
            if text:
                answer = token_ids_to_text(answer).split()
        history = prompt + answer
        segments = segs + [len(answer)]
    return out


def _warmup(shapes: list[SessionShape], w: int, rng: np.random.Generator, vocab_size: int) -> tuple[Request, ...]:
    """``w`` single requests shaped like sessions' first turns, with prompts of their own."""
    out = []
    for i in range(w):
        first = shapes[i % len(shapes)].turns[0]
        length = first.user_len if first.user_text is None else max(1, len(first.user_text.split()))
        out.append(Request(index=-w + i, arrival_s=0.0, prompt_token_ids=tuple(_ids(rng, length, vocab_size)),
                           output_len=first.output_len, warmup=True))
    return tuple(out)


def expected_prefix_hit_rate(requests: Sequence[Request]) -> Optional[float]:
    """The share of the prompt tokens of ``requests`` that repeat the previous turn's prompt of their
    session: what the prefix cache can serve (the previous answer is the workload's, not the engine's;
    see the module docstring). Shared prefixes across sessions are not counted. None without requests."""
    total = sum(r.prompt_len for r in requests if not r.warmup)
    return sum(r.history_len for r in requests if not r.warmup) / total if total else None
