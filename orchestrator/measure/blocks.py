"""Blocks of a window's requests for the bootstrap (:mod:`orchestrator.measure.confidence`): how a window
is cut into runs of consecutive requests, the Poisson weights each resample gives a block (drawn from a
stream named by the block, so that one draw of requests is resampled alike wherever it is measured),
and weighted means and quantiles over the weighted requests. Pure: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from orchestrator.measure.records import RequestRecord

__all__ = ["BLOCK_S", "Blocks", "MIN_BLOCKS", "SortedByBlock", "block_requests_for", "block_weights", "cut_blocks",
           "weighted_means"]

BLOCK_S = 2.0  # seconds of due times per block (benchmarks/ci_coverage.py)
MIN_BLOCKS = 6  # a shorter window gets shorter blocks: a bootstrap over two or three blocks is no spread


@dataclass(frozen=True)
class Blocks:
    of_request: np.ndarray  # block index of each request (0..k-1)
    seconds: np.ndarray  # (k,) the seconds each block stands for (their sum: the windows' durations)
    keys: tuple[tuple[int, int], ...]  # (window, j) of each block: j-th run of consecutive requests
    duration: float = 0.0  # the windows' durations, summed

    @property
    def count(self) -> int:
        return len(self.seconds)


def block_requests_for(rate: float, requests: int, block_s: float = BLOCK_S) -> int:
    """Requests per block at ``rate`` requests per second for a window of ``requests``: ``block_s``
    seconds of them, fewer when the window holds fewer than :data:`MIN_BLOCKS` such blocks."""
    per = max(1, int(round(block_s * rate))) if rate > 0 else 1
    return max(1, min(per, requests // MIN_BLOCKS))


def cut_blocks(records: Sequence[RequestRecord], block_s: float, block_requests: Optional[int] = None) -> Blocks:
    """Blocks of consecutive requests (by their index in the window's draw), window by window:
    ``block_requests`` each, or ``block_s`` seconds of the window's own rate (fewer in a window shorter
    than :data:`MIN_BLOCKS` of them). A block is named by its position in its window, so that two
    windows of one draw, at one rate or another (a capacity search's levels replay one draw, time
    scaled), cut the same requests into the same blocks. A window's duration (first send to last end,
    as :func:`orchestrator.measure.metrics.summarise`) is shared out over its blocks by their requests."""
    by_window: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        by_window.setdefault(r.window, []).append(i)
    of_request = np.zeros(len(records), dtype=np.int64)
    seconds: list[float] = []
    keys: list[tuple[int, int]] = []
    total = 0.0
    for w, idx in sorted(by_window.items()):
        recs = [records[i] for i in idx]
        due = np.array([r.scheduled_s for r in recs], dtype=float)
        span = float(due.max() - due.min())
        per = block_requests or block_requests_for((len(recs) - 1) / span if span > 0 else 0.0, len(recs), block_s)
        position = np.array([r.index for r in recs], dtype=np.int64)
        local = (position - position.min()) // per
        used, local = np.unique(local, return_inverse=True)  # blocks without a request are dropped
        of_request[idx] = local + len(seconds)
        keys.extend((int(w), int(j)) for j in used)
        sends = [r.sent_s for r in recs if r.sent_s is not None]
        ends = [e for r in recs for e in ((r.end_s if r.success else (r.finished_s or r.end_s)),) if e is not None]
        duration = (max(ends + sends) - min(sends)) if sends else 0.0
        share = np.bincount(local, minlength=len(used)).astype(float) / max(len(recs), 1) * max(duration, 1e-9)
        seconds.extend(share.tolist())
        total += max(duration, 1e-9 * len(used))
    return Blocks(of_request, np.asarray(seconds, dtype=float), tuple(keys), total)


def block_weights(blocks: Blocks, seed: int, samples: int) -> np.ndarray:
    """``(samples, k)`` bootstrap weights of the blocks: Poisson(1) each (the Poisson bootstrap), drawn
    from a stream of the block's own name (window, position) and ``seed``, so that every set of records
    cut from one draw of requests, in any trial, gives a block the same weight in every resample: their
    draws are paired."""
    out = np.empty((samples, blocks.count))
    for col, (w, j) in enumerate(blocks.keys):
        out[:, col] = np.random.default_rng(np.random.SeedSequence([seed, 31337, w, j])).poisson(1.0, samples)
    return out


class SortedByBlock:
    """A family's values sorted once, with each block's running count along them: the weighted
    quantiles of every draw found by bisection (``log2(n)`` steps of ``(B, k)`` work) instead of a
    cumulative sum over every value per draw (``(B, n)``: ITL has a value per token)."""

    def __init__(self, values: np.ndarray, groups: np.ndarray, k: int):
        order = np.argsort(values, kind="stable")
        self.values = values[order]
        g = groups[order]
        self.running = np.zeros((len(g) + 1, k), dtype=np.int32)  # [i, blk]: values of blk among the first i
        np.add.at(self.running[1:], (np.arange(len(g)), g), 1)
        np.cumsum(self.running, axis=0, out=self.running)

    def quantiles(self, counts: np.ndarray, q: float) -> np.ndarray:
        """Per draw (row of ``counts``, (B, k)): the ``q`` quantile of the values each weighted by its
        block's count (inverted CDF). NaN when a draw holds no value."""
        n = len(self.values)
        total = counts @ self.running[n]
        target = np.maximum(q * total, 1e-12)
        lo = np.zeros(len(counts), dtype=np.int64)  # the answer: the first i with cum(i + 1) >= target
        hi = np.full(len(counts), n - 1, dtype=np.int64)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            cum = np.einsum("bk,bk->b", self.running[mid + 1], counts)
            reached = cum >= target
            hi = np.where(reached, mid, hi)
            lo = np.where(reached, lo, mid + 1)
        out = self.values[np.minimum(lo, n - 1)].astype(float)
        out[total <= 0] = np.nan
        return out


def weighted_means(values: np.ndarray, groups: np.ndarray, counts: np.ndarray) -> np.ndarray:
    k = counts.shape[1]
    sums = np.bincount(groups, weights=values, minlength=k)
    ns = np.bincount(groups, minlength=k).astype(float)
    num, den = counts @ sums, counts @ ns
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)
