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

As in vLLM, request state advances when a step is scheduled (a row that samples
adds a placeholder token) and finished requests leave only when the step's output
is processed (:meth:`Scheduler.update`), so async scheduling is modelled by
scheduling step N+1 before processing step N. Generation ends at ``max_tokens``
(no EOS). Counters follow vLLM's /metrics where one exists.

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

    __slots__ = ("request_id", "uid", "prompt", "num_prompt_tokens", "max_tokens", "num_tokens",
                 "num_delivered", "num_computed", "blocks", "block_hashes", "num_cached_blocks", "priority",
                 "arrival", "num_preemptions", "num_cached_tokens", "finished", "mark")

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
        # Decode fast path: while num_tokens < mark, the next step is a plain decode that
        # needs no new block, fills no block and is not the last token. 0: take the slow path.
        self.mark = 0

    @property
    def num_output(self) -> int:
        """Tokens generated or scheduled to be (placeholders included)."""
        return self.num_tokens - self.num_prompt_tokens


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
    """One step's rows: plain decodes (1 row, samples) apart from every other chunk, for speed."""

    decodes: list  # [SchedRequest]
    chunks: list  # [(SchedRequest, num_new_tokens, samples_a_token)]
    shape: BatchShape
    preempted: list = field(default_factory=list)  # SchedRequests preempted this step

    @property
    def scheduled(self) -> list:
        """[(request, num_new_tokens, samples_a_token)]: decodes first, then chunks in batch order."""
        return [(r, 1, True) for r in self.decodes] + self.chunks

    def __len__(self) -> int:
        return len(self.decodes) + len(self.chunks)


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
    def _preempt(self, req: SchedRequest) -> None:
        self.kv.free(req)
        req.num_computed = 0
        req.mark = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._push_waiting(req, front=True)

    def _set_mark(self, req: SchedRequest) -> None:
        """Arm the decode fast path for a request whose next step is a decode."""
        bs = self.block_size
        mark = len(req.blocks) * bs + 1  # the next token needs a new block
        if self.kv.caching:
            mark = min(mark, (req.num_cached_blocks + 1) * bs)  # the next token fills a block
        req.mark = min(mark, req.num_prompt_tokens + req.max_tokens)  # the last token

    def _take(self, req: SchedRequest, n: int, acc: list, chunks: list) -> None:
        """Add ``n`` rows of ``req`` to the step and advance its state (vLLM's _update_after_schedule).

        ``acc`` = [decodes, decode_context, prefill_tokens, prefill_pairs, prefill_context, sampled];
        blocks must already be allocated. The decode fast path in :meth:`schedule` is the
        n == 1 special case of this.
        """
        c, nt = req.num_computed, req.num_tokens
        sampled = c + n >= nt
        if self.kv.caching and (c + n) // self.block_size > req.num_cached_blocks:
            self.kv.cache_blocks(req, c + n)
        if n == 1 and sampled and nt > req.num_prompt_tokens:
            acc[0] += 1
            acc[1] += nt
        else:
            acc[2] += n
            acc[3] += n * c + n * (n + 1) // 2
            acc[4] += c + n
        req.num_computed = c + n
        if sampled:
            acc[5] += 1
            req.num_tokens = nt + 1  # placeholder for the token this row samples
            self._set_mark(req)
        else:
            req.mark = 0
        chunks.append((req, n, sampled))

    def _refund(self, chunks: list, acc: list, victim: SchedRequest) -> int:
        """Take a request scheduled earlier this step back out (priority preemption); return its rows."""
        for k, (r, n, sampled) in enumerate(chunks):
            if r is victim:
                del chunks[k]
                break
        else:
            return 0
        c = victim.num_computed - n
        if sampled:
            victim.num_tokens -= 1
            acc[5] -= 1
        if n == 1 and sampled and victim.num_tokens > victim.num_prompt_tokens:
            acc[0] -= 1
            acc[1] -= c + 1
        else:
            acc[2] -= n
            acc[3] -= n * c + n * (n + 1) // 2
            acc[4] -= c + n
        victim.num_computed = c
        return n

    def _running_chunk(self, req: SchedRequest, budget: int) -> int:
        n = req.num_tokens - req.num_computed
        if 0 < self.threshold < n:
            n = self.threshold
        return min(n, budget)

    def _preempt_for(self, req: SchedRequest, need: int, i: int, chunks: list, acc: list,
                     preempted: list) -> tuple[bool, int, int]:
        """Preempt until ``req`` gets ``need`` blocks. Returns (scheduled?, new index of req, refunded rows)."""
        running, refunded = self.running, 0
        while True:
            if self.priority:  # the max (priority, arrival) request, wherever it is
                victim = max(running, key=lambda r: (r.priority, r.arrival))
                vi = running.index(victim)
                del running[vi]
                if vi < i:
                    i -= 1
                    refunded += self._refund(chunks, acc, victim)
            else:
                victim = running.pop()  # FCFS: the last admitted request
            self._preempt(victim)
            preempted.append(victim)
            if victim is req:
                return False, i, refunded
            if self.kv.grow(req, need):
                return True, i, refunded

    def _schedule_running(self, budget: int, acc: list, chunks: list, preempted: list) -> int:
        """The running-request loop, index-based (any victim). Returns the budget left."""
        running, bs = self.running, self.block_size
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.num_output >= req.max_tokens:
                i += 1  # async scheduling: its last token is in flight, nothing left to run
                continue
            n = self._running_chunk(req, budget)
            need = -(-(req.num_computed + n) // bs) - len(req.blocks)
            if need > 0 and not self.kv.grow(req, need):
                ok, i, refunded = self._preempt_for(req, need, i, chunks, acc, preempted)
                budget += refunded
                if not ok:
                    break
            self._take(req, n, acc, chunks)
            budget -= n
            i += 1
        return budget

    def schedule(self) -> SchedulerOutput:
        """Pick the next step's rows; request state advances at once, as in vLLM."""
        budget = self.max_num_batched_tokens
        bs = self.block_size
        kv = self.kv
        decodes: list = []
        chunks: list = []
        preempted: list = []
        acc = [0, 0, 0, 0, 0, 0]

        # 1. Running requests, in admission order.
        if self.priority:
            budget = self._schedule_running(budget, acc, chunks, preempted)
        else:
            # FCFS hot path: the same rules as _schedule_running, with plain decodes
            # (next token needs no block, fills none, is not the last) done inline.
            dec_append = decodes.append
            dec_ctx = 0
            caching = kv.caching
            running = self.running
            for req in running:  # victims are popped from the end, which the iterator tolerates
                if budget <= 0:
                    break
                nt = req.num_tokens
                if nt < req.mark:  # mark > 0 only while num_computed == num_tokens - 1
                    req.num_computed = nt
                    req.num_tokens = nt + 1
                    dec_ctx += nt
                    dec_append(req)
                    budget -= 1
                    continue
                if nt - req.num_prompt_tokens >= req.max_tokens:
                    continue  # async scheduling: its last token is in flight
                if req.num_computed + 1 == nt and nt > req.num_prompt_tokens:
                    # A decode at a block boundary: maybe a new block, maybe a block to cache.
                    if nt > len(req.blocks) * bs and not kv.grow(req, 1):
                        if not self._preempt_for(req, 1, 0, chunks, acc, preempted)[0]:
                            break
                    if caching and nt // bs > req.num_cached_blocks:
                        kv.cache_blocks(req, nt)
                    req.num_computed = nt
                    req.num_tokens = nt + 1
                    self._set_mark(req)
                    dec_ctx += nt
                    dec_append(req)
                    budget -= 1
                    continue
                n = self._running_chunk(req, budget)
                need = -(-(req.num_computed + n) // bs) - len(req.blocks)
                if need > 0 and not kv.grow(req, need):
                    if not self._preempt_for(req, need, 0, chunks, acc, preempted)[0]:
                        break
                self._take(req, n, acc, chunks)
                budget -= n
            acc[0] += len(decodes)
            acc[1] += dec_ctx
            acc[5] += len(decodes)

        # 2. Waiting requests, only if nothing was preempted.
        if not preempted:
            self._admit(budget, acc, chunks)

        n_dec, dec_ctx, pf_tokens, pf_pairs, pf_ctx, n_sampled = acc
        self.prompt_tokens_computed += pf_tokens
        shape = BatchShape(num_tokens=n_dec + pf_tokens, num_reqs=len(decodes) + len(chunks), num_decodes=n_dec,
                           decode_context=dec_ctx, prefill_tokens=pf_tokens, prefill_attn_pairs=pf_pairs,
                           prefill_context=pf_ctx, num_sampled=n_sampled)
        return SchedulerOutput(decodes, chunks, shape, preempted)

    def _admit(self, budget: int, acc: list, chunks: list) -> None:
        """FCFS / priority admission: prefix lookup, full-sequence KV gate, chunk to fill the budget."""
        kv, bs, threshold, running = self.kv, self.block_size, self.threshold, self.running
        skipped = []
        while budget > 0 and self.num_waiting and len(running) < self.max_num_seqs:
            req = self._peek_waiting()
            if req.num_output >= req.max_tokens:
                self._pop_waiting()  # preempted with its last token in flight: nothing to run
                skipped.append(req)
                continue
            hits = kv.lookup(req) if kv.caching else []
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
            if kv.caching and req.num_preemptions == 0:
                self.prefix_cache_queries += req.num_tokens
                self.prefix_cache_hits += hit_tokens
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = hit_tokens
            req.num_computed = hit_tokens
            running.append(req)
            self._take(req, n, acc, chunks)
            budget -= n
        for req in reversed(skipped):
            self._push_waiting(req, front=True)

    def update(self, out: SchedulerOutput) -> list:
        """Process a step's output: [(request, new_tokens, finished)], decodes first.

        Finished requests leave ``running`` and free their blocks only here, so with
        async scheduling the step scheduled meanwhile still counted them.
        """
        results = []
        append = results.append
        done = []
        for req in out.decodes:
            if req.finished:  # aborted meanwhile
                continue
            d = req.num_delivered + 1
            req.num_delivered = d
            if d >= req.max_tokens:
                req.finished = True
                done.append(req)
                append((req, 1, True))
            else:
                append((req, 1, False))
        gen = len(results)
        for req, n, sampled in out.chunks:
            if req.finished:
                continue
            if not sampled:
                append((req, 0, False))
                continue
            d = req.num_delivered + 1
            req.num_delivered = d
            gen += 1
            if d >= req.max_tokens:
                req.finished = True
                done.append(req)
                append((req, 1, True))
            else:
                append((req, 1, False))
        self.generation_tokens += gen
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
