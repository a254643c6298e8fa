"""vLLM V1's scheduler and KV cache manager, modelled step by step without timing.

Follows ``v1/core/sched/scheduler.py`` (``schedule``), ``kv_cache_manager.py`` and
``block_pool.py`` of vLLM 0.29 (see ``notes/vllm-v1-engine-facts.md``):

* running requests first, in admission order, each taking
  min(remaining, long_prefill_token_threshold, budget left); then FCFS (or
  priority) admission, only in a step that preempted nothing;
* ``max_num_seqs`` is checked only at admission; admission needs blocks for the
  whole remaining sequence (``scheduler_reserve_full_isl``) and a failed gate
  stops admission (head-of-line blocking); the last admitted prompt is chunked to
  fill the budget, or stops admission when chunked prefill is off;
* paged KV: ``block_size`` tokens per block, one permanent null block; prefix
  caching hashes full blocks (prompt and generated), looks up at most n-1 tokens
  in whole blocks, and evicts free cached blocks in LRU order when reallocated;
* a running request that cannot get its blocks preempts the last admitted one
  (recompute: blocks freed, computed tokens reset, re-queued at the front).

It never looks at time: :mod:`orchestrator.sim.cost` prices the
:class:`BatchShape` a step produces (Vidur's scheduler / predictor split).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

from orchestrator.engine_args import EngineArgs

_ROOT_HASH = 0x5EED_CAFE  # parent hash of a sequence's first block (vLLM's NONE_HASH)


class SchedRequest:
    """The scheduler's view of one request (mutable, like vLLM's ``Request``)."""

    __slots__ = ("request_id", "uid", "prompt", "num_prompt_tokens", "max_tokens", "num_tokens", "num_output",
                 "num_delivered", "num_computed", "blocks", "block_hashes", "num_cached_blocks", "priority",
                 "arrival", "num_preemptions", "num_cached_tokens", "finished")

    def __init__(self, request_id: str, uid: int, prompt: Sequence[int], max_tokens: int,
                 priority: int = 0, arrival: float = 0.0):
        self.request_id = request_id
        self.uid = uid
        self.prompt = tuple(prompt)
        self.num_prompt_tokens = len(self.prompt)
        self.max_tokens = max_tokens
        # Like vLLM, state advances when a step is *scheduled*: a row that reaches the
        # sequence end adds a placeholder token at once (its value is never needed);
        # the token is delivered when the step's output is processed.
        self.num_tokens = self.num_prompt_tokens  # prompt + generated (placeholders included)
        self.num_output = 0  # tokens scheduled to be sampled
        self.num_delivered = 0  # tokens returned by processed steps
        self.num_computed = 0
        self.blocks: list[int] = []
        self.block_hashes: list[int] = []  # hashes of full blocks known so far
        self.num_cached_blocks = 0  # leading blocks registered in the prefix cache
        self.priority = priority
        self.arrival = arrival
        self.num_preemptions = 0
        self.num_cached_tokens = -1  # prefix-cache hit at first admission (-1: not yet)
        self.finished = False


@dataclass(slots=True)
class BatchShape:
    """What one forward pass computes: the step-time predictor's only input."""

    num_tokens: int = 0  # scheduled tokens (rows of the linear layers)
    num_reqs: int = 0
    num_decodes: int = 0  # one-token rows continuing a generation
    decode_context: int = 0  # KV tokens the decode rows attend to (sum of contexts)
    prefill_tokens: int = 0  # prompt / recompute tokens
    prefill_attn_pairs: int = 0  # causal (query, key) pairs of the prefill chunks
    prefill_context: int = 0  # KV tokens the prefill chunks read (cached prefix + chunk)
    num_sampled: int = 0  # rows that reach the sequence end and sample a token

    @property
    def is_uniform_decode(self) -> bool:
        return self.prefill_tokens == 0 and self.num_decodes > 0


