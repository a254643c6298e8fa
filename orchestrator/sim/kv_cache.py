"""vLLM V1's KV cache manager for one full-attention group: the block pool and the prefix cache.

Follows ``v1/core/kv_cache_manager.py`` and ``block_pool.py`` of vLLM 0.29: paged KV,
``block_size`` tokens per block, one permanent null block; prefix caching hashes full
blocks (prompt and generated), looks up at most n-1 tokens in whole blocks, and evicts
free cached blocks in LRU order when reallocated. Admission needs blocks for the whole
remaining sequence (``allocate_slots(full_sequence_must_fit=True)``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from orchestrator.sim.sched_request import SchedRequest

__all__ = ["KVCacheManager"]

_ROOT_HASH = 0x5EED_CAFE  # parent hash of a sequence's first block (vLLM's NONE_HASH)


class KVCacheManager:
    """Block pool + prefix cache of one KV cache group (full attention)."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool):
        if num_blocks < 2:
            raise ValueError("need at least 2 KV blocks (one is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = enable_caching
        self.ref = [0] * num_blocks
        self.ref[0] = 1  # block 0: the permanent null block, never free
        self.bhash: list[Optional[int]] = [None] * num_blocks
        # The free queue is [unhashed blocks][hashed blocks, LRU first]: unhashed ones are
        # prepended, hashed ones appended, so the two parts never interleave.
        self.free_plain: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() = front
        self.free_cached: OrderedDict[int, None] = OrderedDict()
        self.cached: dict[int, list[int]] = {}  # hash -> blocks holding it (first is returned)

    # ---------------------------------------------------------------- pool
    @property
    def num_free(self) -> int:
        return len(self.free_plain) + len(self.free_cached)

    def usage(self) -> float:
        return 1.0 - self.num_free / (self.num_blocks - 1)

    def _pop_free(self, n: int) -> list[int]:
        out = []
        plain, fc, ref = self.free_plain, self.free_cached, self.ref
        for _ in range(n):
            if plain:
                b = plain.pop()
            else:
                b, _ = fc.popitem(last=False)  # evict the least recently freed cached block
                self._evict(b)
            ref[b] = 1
            out.append(b)
        return out

    def _evict(self, b: int) -> None:
        h = self.bhash[b]
        self.bhash[b] = None
        holders = self.cached.get(h)
        if holders is not None:
            holders.remove(b)
            if not holders:
                del self.cached[h]

    def free(self, req: SchedRequest) -> None:
        """Release a request's blocks tail first (so its tail is evicted first)."""
        ref, bhash = self.ref, self.bhash
        plain, fc = self.free_plain, self.free_cached
        for b in reversed(req.blocks):
            ref[b] -= 1
            if ref[b] == 0:
                if bhash[b] is None:
                    plain.append(b)
                else:
                    fc[b] = None
        req.blocks = []
        req.num_cached_blocks = 0

    # ---------------------------------------------------------------- prefix cache
    def block_hash(self, req: SchedRequest, i: int, parent: int) -> int:
        """Hash of block ``i``: (parent, its prompt token ids, its generated tokens).

        Generated tokens are not simulated as ids: they are named by (request uid,
        position), so they hash uniquely per request, as sampled text would.
        """
        bs = self.block_size
        lo, hi = i * bs, (i + 1) * bs
        p = req.num_prompt_tokens
        if hi <= p:
            return hash((parent, req.prompt[lo:hi]))
        if lo < p:
            return hash((parent, req.prompt[lo:p], req.uid, p, hi))
        return hash((parent, (), req.uid, lo, hi))

    def extend_hashes(self, req: SchedRequest, num_tokens: int) -> None:
        hashes = req.block_hashes
        for i in range(len(hashes), num_tokens // self.block_size):
            hashes.append(self.block_hash(req, i, hashes[-1] if hashes else _ROOT_HASH))

    def lookup(self, req: SchedRequest) -> list[int]:
        """Cached blocks of the longest prefix hit, capped at num_tokens - 1 in whole blocks."""
        if not self.caching:
            return []
        max_blocks = (req.num_tokens - 1) // self.block_size
        self.extend_hashes(req, max_blocks * self.block_size)
        hits = []
        cached = self.cached
        for h in req.block_hashes[:max_blocks]:
            holders = cached.get(h)
            if holders is None:
                break
            hits.append(holders[0])
        return hits

    def cache_blocks(self, req: SchedRequest, num_tokens: int) -> None:
        """Register the request's full blocks up to ``num_tokens`` in the prefix cache."""
        full = num_tokens // self.block_size
        if full <= req.num_cached_blocks:
            return
        self.extend_hashes(req, num_tokens)
        bhash, cached = self.bhash, self.cached
        for i in range(req.num_cached_blocks, full):
            b = req.blocks[i]
            if bhash[b] is None:
                h = req.block_hashes[i]
                bhash[b] = h
                holders = cached.get(h)
                if holders is None:
                    cached[h] = [b]
                else:
                    holders.append(b)
        req.num_cached_blocks = full

    # ---------------------------------------------------------------- allocation
    def admit(self, req: SchedRequest, hits: list[int], num_new: int) -> bool:
        """Allocate for a waiting request (``allocate_slots(full_sequence_must_fit=True)``).

        Fails unless blocks for the whole sequence fit, counting hit blocks that must
        leave the free queue. On success the hits are taken and the first chunk's
        blocks allocated.
        """
        bs, ref = self.block_size, self.ref
        evictable = sum(1 for b in hits if ref[b] == 0)
        need_full = -(-req.num_tokens // bs) - len(hits) + evictable
        if need_full > self.num_free:
            return False
        for b in hits:  # touch: a hit on a free cached block takes it off the queue
            if ref[b] == 0:
                del self.free_cached[b]
            ref[b] += 1
        req.blocks = list(hits)
        req.num_cached_blocks = len(hits)
        computed = len(hits) * bs
        need = -(-(computed + num_new) // bs) - len(hits)
        if need > 0:
            req.blocks += self._pop_free(need)
        if self.caching:
            self.cache_blocks(req, min(computed + num_new, req.num_tokens))
        return True

    def grow(self, req: SchedRequest, need: int) -> bool:
        """Give a running request ``need`` more blocks, or fail without side effects."""
        if need > self.num_free:
            return False
        req.blocks += self._pop_free(need)
        return True
