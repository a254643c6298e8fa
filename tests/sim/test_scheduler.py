"""The V1 scheduler model: budgets, admission gate, chunking, prefix cache, preemption, speed."""

from __future__ import annotations

import time
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.core import SimEngineCore, SimRequest
from orchestrator.sim.scheduler import SchedRequest, Scheduler

_uid = iter(range(1, 1 << 30))


def make_args(**kw) -> EngineArgs:
    base = dict(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024, block_size=16,
                enable_chunked_prefill=True, enable_prefix_caching=True)
    base.update(kw)
    return EngineArgs(**base)


def req(rid, prompt, max_tokens) -> SchedRequest:
    if isinstance(prompt, int):
        prompt = [hash((rid, i)) % 50000 for i in range(prompt)]
    return SchedRequest(str(rid), next(_uid), prompt, max_tokens)


def drain(sched: Scheduler, max_steps: int = 100_000, on_step=None) -> Counter:
    """Run to completion (synchronous scheduling); tokens delivered per request id."""
    got: Counter = Counter()
    for _ in range(max_steps):
        if not sched.has_work():
            return got
        out = sched.schedule()
        assert out.scheduled, "no progress"
        if on_step:
            on_step(out)
        for r, new, _ in sched.update(out):
            got[r.request_id] += new
    raise AssertionError("did not finish")


