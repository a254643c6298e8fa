"""build_requests: determinism, distributions, shared prefixes, warm-up."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.workload.generate import MIN_TOKEN_ID, build_requests, token_ids_to_text
from orchestrator.workload.spec import WorkloadSpec

VOCAB = 32_000


def spec(**kw) -> WorkloadSpec:
    base = {"num_requests": 50, "warmup_requests": 0, "input_len": 32, "output_len": 8}
    base.update(kw)
    return WorkloadSpec.model_validate(base)


def arrivals(rs) -> np.ndarray:
    return np.array([r.arrival_s for r in rs.measured])


def input_lens(rs) -> np.ndarray:
    return np.array([r.prompt_len for r in rs.measured])


def output_lens(rs) -> np.ndarray:
    return np.array([r.output_len for r in rs.measured])


# ---------------------------------------------------------------- determinism
def test_same_spec_and_seed_give_identical_requests():
    s = spec(warmup_requests=3, input_len={"kind": "uniform", "min": 5, "max": 50},
             shared_prefix={"groups": 2, "length": 4, "fraction": 0.5})
    assert build_requests(s, 7, VOCAB) == build_requests(s, 7, VOCAB)


def test_different_seed_gives_different_requests():
    s = spec(input_len={"kind": "uniform", "min": 5, "max": 50})
    a, b = build_requests(s, 1, VOCAB), build_requests(s, 2, VOCAB)
    assert not np.array_equal(arrivals(a), arrivals(b))
    assert not np.array_equal(input_lens(a), input_lens(b))
    assert [r.prompt_token_ids for r in a.measured] != [r.prompt_token_ids for r in b.measured]


def test_streams_are_independent():
    """Changing one distribution leaves every other random quantity as it was."""
    base = spec(input_len={"kind": "uniform", "min": 5, "max": 50},
                output_len={"kind": "uniform", "min": 1, "max": 20})
    a = build_requests(base, 3, VOCAB)

    other_output = build_requests(base.model_copy(update={"output_len": spec(output_len=99).output_len}), 3, VOCAB)
    assert np.array_equal(arrivals(a), arrivals(other_output))
    assert [r.prompt_token_ids for r in a.measured] == [r.prompt_token_ids for r in other_output.measured]

    other_rate = build_requests(base.model_copy(update={"arrival": spec(arrival={"kind": "poisson", "rate": 50}).arrival}), 3, VOCAB)
    assert [r.prompt_token_ids for r in a.measured] == [r.prompt_token_ids for r in other_rate.measured]
    assert np.array_equal(output_lens(a), output_lens(other_rate))
    assert np.allclose(arrivals(other_rate) * 50, arrivals(a) * base.arrival.rate)  # same gaps, rescaled

    other_input = build_requests(base.model_copy(update={"input_len": spec(input_len=7).input_len}), 3, VOCAB)
    assert np.array_equal(output_lens(a), output_lens(other_input))
    assert np.array_equal(arrivals(a), arrivals(other_input))


# ---------------------------------------------------------------- arrivals
def test_poisson_arrivals_rate():
    rs = build_requests(spec(num_requests=4000, arrival={"kind": "poisson", "rate": 20}), 0, VOCAB)
    t = arrivals(rs)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    rate = (len(t) - 1) / t[-1]
    assert rate == pytest.approx(20, rel=0.05)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.06)  # exponential: CV 1
    assert rs.closed_loop_concurrency is None


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_burstiness(burstiness):
    rs = build_requests(spec(num_requests=6000, arrival={"kind": "gamma", "rate": 10, "burstiness": burstiness}), 0, VOCAB)
    gaps = np.diff(arrivals(rs))
    assert arrivals(rs)[0] == 0.0
    assert gaps.mean() == pytest.approx(0.1, rel=0.07)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_constant_burst_and_concurrency_arrivals():
    t = arrivals(build_requests(spec(num_requests=5, arrival={"kind": "constant", "rate": 4}), 0, VOCAB))
    assert t.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    burst = build_requests(spec(arrival={"kind": "burst"}), 0, VOCAB)
    assert np.all(arrivals(burst) == 0) and burst.closed_loop_concurrency is None
    closed = build_requests(spec(arrival={"kind": "concurrency", "concurrency": 6}), 0, VOCAB)
    assert np.all(arrivals(closed) == 0) and closed.closed_loop_concurrency == 6


# ---------------------------------------------------------------- lengths
def test_fixed_length():
    rs = build_requests(spec(input_len=17, output_len=3), 0, VOCAB)
    assert set(input_lens(rs)) == {17} and set(output_lens(rs)) == {3}


def test_uniform_length_is_inclusive():
    rs = build_requests(spec(num_requests=3000, input_len={"kind": "uniform", "min": 10, "max": 20}), 0, VOCAB)
    x = input_lens(rs)
    assert x.min() == 10 and x.max() == 20  # both ends drawn
    assert x.mean() == pytest.approx(15, abs=0.25)


def test_normal_length_mean_and_clipping():
    rs = build_requests(spec(num_requests=4000, input_len={"kind": "normal", "mean": 100, "std": 10}), 0, VOCAB)
    assert input_lens(rs).mean() == pytest.approx(100, abs=1)
    assert input_lens(rs).std() == pytest.approx(10, rel=0.08)
    clipped = input_lens(build_requests(spec(num_requests=2000, input_len={
        "kind": "normal", "mean": 20, "std": 30, "min": 5, "max": 40}), 0, VOCAB))
    assert clipped.min() == 5 and clipped.max() == 40


def test_lognormal_length_mean_is_the_mean_not_the_median():
    rs = build_requests(spec(num_requests=6000, output_len={"kind": "lognormal", "mean": 200, "sigma": 0.5}), 0, VOCAB)
    x = output_lens(rs)
    assert x.mean() == pytest.approx(200, rel=0.03)
    # median = exp(mu) = mean * exp(-sigma^2 / 2)
    assert np.median(x) == pytest.approx(200 * math.exp(-0.125), rel=0.04)
    clipped = output_lens(build_requests(spec(num_requests=2000, output_len={
        "kind": "lognormal", "mean": 50, "sigma": 2, "min": 3, "max": 60}), 0, VOCAB))
    assert clipped.min() == 3 and clipped.max() == 60


def test_choice_length_weights():
    rs = build_requests(spec(num_requests=4000, output_len={"kind": "choice", "values": [4, 64], "weights": [3, 1]}), 0, VOCAB)
    x = output_lens(rs)
    assert set(x) == {4, 64}
    assert (x == 4).mean() == pytest.approx(0.75, abs=0.03)
    even = output_lens(build_requests(spec(num_requests=3000, output_len={"kind": "choice", "values": [1, 2, 3]}), 0, VOCAB))
    assert np.bincount(even)[1:] / len(even) == pytest.approx([1 / 3] * 3, abs=0.04)


# ---------------------------------------------------------------- prompts
def test_token_ids_avoid_special_tokens():
    vocab = 40
    rs = build_requests(spec(num_requests=200, input_len=50), 0, vocab)
    ids = np.array([i for r in rs.measured for i in r.prompt_token_ids])
    assert ids.min() == MIN_TOKEN_ID and ids.max() == vocab - MIN_TOKEN_ID - 1
    with pytest.raises(ValueError):
        build_requests(spec(), 0, 2 * MIN_TOKEN_ID)


def test_shared_prefixes_are_shared_within_groups_only():
    plen = 16
    rs = build_requests(spec(num_requests=600, input_len={"kind": "uniform", "min": 4, "max": 40},
                             shared_prefix={"groups": 3, "length": plen, "fraction": 0.6}), 0, VOCAB)
    by_group: dict = {}
    for r in rs.measured:
        by_group.setdefault(r.prefix_group, []).append(r)
    assert set(by_group) == {None, 0, 1, 2}
    assert len(rs.measured) - len(by_group[None]) == pytest.approx(0.6 * 600, abs=40)
    heads = {}
    for g in (0, 1, 2):
        firsts = {r.prompt_token_ids[:plen] for r in by_group[g]}
        assert len(firsts) == 1  # every request of a group starts with the same prefix
        heads[g] = firsts.pop()
        # ... followed by its own suffix: no two prompts of a group are equal
        assert len({r.prompt_token_ids for r in by_group[g]}) == len(by_group[g])
    assert len(set(heads.values())) == 3  # groups differ
    # Lengths: max(input_len, prefix + 1) with a prefix, input_len without.
    plain = build_requests(spec(num_requests=600, input_len={"kind": "uniform", "min": 4, "max": 40}), 0, VOCAB)
    for with_prefix, without in zip(rs.measured, plain.measured):
        if with_prefix.prefix_group is None:
            assert with_prefix.prompt_len == without.prompt_len
        else:
            assert with_prefix.prompt_len == max(without.prompt_len, plen + 1)
    # Requests without a prefix do not start with one.
    assert all(r.prompt_token_ids[:plen] not in heads.values() for r in by_group[None])


def test_token_ids_to_text():
    assert token_ids_to_text((10, 2345, 11)) == "t10 t2345 t11"
    assert token_ids_to_text(()) == ""


# ---------------------------------------------------------------- warm-up
def test_warmup_is_separate_and_flagged():
    s = spec(warmup_requests=4, arrival={"kind": "poisson", "rate": 5},
             shared_prefix={"groups": 2, "length": 8})
    rs = build_requests(s, 11, VOCAB)
    assert len(rs.warmup) == 4 and len(rs.measured) == 50
    assert all(r.warmup and r.arrival_s == 0.0 for r in rs.warmup)
    assert not any(r.warmup for r in rs.measured)
    assert [r.index for r in rs.warmup] == [-4, -3, -2, -1]
    assert [r.index for r in rs.measured] == list(range(50))
    # Warm-up uses the workload's prefixes, with prompts of its own.
    prefixes = {r.prefix_group: r.prompt_token_ids[:8] for r in rs.measured}
    assert all(r.prompt_token_ids[:8] == prefixes[r.prefix_group] for r in rs.warmup)
    assert not {r.prompt_token_ids for r in rs.warmup} & {r.prompt_token_ids for r in rs.measured}
    # The number of warm-up requests does not change the measured ones.
    assert build_requests(s.model_copy(update={"warmup_requests": 0}), 11, VOCAB).measured == rs.measured


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lo=st.integers(1, 30), width=st.integers(0, 30),
       n=st.integers(1, 30), plen=st.integers(1, 20))
def test_lengths_within_bounds(seed, lo, width, n, plen):
    s = spec(num_requests=n, input_len={"kind": "uniform", "min": lo, "max": lo + width},
             output_len={"kind": "normal", "mean": lo, "std": 5, "min": lo, "max": lo + width},
             shared_prefix={"groups": 2, "length": plen, "fraction": 0.5})
    rs = build_requests(s, seed, 1000)
    for r in rs.measured:
        expected_min = lo if r.prefix_group is None else max(lo, plen + 1)
        assert expected_min <= r.prompt_len <= max(lo + width, plen + 1)
        assert lo <= r.output_len <= lo + width


def test_a_large_request_set_holds_a_pointer_per_prompt_token():
    """A million-request study once needed ~28 GB in its trial's process: every prompt id was an
    int object of its own (~36 bytes a token). The ids are shared objects: ~8 bytes a token."""
    import tracemalloc

    s = spec(num_requests=5000, input_len=512, shared_prefix={"groups": 4, "length": 64, "fraction": 0.5})
    tracemalloc.start()
    try:
        rs = build_requests(s, 0, 128_256)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_token = held / sum(r.prompt_len for r in rs.measured)
    assert per_token < 16, per_token


def _copied_spans(prompt, span):
    """Spans of ``prompt`` after its first that equal some ``span`` tokens ending before them."""
    out = 0
    for start in range(span, len(prompt) - span + 1, span):
        piece = prompt[start:start + span]
        out += any(prompt[j:j + span] == piece for j in range(0, start - span + 1))
    return out, len(range(span, len(prompt) - span + 1, span))


def test_repetition_copies_earlier_spans_and_changes_nothing_else():
    span = 8
    plain = spec(num_requests=200, input_len={"kind": "uniform", "min": 40, "max": 200},
                 shared_prefix={"groups": 2, "length": 16, "fraction": 0.5})
    repeated = plain.model_copy(update={"repetition": spec(repetition={"fraction": 0.5, "span": span}).repetition})
    a, b = build_requests(plain, 5, VOCAB), build_requests(repeated, 5, VOCAB)
    assert build_requests(repeated, 5, VOCAB) == b  # seeded
    assert np.array_equal(arrivals(a), arrivals(b)) and np.array_equal(input_lens(a), input_lens(b))
    assert [r.prefix_group for r in a.measured] == [r.prefix_group for r in b.measured]
    def own(rs):  # a prompt's own tokens, after its shared prefix
        return [r.prompt_token_ids[16:] if r.prefix_group is not None else r.prompt_token_ids for r in rs.measured]

    # The shared prefixes and each prompt's first span stay as drawn.
    assert [r.prompt_token_ids[:16] for r in a.measured if r.prefix_group is not None] \
        == [r.prompt_token_ids[:16] for r in b.measured if r.prefix_group is not None]
    assert [p[:span] for p in own(a)] == [p[:span] for p in own(b)]
    copied, spans = map(sum, zip(*(_copied_spans(p, span) for p in own(b))))
    assert copied / spans == pytest.approx(0.5, abs=0.06)  # random ids never repeat 8 tokens by chance
    assert sum(_copied_spans(p, span)[0] for p in own(a)) == 0


@pytest.mark.parametrize("source", [{"sessions": {"turns": 2}}, {"dataset": {"format": "sharegpt", "path": "x"}}])
def test_repetition_is_for_synthetic_prompts_only(source):
    with pytest.raises(ValueError, match="repetition shapes synthetic prompts"):
        spec(repetition={"fraction": 0.5}, **source)
