"""Load levels and the steady warm-up's requests: fresh prompts, the same shapes, level 0 as it always was.

A capacity search replays the workload at several rates on one engine, whose prefix
cache (on by default in vLLM) keeps what it saw: a level that replayed level 0's prompts
would be answered from the cache. Level k > 0 therefore has unique prompt parts of its
own, and so does the warm-up; only the workload's shared prefixes are shared.
"""

from __future__ import annotations

import hashlib
import itertools
import json

import numpy as np
import pytest

from orchestrator.workload.datasets import write_vllm_custom
from orchestrator.workload.generate import build_requests
from orchestrator.workload.spec import WorkloadSpec

VOCAB = 32_000
PLEN = 8  # shared-prefix length of the synthetic workload below


def digest(rs) -> str:
    rows = [(r.index, round(r.arrival_s, 9), list(r.prompt_token_ids), r.output_len, r.prefix_group, r.warmup,
             r.prompt_text) for r in rs.warmup + rs.measured]
    body = json.dumps([rows, rs.closed_loop_concurrency, rs.requested_rate and round(rs.requested_rate, 9)])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def synthetic(**kw) -> WorkloadSpec:
    doc = {"arrival": {"kind": "poisson", "rate": 5}, "num_requests": 40, "warmup_requests": 3,
           "input_len": {"kind": "uniform", "min": 5, "max": 60},
           "output_len": {"kind": "lognormal", "mean": 20, "sigma": 0.5},
           "shared_prefix": {"groups": 3, "length": PLEN, "fraction": 0.6}}
    return WorkloadSpec.model_validate({**doc, **kw})


def dataset_spec(tmp_path, entries: int = 7, **kw) -> WorkloadSpec:
    path = tmp_path / "c.jsonl"
    write_vllm_custom(path, [(f"t{10 + i} t{20 + i} word{i}", i + 1) for i in range(entries)])
    return WorkloadSpec.model_validate({"dataset": {"format": "vllm-custom", "path": str(path)},
                                        "arrival": {"kind": "gamma", "rate": 3, "burstiness": 0.5},
                                        "num_requests": 12, "warmup_requests": 2, **kw})


def unique_part(r) -> tuple:
    return r.prompt_token_ids[PLEN:] if r.prefix_group is not None else r.prompt_token_ids


def lcp(a: tuple, b: tuple) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------- level 0 is today's workload
def test_level_zero_is_the_workload_as_it_always_was(tmp_path):
    """Digests of the requests the code made before levels existed (same specs, same seeds; the
    rate-driven ones since their gaps are rescaled to the requested rate, as vLLM does)."""
    closed = {"arrival": {"kind": "concurrency", "concurrency": 3}, "num_requests": 10, "warmup_requests": 1,
              "input_len": 12, "output_len": 4}
    trace = {"trace": {"path": "chat", "max_requests": 30}, "warmup_requests": 2}
    assert digest(build_requests(synthetic(), 11, VOCAB)) == "e06817aaa679a6b5"
    assert digest(build_requests(synthetic(), 11, VOCAB, level=0)) == "e06817aaa679a6b5"
    assert digest(build_requests(WorkloadSpec.model_validate(closed), 2, VOCAB)) == "c6bde14f40d5cd20"
    assert digest(build_requests(WorkloadSpec.model_validate(trace), 4, VOCAB)) == "e83a143a2ac7c481"
    assert digest(build_requests(dataset_spec(tmp_path), 5, VOCAB)) == "7f383af868ddded6"


# ---------------------------------------------------------------- fresh prompts per level
@pytest.mark.parametrize("level", [1, 2, 7])
def test_a_level_shares_only_the_shared_prefixes_with_level_zero_and_the_warmup(level):
    spec = synthetic()
    base = build_requests(spec, 11, VOCAB)
    other = build_requests(spec, 11, VOCAB, level=level)
    seen = list(base.warmup + base.measured) + list(itertools.islice(base.warmup_stream, 200))
    seen += list(other.warmup) + list(itertools.islice(other.warmup_stream, 200))
    # No unique prompt part in common with level 0 or any warm-up ...
    assert not {unique_part(r) for r in other.measured} & {unique_part(r) for r in seen}
    # ... and no common prompt prefix longer than the shared prefix (what a prefix cache could hit).
    for r in other.measured:
        for q in seen:
            shared = PLEN if r.prefix_group is not None and r.prefix_group == q.prefix_group else 0
            assert lcp(r.prompt_token_ids, q.prompt_token_ids) <= shared + 2, (r.index, q.index)
    # The shared prefixes themselves are the workload's, at every level.
    prefixes = {r.prefix_group: r.prompt_token_ids[:PLEN] for r in base.measured if r.prefix_group is not None}
    assert all(r.prompt_token_ids[:PLEN] == prefixes[r.prefix_group]
               for r in other.measured + other.warmup if r.prefix_group is not None)
    assert sum(r.prefix_group is not None for r in other.measured) > 10
    # The same draw of arrivals, lengths and groups (common random numbers: every level, and every
    # configuration of a study, replays one sequence of requests), with prompts of its own.
    assert [r.index for r in other.measured] == [r.index for r in base.measured]
    assert [r.arrival_s for r in other.measured] == [r.arrival_s for r in base.measured]
    assert [(r.prompt_len, r.output_len, r.prefix_group) for r in other.measured] == \
           [(r.prompt_len, r.output_len, r.prefix_group) for r in base.measured]
    assert other.requested_rate == base.requested_rate and [r.index for r in other.warmup] == [-3, -2, -1]
    # Deterministic per level, and each level its own.
    assert build_requests(spec, 11, VOCAB, level=level) == other
    assert {unique_part(r) for r in build_requests(spec, 11, VOCAB, level=level + 1).measured}.isdisjoint(
        unique_part(r) for r in other.measured)