# ---------------------------------------------------------------- property test
@st.composite
def workloads(draw):
    bs = draw(st.sampled_from([1, 4, 16]))
    chunked = draw(st.booleans())
    max_len = draw(st.integers(32, 256))
    budget = draw(st.integers(16, 512))
    if not chunked:
        budget = max(budget, max_len)  # what EngineArgs.resolved guarantees
    args = make_args(max_num_seqs=draw(st.integers(1, 12)), max_num_batched_tokens=budget, max_model_len=max_len,
                     block_size=bs, enable_chunked_prefill=chunked, enable_prefix_caching=draw(st.booleans()),
                     # vLLM refuses a threshold above max_model_len (engine_args.vllm_refusal): only valid ones here
                     long_prefill_token_threshold=min(draw(st.sampled_from([0, 0, 8, 40])), max_len),
                     scheduling_policy=draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
                     extra={"async_scheduling": draw(st.booleans())})
    min_blocks = -(-max_len // bs) + 1
    num_blocks = draw(st.integers(min_blocks, 4 * min_blocks))
    shared = draw(st.lists(st.integers(0, 99), min_size=0, max_size=40))
    reqs = []
    for i in range(draw(st.integers(1, 25))):
        out = draw(st.integers(1, max_len // 2))
        plen = draw(st.integers(1, max_len - out))
        prompt = (shared + draw(st.lists(st.integers(0, 99), min_size=plen, max_size=plen)))[:plen]
        reqs.append((f"q{i}", prompt, out, draw(st.integers(0, 3)), draw(st.integers(0, 3))))
    return args, num_blocks, reqs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_budgets_hold_and_every_request_gets_exactly_max_tokens(case):
    args, num_blocks, reqs = case
    gpu = get_gpu("H200")
    core = SimEngineCore(ModelShape.load("tiny-llama"), gpu,
                         EngineArgs(**{**args.__dict__, "extra": {**args.extra, "num_gpu_blocks_override": num_blocks}}))
    sched = core.scheduler
    pending = sorted(reqs, key=lambda r: r[3])  # (id, prompt, max_tokens, arrival step, priority)
    got: Counter = Counter()
    finished = set()
    step = 0
    while pending or core.has_work():
        while pending and pending[0][3] <= step:
            rid, prompt, out, _, prio = pending.pop(0)
            core.add_request(SimRequest(rid, prompt, out, priority=prio))
        res = core.step()
        step += 1
        assert step < 20_000
        assert res.num_scheduled_tokens <= args.max_num_batched_tokens
        assert len(sched.running) <= args.max_num_seqs
        assert 0.0 <= sched.kv.usage() <= 1.0
        for o in res.outputs:
            assert o.request_id not in finished
            got[o.request_id] += o.new_tokens
            if o.finished:
                finished.add(o.request_id)
    assert got == Counter({rid: out for rid, _, out, _, _ in reqs})
    assert finished == {rid for rid, *_ in reqs}
    # Every block is back in the free queue (cached or not) except the null block.
    assert sched.kv.num_free == num_blocks - 1 and sched.kv.usage() == 0.0
    assert sched.generation_tokens == sum(out for _, _, out, _, _ in reqs)


# ---------------------------------------------------------------- step rules
def test_max_num_seqs_caps_admission_only():
    s = Scheduler(make_args(max_num_seqs=2), 1000)
    for i in range(4):
        s.add_request(req(i, 32, 4))
    out = s.schedule()
    assert [r.request_id for r, _, _ in out.scheduled] == ["0", "1"]
    assert s.num_waiting == 2


def test_running_requests_go_first_and_the_last_prefill_is_chunked():
    s = Scheduler(make_args(max_num_batched_tokens=100), 1000)
    s.add_request(req("a", 40, 5))
    s.update(s.schedule())  # a: prefill done, first token
    s.add_request(req("b", 300, 5))
    out = s.schedule()
    assert [(r.request_id, n) for r, n, _ in out.scheduled] == [("a", 1), ("b", 99)]
    assert out.shape.num_decodes == 1 and out.shape.prefill_tokens == 99


def test_chunked_prefill_splits_a_long_prompt():
    s = Scheduler(make_args(max_num_batched_tokens=64), 1000)
    s.add_request(req("long", 200, 3))
    chunks, firsts = [], []
    for _ in range(4):
        out = s.schedule()
        chunks.append(out.scheduled[0][1])
        firsts += [new for _, new, _ in s.update(out)]
    assert chunks == [64, 64, 64, 8]
    assert firsts == [0, 0, 0, 1]  # the step that completes the prompt produces the first token


def test_long_prefill_threshold_caps_each_request():
    s = Scheduler(make_args(max_num_batched_tokens=256, long_prefill_token_threshold=50), 1000)
    s.add_request(req("x", 120, 2))
    s.add_request(req("y", 120, 2))
    out = s.schedule()
    assert [n for _, n, _ in out.scheduled] == [50, 50]


def test_without_chunked_prefill_a_prompt_that_does_not_fit_stops_admission():
    s = Scheduler(make_args(max_num_batched_tokens=1024, enable_chunked_prefill=False), 1000)
    for rid in ("a", "b", "c"):
        s.add_request(req(rid, 600, 3))
    out = s.schedule()
    assert [(r.request_id, n) for r, n, _ in out.scheduled] == [("a", 600)]
    s.update(out)
    out = s.schedule()
    assert [(r.request_id, n) for r, n, _ in out.scheduled] == [("a", 1), ("b", 600)]


def test_head_of_line_blocking_on_kv_blocks():
    # 20 usable blocks of 16 tokens. "big" needs 16 blocks for its whole prompt, which
    # "holder" (8 blocks) leaves no room for; "small" (1 block) behind it must wait too.
    s = Scheduler(make_args(max_num_batched_tokens=512), 21)
    s.add_request(req("holder", 128, 40))
    s.update(s.schedule())
    s.add_request(req("big", 250, 2))
    s.add_request(req("small", 10, 2))
    out = s.schedule()
    assert [r.request_id for r, _, _ in out.scheduled] == ["holder"]
    assert s.num_waiting == 2
    # The gate counts the whole prompt, not the first chunk: even a tiny budget does not admit it.
    assert s.kv.num_free >= 2


def test_admission_gate_reserves_the_whole_prompt_with_chunking():
    s = Scheduler(make_args(max_num_batched_tokens=32), 11)  # 10 usable blocks = 160 tokens
    s.add_request(req("a", 100, 2))  # 7 blocks for the prompt
    s.add_request(req("b", 100, 2))
    out = s.schedule()
    assert [r.request_id for r, _, _ in out.scheduled] == ["a"]
    assert len(out.scheduled[0][0].blocks) == 2  # only the first chunk's blocks are taken


def test_preemption_when_blocks_run_out_and_all_requests_finish():
    s = Scheduler(make_args(max_num_batched_tokens=512, max_num_seqs=8), 13)  # 12 usable blocks
    for i in range(4):
        s.add_request(req(i, 32, 60))  # 2 blocks each at admission, 6 at the end
    preempted = []
    got = drain(s, on_step=lambda out: preempted.extend(r.request_id for r in out.preempted))
    assert s.num_preemptions > 0 and preempted
    assert got == Counter({str(i): 60 for i in range(4)})
    # The victim is the last admitted request (FCFS).
    assert preempted[0] == "3"


def test_preempted_request_resumes_from_cached_blocks():
    s = Scheduler(make_args(max_num_batched_tokens=512), 13)
    for i in range(4):
        s.add_request(req(i, 32, 60))
    drain(s)
    assert s.prompt_tokens_computed > 4 * 32  # recomputation happened
    # With a cache the resume is cheaper than recomputing everything.
    s2 = Scheduler(make_args(max_num_batched_tokens=512, enable_prefix_caching=False), 13)
    for i in range(4):
        s2.add_request(req(i, 32, 60))
    drain(s2)
    assert s2.num_preemptions > 0
    assert s.prompt_tokens_computed <= s2.prompt_tokens_computed


def test_no_admission_in_a_step_that_preempted():
    s = Scheduler(make_args(max_num_batched_tokens=512), 13)
    for i in range(4):
        s.add_request(req(i, 32, 60))

    def check(out):
        if out.preempted:
            assert all(r.num_computed > 0 or n == 1 for r, n, _ in out.scheduled)
            admitted = [r for r, n, _ in out.scheduled if r.num_computed == n and r.num_output <= 1
                        and n > 1]
            assert not admitted

    drain(s, on_step=check)


# ---------------------------------------------------------------- prefix caching
def _shared_prefix_run(caching: bool) -> Scheduler:
    s = Scheduler(make_args(enable_prefix_caching=caching, max_num_batched_tokens=2048), 2000)
    prefix = list(range(1000, 1512))
    for i in range(8):
        s.add_request(req(f"p{i}", prefix + [7000 + i] * 40, 8))
    drain(s)
    return s


def test_prefix_caching_computes_fewer_prompt_tokens():
    on, off = _shared_prefix_run(True), _shared_prefix_run(False)
    assert off.prompt_tokens_computed == 8 * 552
    assert on.prompt_tokens_computed <= 552 + 7 * (552 - 512 + 16)
    assert on.prefix_cache_hits == 7 * 512
    assert on.prefix_cache_queries == 8 * 552
    assert off.prefix_cache_queries == 0


def test_fully_cached_prompt_recomputes_its_last_block():
    s = Scheduler(make_args(), 100)
    prompt = list(range(64))
    s.add_request(req("a", prompt, 2))
    drain(s)
    s.add_request(req("b", prompt, 2))
    out = s.schedule()
    assert out.scheduled[0][1] == 16  # hit capped at n-1 tokens, in whole blocks: 48 of 64
    assert s.prefix_cache_hits == 48


def test_lru_eviction_of_free_cached_blocks():
    s = Scheduler(make_args(max_num_seqs=1), 9)  # 8 usable blocks
    a, b = list(range(64)), list(range(100, 164))
    s.add_request(req("a", a, 1))
    drain(s)  # a's 4 prompt blocks cached and free
    s.add_request(req("b", b, 1))
    drain(s)  # b's 4 blocks cached; a's still cached (8 free blocks in all)
    s.add_request(req("c", list(range(200, 264)), 1))
    drain(s)  # needs 4 blocks: evicts a's (least recently freed), keeps b's
    s.add_request(req("b2", b + [1], 1))
    s.add_request(req("a2", a + [1], 1))
    hits_before = s.prefix_cache_hits
    s.update(s.schedule())
    assert s.prefix_cache_hits - hits_before == 64  # b2 hit, a2 not admitted yet (max_num_seqs=1)
    drain(s)
    assert s.prefix_cache_hits - hits_before == 64  # a2 missed: its blocks were evicted


def test_generated_tokens_are_cached_too():
    s = Scheduler(make_args(), 100)
    s.add_request(req("a", 16, 40))
    drain(s)
    # 16 prompt + 40 generated: blocks 0-2 are full (48 tokens) and cached.
    assert len(s.kv.cached) == 3


# ---------------------------------------------------------------- speed
def test_scheduling_512_running_requests_is_fast():
    s = Scheduler(make_args(max_num_seqs=512, max_num_batched_tokens=8192, max_model_len=4096), 40000)
    for i in range(512):
        s.add_request(req(i, 64, 3000))
    while s.num_waiting:
        s.update(s.schedule())
    best = float("inf")
    for _ in range(5):  # best of 5 rounds: the machine may be shared
        t0 = time.perf_counter()
        for _ in range(40):
            out = s.schedule()
            assert len(out) == 512
            s.update(out)
        best = min(best, (time.perf_counter() - t0) / 40)
    assert best < 1e-3, f"{best * 1e3:.2f} ms per step (schedule + update)"
