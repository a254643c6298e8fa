"""The training text of ``make-model --weights trained``: a generated grammar over token ids.

Every machine must train the same model from the same recipe, with no download and no
dependence on the Python version (3.11 and 3.12 ship different standard-library sources),
so the text is generated: a seeded random *grammar* over the ordinary ids of a vocabulary,
drawn with NumPy's PCG64 generator (the same stream on every platform).

The grammar (:class:`Grammar`) gives every id ``k`` successors with peaked probabilities
(some near-ties, most with one clear favourite); the id before the last one rotates which
successor is favoured (an order-2 dependence, so attention, and the KV cache, matter); and
now and then a span earlier in the sequence is copied (what induction, and n-gram
speculation, feed on). Training text also jumps to a uniform random id now and then (so the
random-id prompts of workloads and the probe are in distribution); those jump targets are
left out of the loss, since nothing predicts them.

Held-out text (:func:`heldout_sequences`) is the same grammar from its own stream, without
jumps: its perplexity is what ``training.json`` records and what the probe's
``heldout_perplexity`` measures through the engine.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import numpy as np

from orchestrator.workload.tokens import MIN_TOKEN_ID

# Streams of the one grammar seed: the tables, the held-out text; training text uses the recipe's seed.
_TABLES, _HELDOUT, _TRAIN = 0x6A1, 0x4E1D, 0x7A17
# Held-out text's default seed and shape: the probe and training.json use the same text.
HELDOUT_SEQUENCES = 16
HELDOUT_TOKENS = 256


@dataclass(frozen=True)
class Grammar:
    """The generated language over ``[MIN_TOKEN_ID, ordinary_ids)``."""

    vocab_size: int
    ordinary_ids: int  # ids at and above this are special tokens: never emitted
    seed: int = 0
    successors: int = 4
    peak: float = 3.0  # successor weights are U**peak, normalised: larger is more peaked
    order2_classes: int = 4  # the id before the last rotates the successors by its class
    copy_p: float = 0.02  # chance per position to start copying an earlier span
    copy_len: tuple[int, int] = (8, 32)
    jump_p: float = 0.08  # training text only: chance per position of a uniform random id

    def __post_init__(self):
        if not MIN_TOKEN_ID + 2 * self.successors <= self.ordinary_ids <= self.vocab_size:
            raise ValueError(f"ordinary ids {self.ordinary_ids} do not fit a vocabulary of {self.vocab_size}")

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """(successor ids [vocab, k], cumulative successor probabilities [vocab, k]) for every id."""
        rng = np.random.default_rng([self.seed, _TABLES])
        succ = rng.integers(MIN_TOKEN_ID, self.ordinary_ids, (self.vocab_size, self.successors))
        w = rng.random((self.vocab_size, self.successors)) ** self.peak + 1e-3
        w = -np.sort(-w, axis=1)  # favourite first
        return succ, np.cumsum(w / w.sum(axis=1, keepdims=True), axis=1)

    def sample(self, rows: int, length: int, rng: np.random.Generator, *, jumps: bool) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` sequences of ``length`` ids, and a mask of the positions a model can predict
        (False at the first id and at jump targets)."""
        succ, cum = self.tables()
        x = np.empty((rows, length), dtype=np.int64)
        ok = np.ones((rows, length), dtype=bool)
        r = np.arange(rows)
        x[:, 0] = rng.integers(MIN_TOKEN_ID, self.ordinary_ids, rows)
        x[:, 1] = succ[x[:, 0], 0]
        ok[:, 0] = False
        src = np.full(rows, -1)
        left = np.zeros(rows, dtype=np.int64)
        lo, hi = self.copy_len
        for t in range(2, length):
            u = rng.random(rows)
            # order 2: the class of the id two back rotates which successor the draw picks
            pick = (np.sum(u[:, None] > cum[x[:, t - 1]], axis=1) + x[:, t - 2] % self.order2_classes) % self.successors
            nxt = succ[x[:, t - 1], pick]
            start = (left == 0) & (rng.random(rows) < self.copy_p) & (t > hi)
            src = np.where(start, rng.integers(0, max(1, t - hi), rows), src)
            left = np.where(start, rng.integers(lo, hi + 1, rows), left)
            copying = left > 0
            nxt = np.where(copying, x[r, np.maximum(src, 0)], nxt)
            src, left = np.where(copying, src + 1, src), np.where(copying, left - 1, left)
            if jumps:
                jump = rng.random(rows) < self.jump_p
                # the workload's id range (tokens.MIN_TOKEN_ID .. vocab - MIN_TOKEN_ID), specials included
                nxt = np.where(jump, rng.integers(MIN_TOKEN_ID, self.vocab_size - MIN_TOKEN_ID, rows), nxt)
                ok[:, t] = ~jump
            x[:, t] = nxt
        return x, ok

    def as_dict(self) -> dict:
        return asdict(self)


def training_sequences(grammar: Grammar, rows: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training text (with jumps) of one recipe seed, and its loss mask."""
    return grammar.sample(rows, length, np.random.default_rng([grammar.seed, _TRAIN, seed]), jumps=True)


def heldout_sequences(grammar: Grammar, rows: int = HELDOUT_SEQUENCES, length: int = HELDOUT_TOKENS) -> np.ndarray:
    """Held-out text: the grammar's own stream, no jumps, never trained on."""
    x, _ = grammar.sample(rows, length, np.random.default_rng([grammar.seed, _HELDOUT]), jumps=False)
    return x


def corpus_hash(*arrays: np.ndarray) -> str:
    """Names the exact token ids (training text, mask, held-out text)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).astype(np.int64).tobytes())
    return h.hexdigest()[:16]