def test_capacity_levels_replay_one_draw_time_scaled_with_prompts_of_their_own():
    """The level builder of the capacity search: a level's rate scales the draw's arrivals in time, its
    index gives it prompts of its own; the lengths and the order are the draw's."""
    from orchestrator.study.spec import CapacitySpec
    from orchestrator.trial.capacity import level_workload

    spec, cap = synthetic(), CapacitySpec(requests_per_level=40)
    lv0 = build_requests(level_workload(spec, 5.0, cap, 5.0), 11, VOCAB, level=0)
    lv1 = build_requests(level_workload(spec, 10.0, cap, 5.0), 11, VOCAB, level=1)
    assert lv0.measured == build_requests(spec, 11, VOCAB).measured
    assert np.allclose([r.arrival_s * 2 for r in lv1.measured], [r.arrival_s for r in lv0.measured])  # twice the rate
    assert [(r.prompt_len, r.output_len) for r in lv1.measured] == [(r.prompt_len, r.output_len) for r in lv0.measured]
    assert not {unique_part(r) for r in lv1.measured} & {unique_part(r) for r in lv0.measured}


def test_dataset_levels_take_the_next_entries_of_the_seeded_order(tmp_path):
    spec = dataset_spec(tmp_path, entries=30)  # 12 requests a level: levels 0 and 1 use 24 distinct entries
    lv0, lv1 = build_requests(spec, 5, VOCAB), build_requests(spec, 5, VOCAB, level=1)
    assert len({r.prompt_text for r in lv0.measured}) == 12 == len({r.prompt_text for r in lv1.measured})
    assert not {r.prompt_text for r in lv0.measured} & {r.prompt_text for r in lv1.measured}
    assert [r.arrival_s for r in lv1.measured] != [r.arrival_s for r in lv0.measured]
    assert lv1.measured[-1].arrival_s == pytest.approx(lv0.measured[-1].arrival_s)
    # Warm-up prompts are random ids, never a measured text.
    warm = lv1.warmup + tuple(itertools.islice(lv1.warmup_stream, 20))
    assert all(r.prompt_text is None for r in warm)
    # A file shorter than the levels need cycles: then text repeats (documented).
    short = dataset_spec(tmp_path, entries=7)
    assert {r.prompt_text for r in build_requests(short, 5, VOCAB, level=1).measured} <= \
           {r.prompt_text for r in build_requests(short, 5, VOCAB).measured}


def test_a_level_measured_again_is_a_fresh_draw_of_everything_but_the_shared_prefixes():
    spec = synthetic()
    first, again = build_requests(spec, 11, VOCAB, level=2), build_requests(spec, 11, VOCAB, level=2, replicate=1)
    assert [r.arrival_s for r in first.measured] != [r.arrival_s for r in again.measured]
    assert not {unique_part(r) for r in first.measured} & {unique_part(r) for r in again.measured}
    prefixes = {r.prefix_group: r.prompt_token_ids[:PLEN] for r in first.measured if r.prefix_group is not None}
    assert all(r.prompt_token_ids[:PLEN] == prefixes[r.prefix_group] for r in again.measured
               if r.prefix_group is not None)
    assert build_requests(spec, 11, VOCAB, level=2, replicate=1) == again  # deterministic
    assert again.measured != build_requests(spec, 11, VOCAB, level=3, replicate=1).measured


