"""vLLM V1's scheduler, modelled step by step without timing.

Follows ``v1/core/sched/scheduler.py`` (``schedule``) of vLLM 0.29 (see
``notes/vllm-v1-engine-facts.md``); the KV blocks and the prefix cache are
:class:`~orchestrator.sim.kv_cache.KVCacheManager`:

* running requests first, in admission order, each taking
  min(remaining, long_prefill_token_threshold, budget left); then FCFS (or
  priority) admission, only in a step that preempted nothing;
* ``max_num_seqs`` is checked only at admission; admission needs blocks for the
  whole remaining sequence (``scheduler_reserve_full_isl``) and a failed gate
  stops admission (head-of-line blocking); the last admitted prompt is chunked to
  fill the budget, or stops admission when chunked prefill is off;
* paged KV and the prefix cache: see :mod:`orchestrator.sim.kv_cache`;
* a running request that cannot get its blocks preempts the last admitted one
  (recompute: blocks freed, computed tokens reset, re-queued at the front).

As in vLLM, request state advances when a step is scheduled (a row that samples
adds a placeholder token) and finished requests leave only when the step's output
is processed (:meth:`Scheduler.update`), so async scheduling is modelled by
scheduling step N+1 before processing step N. Generation ends at ``max_tokens``
(no EOS). Counters follow vLLM's /metrics where one exists.

It never looks at time: :mod:`orchestrator.sim.cost` prices the
:class:`~orchestrator.sim.batch.BatchShape` a step produces (Vidur's scheduler / predictor split).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.sim.batch import BatchShape, SchedulerOutput
from orchestrator.sim.kv_cache import KVCacheManager
from orchestrator.sim.sched_request import SchedRequest

__all__ = ["BatchShape", "KVCacheManager", "SchedRequest", "Scheduler", "SchedulerOutput"]


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
        gen = 0
        steps = itertools.chain(((req, True) for req in out.decodes), ((req, sampled) for req, _, sampled in out.chunks))
        for req, sampled in steps:
            if req.finished:  # aborted meanwhile
                continue
            if not sampled:  # a prefill chunk short of the prompt's end
                append((req, 0, False))
                continue
            d = req.num_delivered + 1
            req.num_delivered = d
            gen += 1
            finished = d >= req.max_tokens
            if finished:
                req.finished = True
                done.append(req)
            append((req, 1, finished))
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