@dataclass
class SchedulerOutput:
    scheduled: list  # [(SchedRequest, num_new_tokens, samples_a_token)] in batch order
    shape: BatchShape
    preempted: list = field(default_factory=list)  # SchedRequests preempted this step


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
        return hash((parent, req.prompt[lo:p] if lo < p else (), req.uid, max(lo, p), hi))

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


class Scheduler:
    """One engine's waiting / running queues and its :class:`KVCacheManager`."""

    def __init__(self, args: EngineArgs, num_blocks: int):
        self.max_num_seqs = int(args.max_num_seqs)
        self.max_num_batched_tokens = int(args.max_num_batched_tokens)
        self.threshold = int(args.long_prefill_token_threshold or 0)
        self.chunked = bool(args.enable_chunked_prefill)
        self.block_size = int(args.block_size)
        self.max_model_len = int(args.max_model_len)
        self.priority = args.scheduling_policy == "priority"
        self.kv = KVCacheManager(num_blocks, self.block_size, bool(args.enable_prefix_caching))
        self.waiting: deque[SchedRequest] = deque()  # fcfs
        self._heap: list = []  # priority: (priority, arrival, seq, request)
        self._seq = itertools.count()
        self.running: list[SchedRequest] = []
        self.requests: dict[str, SchedRequest] = {}
        # Counters (vLLM metric semantics where one exists).
        self.num_preemptions = 0
        self.prefix_cache_queries = 0  # tokens looked up by new (not resumed) requests, at admission
        self.prefix_cache_hits = 0
        self.prompt_tokens_computed = 0  # prefill + recompute tokens actually run
        self.generation_tokens = 0

    # ---------------------------------------------------------------- queues
    @property
    def num_waiting(self) -> int:
        return len(self._heap) if self.priority else len(self.waiting)

    def _push_waiting(self, req: SchedRequest, front: bool = False) -> None:
        if self.priority:
            heapq.heappush(self._heap, (req.priority, req.arrival, next(self._seq), req))
        elif front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _peek_waiting(self) -> SchedRequest:
        return self._heap[0][3] if self.priority else self.waiting[0]

    def _pop_waiting(self) -> None:
        if self.priority:
            heapq.heappop(self._heap)
        else:
            self.waiting.popleft()

    def add_request(self, req: SchedRequest) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} already exists")
        self.requests[req.request_id] = req
        self._push_waiting(req)

    def abort(self, request_id: str) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        req.finished = True
        if req in self.running:
            self.running.remove(req)
            self.kv.free(req)
        elif self.priority:
            self._heap = [e for e in self._heap if e[3] is not req]
            heapq.heapify(self._heap)
        else:
            self.waiting.remove(req)
        return True

    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    # ---------------------------------------------------------------- one step
    @staticmethod
    def _account(shape: BatchShape, req: SchedRequest, n: int, sign: int = 1) -> None:
        """Add (or, with sign -1, refund) one request's rows to the batch shape."""
        c = req.num_computed
        shape.num_tokens += sign * n
        shape.num_reqs += sign
        if n == 1 and req.num_output > 0 and c == req.num_tokens - 1:
            shape.num_decodes += sign
            shape.decode_context += sign * (c + 1)
        else:
            shape.prefill_tokens += sign * n
            shape.prefill_attn_pairs += sign * (n * c + n * (n + 1) // 2)
            shape.prefill_context += sign * (c + n)
        if c + n >= req.num_tokens:
            shape.num_sampled += sign

    def _preempt(self, req: SchedRequest) -> None:
        self.kv.free(req)
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._push_waiting(req, front=True)

    def schedule(self) -> SchedulerOutput:
        """Pick the next step's rows and advance request state as vLLM does at schedule time."""
        budget = self.max_num_batched_tokens
        threshold = self.threshold
        bs = self.block_size
        kv = self.kv
        caching = kv.caching
        shape = BatchShape()
        scheduled: list = []
        preempted: list = []
        running = self.running

        # 1. Running requests, in admission order.
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.num_output >= req.max_tokens:
                i += 1  # async scheduling: its last token is in flight, nothing left to run
                continue
            c = req.num_computed
            n = req.num_tokens - c
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            need = -(-(c + n) // bs) - len(req.blocks)
            if need > 0 and not kv.grow(req, need):
                while True:  # preempt until it fits or the request preempts itself
                    if self.priority:
                        victim = max(running, key=lambda r: (r.priority, r.arrival))
                        vi = running.index(victim)
                        del running[vi]
                        if vi < i:
                            i -= 1
                            budget += self._refund(scheduled, shape, victim)
                    else:
                        victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req or kv.grow(req, need):
                        break
                if victim is req:
                    break
            if caching:
                t = c + n if c + n < req.num_tokens else req.num_tokens
                if t // bs > req.num_cached_blocks:
                    kv.cache_blocks(req, t)
            scheduled.append((req, n, c + n >= req.num_tokens))
            self._account(shape, req, n)
            budget -= n
            i += 1

        # 2. Waiting requests, only if nothing was preempted.
        if not preempted:
            skipped = []
            while budget > 0 and self.num_waiting and len(running) < self.max_num_seqs:
                req = self._peek_waiting()
                if req.num_output >= req.max_tokens:
                    self._pop_waiting()  # preempted with its last token in flight: nothing to run
                    skipped.append(req)
                    continue
                hits = kv.lookup(req) if caching else []
                hit_tokens = len(hits) * bs
                n = req.num_tokens - hit_tokens
                if 0 < threshold < n:
                    n = threshold
                if not self.chunked and n > budget:
                    break
                if n > budget:
                    n = budget
                if not kv.admit(req, hits, n):
                    break  # head-of-line blocking: nothing behind it is tried
                self._pop_waiting()
                if caching and req.num_preemptions == 0:
                    self.prefix_cache_queries += req.num_tokens
                    self.prefix_cache_hits += hit_tokens
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = hit_tokens
                req.num_computed = hit_tokens
                running.append(req)
                scheduled.append((req, n, hit_tokens + n >= req.num_tokens))
                self._account(shape, req, n)
                budget -= n
            for req in reversed(skipped):
                self._push_waiting(req, front=True)

        # 3. Advance state now (vLLM's _update_after_schedule), placeholders for sampled rows.
        prompt_rows = 0
        for req, n, sampled in scheduled:
            if not (n == 1 and req.num_output > 0 and req.num_computed == req.num_tokens - 1):
                prompt_rows += n  # prefill or recompute rows
            req.num_computed += n
            if sampled:
                req.num_tokens += 1
                req.num_output += 1
        self.prompt_tokens_computed += prompt_rows
        return SchedulerOutput(scheduled, shape, preempted)

    def _refund(self, scheduled: list, shape: BatchShape, victim: SchedRequest) -> int:
        """Take a request scheduled earlier this step back out of it (priority preemption)."""
        for k, (r, m, _) in enumerate(scheduled):
            if r is victim:
                del scheduled[k]
                self._account(shape, r, m, -1)
                return m
        return 0

    def update(self, out: SchedulerOutput) -> list:
        """Process a step's output: [(request, new_tokens, finished)] in batch order.

        Finished requests leave ``running`` and free their blocks only here, so with
        async scheduling the step scheduled meanwhile still counted them.
        """
        results = []
        done = []
        for req, n, sampled in out.scheduled:
            if req.finished:  # aborted meanwhile
                continue
            if not sampled:
                results.append((req, 0, False))
                continue
            req.num_delivered += 1
            self.generation_tokens += 1
            if req.num_delivered >= req.max_tokens:
                req.finished = True
                done.append(req)
                results.append((req, 1, True))
            else:
                results.append((req, 1, False))
        if done:
            for req in done:
                self.requests.pop(req.request_id, None)
                self.kv.free(req)
            gone = set(map(id, done))
            before = len(self.running)
            self.running = [r for r in self.running if id(r) not in gone]
            if before - len(self.running) < len(done):  # preempted with the last token in flight
                for req in done:
                    if self.priority:
                        self._heap = [e for e in self._heap if e[3] is not req]
                        heapq.heapify(self._heap)
                    elif req in self.waiting:
                        self.waiting.remove(req)
        return results
