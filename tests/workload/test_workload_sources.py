"""Arrival realism (ramp, diurnal, rate scaling), datasets from other tools, measurement windows,
and the requested vs achieved rate a trial reports for every arrival kind."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.measure.metrics import measurement_window, summarise
from orchestrator.measure.records import RequestRecord
from orchestrator.workload.arrivals import diurnal_rate, nominal_rate, sample_arrivals, with_rate
from orchestrator.workload.datasets import read_sharegpt, read_vllm_custom, write_vllm_custom
from orchestrator.workload.generate import build_requests
from orchestrator.workload.spec import WorkloadSpec
from orchestrator.workload.trace import TraceError

VOCAB = 32_000


def arrival(**kw):
    return WorkloadSpec.model_validate({"arrival": kw}).arrival


def due(spec, n, seed=0):
    return sample_arrivals(spec, n, np.random.default_rng(seed))


# ---------------------------------------------------------------- ramp
def test_ramp_rate_climbs_and_nominal_rate_matches_the_span():
    a = arrival(kind="ramp", start_rate=2, end_rate=20)
    t = due(a, 4000)
    gaps = np.diff(t)
    assert gaps[:400].mean() == pytest.approx(1 / 2.5, rel=0.15)  # rate ~2-3.8 over the first tenth
    assert gaps[-400:].mean() == pytest.approx(1 / 19, rel=0.15)
    # The span's std is ~2% here (its early, slow gaps dominate): average ten seeds.
    spans = [due(a, 4000, seed)[-1] for seed in range(10)]
    assert 3999 / np.mean(spans) == pytest.approx(nominal_rate(a, 4000), rel=0.02)
    exp = arrival(kind="ramp", start_rate=2, end_rate=20, shape="exponential")
    assert nominal_rate(exp, 4000) < nominal_rate(a, 4000)  # spends longer at low rates


# ---------------------------------------------------------------- diurnal
def test_diurnal_sinusoid_follows_its_rate_and_keeps_the_mean():
    a = arrival(kind="diurnal", rate=40, period_s=60, amplitude=0.8)
    t = due(a, 24_000)  # 10 periods
    periods = int(t[-1] // 60)
    counts, edges = np.histogram(np.mod(t[t < periods * 60], 60), bins=12, range=(0, 60))
    expected = diurnal_rate(a, (edges[:-1] + edges[1:]) / 2) * 5 * periods  # 5 s bins
    assert np.allclose(counts, expected, rtol=0.12)
    assert (t < periods * 60).sum() / (periods * 60) == pytest.approx(40, rel=0.03)


def test_diurnal_profile_is_piecewise_linear_and_cyclic():
    a = arrival(kind="diurnal", rate=10, period_s=40, profile=[1, 3])
    r = diurnal_rate(a, np.array([0.0, 10.0, 20.0, 30.0, 40.0]))
    assert np.allclose(r, [5, 10, 15, 10, 5])  # levels 1, 3 at 0 and 20 s, mean 2 -> rate 10
    with pytest.raises(ValueError, match="profile levels"):
        arrival(kind="diurnal", rate=1, period_s=1, profile=[0, 0])


# ---------------------------------------------------------------- rate scaling (capacity levels)
@pytest.mark.parametrize("kw", [
    {"kind": "poisson", "rate": 4}, {"kind": "gamma", "rate": 4, "burstiness": 0.3},
    {"kind": "constant", "rate": 4}, {"kind": "ramp", "start_rate": 1, "end_rate": 7},
])
def test_with_rate_rescales_the_same_gaps(kw):
    a = arrival(**kw)
    b = with_rate(a, 3 * nominal_rate(a, 100), 100)
    assert nominal_rate(b, 100) == pytest.approx(3 * nominal_rate(a, 100))
    assert np.allclose(due(b, 100), due(a, 100) / 3)


def test_with_rate_refuses_kinds_without_a_rate():
    with pytest.raises(ValueError, match="has no rate to scale"):
        with_rate(arrival(kind="concurrency", concurrency=4), 2.0, 10)


# ---------------------------------------------------------------- datasets
def test_sharegpt_first_two_turns_and_skips(tmp_path):
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "tell me a story"},
                                      {"from": "gpt", "value": "once upon a time there was"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},  # no reply: skipped
        {"id": "c", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
                                      {"from": "human", "value": "more"}]},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    entries = read_sharegpt(path)
    assert [(e.prompt, e.output_len) for e in entries] == [("tell me a story", 6), ("hi", 1)]
    assert [e.output_len for e in read_sharegpt(path, output_len=50)] == [50, 50]
    path.write_text(json.dumps([{"conversations": "nope"}]))
    with pytest.raises(TraceError, match=rf"^{path}:1: 'conversations' must be a list"):
        read_sharegpt(path)


def test_vllm_custom_round_trip_and_errors(tmp_path):
    path = tmp_path / "c.jsonl"
    assert write_vllm_custom(path, [("t1 t2 t3", 8), ("hello world", 2)]) == 2
    assert [(e.prompt, e.output_len) for e in read_vllm_custom(path)] == [("t1 t2 t3", 8), ("hello world", 2)]
    path.write_text('{"prompt": "a", "output_tokens": 3}\n{"prompt": "b"}\n')
    with pytest.raises(TraceError, match=rf"^{path}:2: 'output_tokens' is missing"):
        read_vllm_custom(path)
    assert [e.output_len for e in read_vllm_custom(path, output_len=4)] == [4, 4]


def test_dataset_workload_cycles_shuffles_by_seed_and_uses_the_arrival(tmp_path):
    path = tmp_path / "c.jsonl"
    write_vllm_custom(path, [(f"t{10 + i} t{20 + i}", i + 1) for i in range(5)])
    spec = WorkloadSpec.model_validate({"dataset": {"format": "vllm-custom", "path": str(path)},
                                        "arrival": {"kind": "constant", "rate": 2}, "num_requests": 12,
                                        "warmup_requests": 1})
    a, b = build_requests(spec, 1, VOCAB), build_requests(spec, 1, VOCAB)
    assert a == b
    outs = [r.output_len for r in a.measured]
    assert sorted(outs[:5]) == [1, 2, 3, 4, 5] and outs[5:10] == outs[:5]  # a permutation, cycled
    in_order = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"shuffle": False})})
    assert [r.output_len for r in build_requests(in_order, 1, VOCAB).measured] == [1 + i % 5 for i in range(12)]
    assert any([r.output_len for r in build_requests(spec, s, VOCAB).measured[:5]] != [1, 2, 3, 4, 5]
               for s in range(5))
    assert [r.arrival_s for r in a.measured] == [i / 2 for i in range(12)] and a.requested_rate == 2
    assert all(r.prompt_text for r in a.measured) and a.warmup[0].prompt_text is None
    fixed = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"output_len": 9})})
    assert {r.output_len for r in build_requests(fixed, 1, VOCAB).measured} == {9}
    with pytest.raises(ValueError, match="dataset gives prompts and output lengths; remove input_len"):
        WorkloadSpec.model_validate({"dataset": {"format": "sharegpt", "path": "x"}, "input_len": 5})


# ---------------------------------------------------------------- measurement windows
def rec(i, due_s, ttft):
    return RequestRecord(index=i, scheduled_s=due_s, sent_s=due_s, first_token_s=due_s + ttft,
                         end_s=due_s + ttft + 0.1, token_times_s=[due_s + ttft, due_s + ttft + 0.1],
                         completion_tokens=2)


def test_warmup_and_cooldown_seconds_are_not_measured():
    # A queue filling up (slow first seconds) and draining (fast last seconds).
    records = [rec(i, float(i), 1.0 if i < 3 else (0.01 if i > 16 else 0.2)) for i in range(20)]
    window = measurement_window(records, warmup_s=3, cooldown_s=2.5)
    assert window == {0: (3.0, 16.5)}
    m = summarise(records, window=window)
    assert m.num_requests == 14 and m.ttft_p99_ms == pytest.approx(200)
    assert measurement_window(records) is None
    assert summarise(records).num_requests == 20


def test_a_level_measured_again_is_cut_and_timed_window_by_window():
    """Two windows of one level, each with its own clock: each loses its own first and last seconds,
    and the durations add up (throughput is not diluted by the pause between them)."""
    first = [rec(i, float(i), 1.0 if i < 3 else 0.2) for i in range(20)]
    again = [rec(100 + i, float(i), 1.0 if i < 3 else 0.2) for i in range(10)]
    for r in again:
        r.window = 1
    window = measurement_window(first + again, warmup_s=3, cooldown_s=0)
    assert window == {0: (3.0, 19.0), 1: (3.0, 9.0)}
    m = summarise(first + again, window=window)
    assert m.num_requests == 17 + 7 and m.ttft_p99_ms == pytest.approx(200)
    assert m.duration_s == pytest.approx((16 + 0.3) + (6 + 0.3))
    assert m.achieved_rate == pytest.approx((16 + 6) / (16 + 6))
    alone = summarise(first, window=window)
    assert m.request_throughput == pytest.approx((17 + 7) / (16.3 + 6.3)) and alone.num_requests == 17


# ---------------------------------------------------------------- requested vs achieved rate
@pytest.mark.parametrize("kw, requested", [
    ({"kind": "poisson", "rate": 6}, 6), ({"kind": "gamma", "rate": 6, "burstiness": 0.5}, 6),
    ({"kind": "constant", "rate": 6}, 6), ({"kind": "ramp", "start_rate": 2, "end_rate": 10}, None),
    ({"kind": "diurnal", "rate": 6, "period_s": 10}, 6), ({"kind": "burst"}, None),
    ({"kind": "concurrency", "concurrency": 4}, None),
])
def test_trial_reports_requested_and_achieved_rate_for_every_arrival_kind(study_doc, kw, requested):
    from orchestrator.study.spec import parse_study
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    study_doc.update(engine={"kind": "sim", "mode": "virtual"}, space={"max_num_seqs": 64})
    study_doc["workload"] = {"arrival": kw, "num_requests": 60, "input_len": 64, "output_len": 8}
    study = parse_study(study_doc)
    row = run_trial(study, {"max_num_seqs": 64}, trial_id="t", trial_number=0, ctx=TrialContext("r")).row
    assert row["status"] == "completed"
    rs = build_requests(study.workload, study.seed, 128_256)
    if kw["kind"] == "ramp":
        requested = nominal_rate(study.workload.arrival, 60)
    assert row["requested_rate"] == (pytest.approx(requested) if requested else None)
    due_s = sorted(r.arrival_s for r in rs.measured)
    if kw["kind"] == "burst":
        assert row["achieved_rate"] is None  # every send at t = 0
    elif kw["kind"] == "concurrency":
        assert row["achieved_rate"] > 0
    else:  # the virtual client sends exactly on time: achieved is the schedule's own rate
        assert row["achieved_rate"] == pytest.approx(59 / (due_s[-1] - due_s[0]))
        assert row["sched_lag_p99_ms"] == 0 and row["loadgen_overloaded"] == 0


@pytest.mark.parametrize("arrival", [{"kind": "poisson", "rate": 40}, {"kind": "gamma", "rate": 40, "burstiness": 0.5}])
def test_a_window_realises_the_rate_it_asks_for_whatever_the_seed(arrival):
    """The last of n requests is due at (n - 1) / rate (vLLM's rescaling): the seed draws only the bursts."""
    spec = WorkloadSpec.model_validate({"arrival": arrival, "num_requests": 480}).arrival
    spans = [due(spec, 480, seed)[-1] for seed in range(5)]
    assert spans == pytest.approx([479 / 40] * 5, rel=1e-9)
    gaps = [np.diff(due(spec, 480, seed)) for seed in range(2)]
    assert not np.allclose(gaps[0], gaps[1])  # still random inside the window
    cv = float(np.std(gaps[0]) / np.mean(gaps[0]))
    assert cv == pytest.approx(1.0 if arrival["kind"] == "poisson" else 2 ** 0.5, rel=0.2)
