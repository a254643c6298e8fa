"""Synthetic logprobs for the simulated engine, in vLLM's response shapes.

The simulator has no model: its completion is the token `` tok`` repeated, and its logprobs
are made up. They are deterministic (the same request gets the same numbers: a position's
values are seeded by the request's ``seed``, its prompt and the position) and plausible (a
probability distribution: negative, the chosen token's and its alternatives' probabilities
sum to at most 1, alternatives sorted most likely first), so clients that read logprobs can
be tested. A generated token is always the most likely one (rank 1); a prompt token
(``echo``, ``prompt_logprobs``) has a rank of its own; the first prompt token has none
(``null``), as in vLLM.

vLLM's per-position list puts the chosen token first, then the ``N`` most likely (the
chosen one not repeated). Completions show the first ``N + 1`` of it as
``top_logprobs: {token: logprob}``; chat the first ``N`` as ``top_logprobs: [{token,
logprob, bytes}]``.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from orchestrator.workload.tokens import MIN_TOKEN_ID, text_token_ids

GENERATED_TEXT = " tok"  # every token the simulator generates


@dataclass(frozen=True)
class Candidate:
    token_id: int
    text: str
    logprob: float
    rank: int


Step = Optional[list[Candidate]]  # None: no logprob (the first prompt token)


def generated_token_id(vocab_size: int) -> int:
    return text_token_ids(GENERATED_TEXT, vocab_size)[0]


def prompt_tokens(text: str) -> list[str]:
    """The prompt's tokens as text, one a word (the simulator's encoding), spaces kept so
    that they join back into ``text`` exactly (``text_offset`` depends on it)."""
    words = re.findall(r"\s*\S+", text)
    if not words:
        return [text]
    tail = len(text) - sum(len(w) for w in words)
    if tail:
        words[-1] += text[-tail:]
    return words


class LogprobSource:
    """The logprobs of one engine request (one prompt): the same request, the same numbers."""

    def __init__(self, prompt_ids: Sequence[int], seed: Optional[int], vocab_size: int, sample: int = 0):
        self.key = f"{seed}:{zlib.crc32(repr(tuple(prompt_ids)).encode())}"
        # The n sequences of one prompt (``n > 1``) share the prompt's logprobs, not their samples'.
        self.sample_key = self.key if sample == 0 else f"{self.key}:s{sample}"
        self.vocab_size = vocab_size

    def _step(self, token_id: int, text: str, top: int, rank: int, rng: random.Random) -> list[Candidate]:
        # A distribution over the ranks needed: the most likely gets 35-95 %, each next a share of the rest.
        size = max(top, rank)
        probs = [rng.uniform(0.35, 0.95)]
        rest = 1.0 - probs[0]
        others = []
        for _ in range(size - 1):
            p = rest * rng.uniform(0.15, 0.6)
            rest -= p
            others.append(p)
        probs += sorted(others, reverse=True)
        lo, hi = MIN_TOKEN_ID, max(MIN_TOKEN_ID + 1, self.vocab_size - MIN_TOKEN_ID)
        used = {token_id}
        out = [Candidate(token_id, text, math.log(probs[rank - 1]), rank)]
        for r in range(1, top + 1):
            if r == rank:
                continue
            alt = rng.randrange(lo, hi)
            while alt in used:
                alt = rng.randrange(lo, hi)
            used.add(alt)
            out.append(Candidate(alt, f" t{alt}", math.log(probs[r - 1]), r))
        return out

    def generated(self, position: int, top: int) -> list[Candidate]:
        rng = random.Random(f"{self.sample_key}:g{position}")
        return self._step(generated_token_id(self.vocab_size), GENERATED_TEXT, top, 1, rng)

    def prompt(self, ids: Sequence[int], texts: Sequence[str], top: int) -> list[Step]:
        steps: list[Step] = [None]
        for i in range(1, len(ids)):
            rng = random.Random(f"{self.key}:p{i}")
            rank = 1 if rng.random() < 0.5 else rng.randint(2, 8)  # prompt text is often not the likeliest
            steps.append(self._step(ids[i], texts[i], top, rank, rng))
        return steps


def as_token_ids(steps: Sequence[Step], ids: Sequence[int]) -> tuple[list[Step], list[str]]:
    """vLLM's ``return_tokens_as_token_ids``: every token, chosen or candidate, named
    ``token_id:<id>`` (``ids``: the chosen ones, whose step may have no candidates)."""
    named = [None if step is None else [replace(c, text=f"token_id:{c.token_id}") for c in step] for step in steps]
    return named, [f"token_id:{i}" for i in ids]


# ---- vLLM's response shapes

def completion_logprobs(steps: Sequence[Step], texts: Sequence[str], top: int, offset: int = 0) -> dict:
    """Completions' ``logprobs``: ``{text_offset, token_logprobs, tokens, top_logprobs}``."""
    text_offset, token_logprobs, top_logprobs = [], [], []
    for step, text in zip(steps, texts):
        text_offset.append(offset)
        offset += len(text)
        if step is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
        else:
            token_logprobs.append(step[0].logprob)
            top_logprobs.append({c.text: c.logprob for c in step[:top + 1]})
    return {"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": list(texts),
            "top_logprobs": top_logprobs}


def _entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", errors="replace"))}


def chat_logprobs(steps: Sequence[Step], texts: Sequence[str], top: int) -> dict:
    """Chat's ``logprobs``: ``{content: [{token, logprob, bytes, top_logprobs}]}``."""
    content = []
    for step, text in zip(steps, texts):
        if step is None:
            content.append({"token": text, "logprob": -9999.0, "bytes": list(text.encode()), "top_logprobs": []})
        else:
            content.append({**_entry(text, step[0].logprob),
                            "top_logprobs": [_entry(c.text, c.logprob) for c in step[:top]]})
    return {"content": content}


def prompt_logprobs_field(steps: Sequence[Step]) -> list:
    """vLLM's ``prompt_logprobs`` field: per prompt token ``{token_id: {logprob, rank, decoded_token}}``."""
    return [None if step is None else
            {str(c.token_id): {"logprob": c.logprob, "rank": c.rank, "decoded_token": c.text} for c in step}
            for step in steps]