def test_trace_levels_keep_text_prompts_and_refresh_drawn_ones(tmp_path):
    chat = WorkloadSpec.model_validate({"trace": {"path": "chat", "max_requests": 40}, "warmup_requests": 1})
    lv0, lv1 = build_requests(chat, 3, VOCAB), build_requests(chat, 3, VOCAB, level=1)
    assert [(r.arrival_s, r.prompt_len, r.prefix_group) for r in lv1.measured] == \
           [(r.arrival_s, r.prompt_len, r.prefix_group) for r in lv0.measured]
    grouped = [(a, b) for a, b in zip(lv0.measured, lv1.measured) if a.prefix_group is not None]
    assert grouped and all(a.prompt_token_ids[:64] == b.prompt_token_ids[:64] for a, b in grouped)
    assert all(a.prompt_token_ids[64:] != b.prompt_token_ids[64:] for a, b in grouped)
    assert not {r.prompt_token_ids for r in lv0.measured} & {r.prompt_token_ids for r in lv1.measured}
    # Text prompts are the trace's own: every level replays them.
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i * 0.5, "prompt": f"question number {i}", "output_len": 4})
                            + "\n" for i in range(6)))
    text = WorkloadSpec.model_validate({"trace": {"path": str(path)}, "warmup_requests": 0})
    assert [r.prompt_text for r in build_requests(text, 3, VOCAB, level=2).measured] == \
           [f"question number {i}" for i in range(6)]


# ---------------------------------------------------------------- the steady warm-up's requests
def test_the_steady_warmup_stream_is_the_trials_own_load_with_prompts_of_its_own():
    spec = synthetic(arrival={"kind": "gamma", "rate": 8, "burstiness": 0.5})
    rs = build_requests(spec, 11, VOCAB)
    stream = list(itertools.islice(rs.warmup_stream, 3000))
    assert stream[:150] == list(itertools.islice(rs.warmup_stream, 150))  # deterministic, chunk after chunk
    assert [r.index for r in stream[:3]] == [-4, -5, -6] and all(r.warmup for r in stream)
    assert stream[0].arrival_s == 0 and np.all(np.diff([r.arrival_s for r in stream]) >= 0)
    gaps = np.diff([r.arrival_s for r in stream])
    assert np.mean(gaps) == pytest.approx(1 / 8, rel=0.1)  # the trial's rate ...
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(2 ** 0.5, rel=0.15)  # ... and burstiness
    lens = [r.prompt_len for r in stream if r.prefix_group is None]
    assert min(lens) >= 5 and max(lens) <= 60 and np.mean(lens) == pytest.approx(32.5, rel=0.1)
    assert np.mean([r.prefix_group is not None for r in stream]) == pytest.approx(0.6, abs=0.05)
    measured = build_requests(spec, 11, VOCAB).measured + build_requests(spec, 11, VOCAB, level=1).measured
    assert not {unique_part(r) for r in stream} & {unique_part(r) for r in measured + rs.warmup}


@pytest.mark.parametrize("arrival, rate, closed", [
    ({"kind": "ramp", "start_rate": 2, "end_rate": 10}, 2.0, None),
    ({"kind": "constant", "rate": 6}, 6.0, None),
    ({"kind": "concurrency", "concurrency": 5}, None, 5),
])
def test_the_steady_warmup_follows_the_arrival_kind(arrival, rate, closed):
    rs = build_requests(synthetic(arrival=arrival), 0, VOCAB)
    assert rs.warmup_stream.rate == rate and rs.warmup_stream.concurrency == closed
    due = [r.arrival_s for r in itertools.islice(rs.warmup_stream, 400)]
    if closed:
        assert not any(due)
    else:
        assert (len(due) - 1) / due[-1] == pytest.approx(rate, rel=0.15)


def test_no_steady_warmup_for_a_burst_or_when_disabled():
    assert build_requests(synthetic(arrival={"kind": "burst"}), 0, VOCAB).warmup_stream is None
    off = build_requests(synthetic(warmup={"enabled": False}), 11, VOCAB)
    assert off.warmup_stream is None and off.measured == build_requests(synthetic(), 11, VOCAB).measured


@pytest.mark.parametrize("warmup, message", [
    ({"min_s": 12}, "min_s (12) must be <= max_s (10)"),
    ({"window_s": 6}, "two windows (12 s) must fit in max_s (10)"),
    ({"tolerance": 0}, "greater than 0"),
])
def test_warmup_settings_are_checked(study_doc, warmup, message):
    from orchestrator.study.spec import StudyFileError, parse_study

    study_doc["workload"]["warmup"] = warmup
    with pytest.raises(StudyFileError) as e:
        parse_study(study_doc)
    assert len(e.value.problems) == 1 and message in str(e.value), str(e.value)
    study_doc["workload"]["warmup"] = {"min_sec": 1}
    with pytest.raises(StudyFileError, match="did you mean 'min_s'"):
        parse_study(study_doc)
