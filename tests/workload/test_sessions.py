"""Multi-turn sessions: the workload, the closed loop within a session (HTTP load generator and
virtual simulator), session and per-turn metrics, the files they are read from, and a study.

The served simulator and real vLLM are in ``test_sessions_served.py`` and ``test_vllm_cpu_sessions.py``.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.loadgen import APIS, Endpoint, run_load_sync
from orchestrator.measure.metrics import RequestSLO
from orchestrator.measure.records import RequestRecord
from orchestrator.measure.session_metrics import session_columns, turn_table
from orchestrator.models.shapes import ModelShape
from orchestrator.sim.core import SimEngineCore
from orchestrator.sim.virtual import simulate
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from orchestrator.workload.generate import build_requests
from orchestrator.workload.session_files import read_session_trace, read_sharegpt_sessions
from orchestrator.workload.sessions import expected_prefix_hit_rate
from orchestrator.workload.spec import WorkloadSpec
from orchestrator.workload.trace import TraceError
from support.fake_openai import endpoint, fake, server  # noqa: F401 - fixtures
from support.recorded_trial import run_trial
from support.studies import sim_doc

VOCAB = 32000


def session_spec(**over) -> WorkloadSpec:
    doc = {"arrival": {"kind": "poisson", "rate": 2}, "num_requests": 12, "warmup_requests": 2,
           "input_len": {"kind": "uniform", "min": 20, "max": 60}, "output_len": {"kind": "uniform", "min": 8, "max": 24},
           "sessions": {"turns": {"kind": "uniform", "min": 1, "max": 5},
                        "think_time_ms": {"kind": "uniform", "min": 50, "max": 150}}}
    doc.update(over)
    return WorkloadSpec.model_validate(doc)


def by_session(requests):
    out: dict[int, list] = {}
    for r in requests:
        out.setdefault(r.session, []).append(r)
    return out


# ---------------------------------------------------------------- the workload
def test_each_turn_resends_the_conversation_so_far():
    rs = build_requests(session_spec(), seed=3, vocab_size=VOCAB)
    assert rs.sessions == 12 and len(rs.warmup) == 2
    sessions = by_session(rs.measured)
    assert sorted(sessions) == list(range(12)) and any(len(t) > 2 for t in sessions.values())
    for turns in sessions.values():
        assert [t.turn for t in turns] == list(range(1, len(turns) + 1))
        assert len({t.arrival_s for t in turns}) == 1 and turns[0].think_s == 0.0
        for prev, cur in zip(turns, turns[1:]):
            # previous prompt + previous answer (output_len tokens, the workload's) + a new user message
            assert cur.prompt_token_ids[:prev.prompt_len] == prev.prompt_token_ids
            assert cur.segments[:-1] == prev.segments + (prev.output_len,)
            assert cur.segments[-1] >= 20 and cur.history_len == prev.prompt_len
            assert 0.05 <= cur.think_s <= 0.15
        for t in turns:
            assert sum(t.segments) == t.prompt_len
    assert rs.requests_per_arrival == len(rs.measured) / 12
    hit = sum(r.history_len for r in rs.measured) / sum(r.prompt_len for r in rs.measured)
    assert expected_prefix_hit_rate(rs.measured) == pytest.approx(hit) and 0.3 < hit < 0.9


def test_sessions_are_deterministic_and_each_level_draws_its_own():
    spec = session_spec()
    a, b = build_requests(spec, 5, VOCAB), build_requests(spec, 5, VOCAB)
    assert a == b
    other = build_requests(spec, 5, VOCAB, level=1)
    assert other.sessions == 12
    firsts = {r.prompt_token_ids for r in a.measured}
    assert not firsts & {r.prompt_token_ids for r in other.measured}  # no prompt the cache already holds


def test_a_session_ends_before_a_turn_longer_than_max_prompt_len():
    spec = session_spec(sessions={"turns": 6, "max_prompt_len": 150})
    rs = build_requests(spec, 1, VOCAB)
    assert all(r.prompt_len <= 150 for r in rs.measured)
    counts = [len(t) for t in by_session(rs.measured).values()]
    assert max(counts) < 6 and min(counts) >= 1


def test_shared_prefix_opens_the_first_turn_and_counts_once_sent():
    spec = session_spec(shared_prefix={"groups": 1, "length": 64})
    rs = build_requests(spec, 2, VOCAB)
    firsts = [r for r in rs.measured if r.turn == 1]
    assert len({r.prompt_token_ids[:64] for r in firsts}) == 1
    assert firsts[0].history_len == 0 and all(r.history_len == 64 for r in firsts[1:])


@pytest.mark.parametrize("over, key", [
    ({"trace": {"path": "chat"}}, "sessions exclude trace"),
    ({"arrival": {"kind": "concurrency", "concurrency": 4}}, "arrival kind 'concurrency' is not allowed"),
])
def test_session_spec_errors_name_the_clash(over, key):
    with pytest.raises(ValidationError, match=key):
        session_spec(**over)


def test_turns_shorthand_and_bad_turns():
    assert session_spec(sessions={"turns": 3}).sessions.turns.value == 3
    with pytest.raises(ValidationError, match="turns"):
        session_spec(sessions={"turns": 0})


def test_chat_sends_the_turns_as_alternating_messages():
    rs = build_requests(session_spec(), seed=3, vocab_size=VOCAB)
    third = next(r for r in rs.measured if r.turn == 3)
    body = APIS["chat"].build_body(Endpoint("http://x", "m", api="chat"), third, True)
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    words = " ".join(m["content"] for m in body["messages"]).split()
    assert words == [f"t{i}" for i in third.prompt_token_ids]  # the same tokens, split at the turns


# ---------------------------------------------------------------- closed loop within a session
def _check_closed_loop(records, requests, slack_s: float):
    reqs = {r.index: r for r in requests.measured}
    recs = {r.index: r for r in records if not r.warmup}
    assert len(recs) == len(reqs)
    for i, rec in recs.items():
        req = reqs[i]
        assert (rec.session, rec.turn, rec.expected_cached_tokens) == (req.session, req.turn, req.history_len)
        if req.turn == 1:
            assert rec.scheduled_s == pytest.approx(req.arrival_s)
        else:
            prev = recs[i - 1]
            due = prev.end_s + req.think_s
            assert rec.scheduled_s == pytest.approx(due, abs=1e-9)
            assert due <= rec.sent_s <= due + slack_s


def test_http_load_sends_each_turn_think_time_after_the_answer_ended(fake):
    spec = session_spec(num_requests=6, input_len=12, output_len=4,
                        sessions={"turns": 3, "think_time_ms": {"kind": "uniform", "min": 30, "max": 80}},
                        warmup_requests=0)
    rs = build_requests(spec, 1, VOCAB)
    records = run_load_sync(endpoint(fake, fake_ttft_ms=40, fake_itl_ms=5), rs, timeout_s=10)
    _check_closed_loop(records, rs, slack_s=0.5)
    bodies = {tuple(b["prompt"]): b for b in fake.stats()["bodies"]}
    assert set(bodies) == {r.prompt_token_ids for r in rs.measured}  # every turn's whole conversation


def _core(**args):
    return SimEngineCore(ModelShape.load("llama-3.1-8b"), get_gpu("H100-80GB"),
                         EngineArgs(max_model_len=8192, **args))


def test_virtual_sim_honours_the_closed_loop_and_the_prefix_cache_gets_the_history():
    spec = session_spec(num_requests=30, warmup_requests=0, input_len={"kind": "uniform", "min": 100, "max": 300},
                        output_len={"kind": "uniform", "min": 50, "max": 150},
                        sessions={"turns": {"kind": "uniform", "min": 2, "max": 6}, "think_time_ms": 500})
    rs = build_requests(spec, 4, VOCAB)
    core = _core(enable_prefix_caching=True)
    records = simulate(core, rs)
    assert all(r.success for r in records)
    _check_closed_loop(records, rs, slack_s=0.0)  # virtual time: sent exactly when due
    s = core.stats()
    measured = s.prefix_cache_hits_total / s.prefix_cache_queries_total
    expected = expected_prefix_hit_rate(rs.measured)
    # vLLM caches whole blocks (16 tokens) and never the last prompt token: at most a block per turn less.
    lost = 16 * len(rs.measured) / sum(r.prompt_len for r in rs.measured)
    assert expected - lost - 0.01 <= measured <= expected + 0.01
    off = _core(enable_prefix_caching=False)
    simulate(off, rs)
    assert off.stats().prefix_cache_hits_total == 0


# ---------------------------------------------------------------- metrics
def _turn(session, turn, ttft, *, ok=True, prompt=100, cached=0):
    return RequestRecord(index=10 * session + turn, scheduled_s=float(session), sent_s=float(session),
                         first_token_s=session + ttft, end_s=session + ttft + 0.1 if ok else None,
                         token_times_s=[session + ttft, session + ttft + 0.1], completion_tokens=2,
                         error=None if ok else "boom", session=session, turn=turn,
                         expected_prompt_tokens=prompt, expected_cached_tokens=cached)


def test_a_session_meets_the_slo_only_if_every_turn_does():
    records = [_turn(0, 1, 0.05), _turn(0, 2, 0.05, prompt=300, cached=100),
               _turn(1, 1, 0.05), _turn(1, 2, 0.50, prompt=300, cached=100),  # one slow turn
               _turn(2, 1, 0.05), _turn(2, 2, 0.05, ok=False, prompt=300, cached=100)]  # one failed turn
    slo = RequestSLO(ttft_ms=200)
    cols = session_columns(records, slo=slo, duration_s=2.0)
    assert cols["sessions"] == 3 and cols["session_slo_attainment"] == pytest.approx(1 / 3)
    assert cols["session_goodput"] == pytest.approx(0.5) and cols["turns_per_session_mean"] == 2
    assert cols["expected_prefix_hit_rate"] == pytest.approx(300 / 1200)
    assert cols["ttft_p50_ms_first_turn"] == pytest.approx(50) and cols["ttft_p50_ms_later_turns"] == pytest.approx(275)
    assert session_columns(records, slo=RequestSLO(), duration_s=2.0)["session_slo_attainment"] == pytest.approx(2 / 3)
    table = turn_table(records, slo=slo)
    assert [(t["turn"], t["requests"], t["completed"]) for t in table] == [(1, 3, 3), (2, 3, 2)]
    assert table[1]["slo_attainment"] == pytest.approx(1 / 3) and table[1]["expected_prefix_hit_rate"] == pytest.approx(1 / 3)
    # A session is measured when its first turn is due inside the window; all its turns count.
    assert session_columns(records, slo=slo, duration_s=2.0, window={0: (0.5, 9.0)})["sessions"] == 2
    single = [RequestRecord(index=0, scheduled_s=0.0)]  # a workload of single requests: no session columns
    assert set(session_columns(single, slo=slo, duration_s=1.0).values()) == {None}


# ---------------------------------------------------------------- files
def test_sharegpt_keeps_every_turn_and_the_recorded_answers(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hi there"},
                           {"from": "gpt", "value": "hello how are you"}, {"from": "human", "value": "fine thanks"},
                           {"from": "gpt", "value": "good"}, {"from": "human", "value": "unanswered"}]},
        {"conversations": [{"from": "gpt", "value": "out of turn"}]},
        {"conversations": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two words"}]},
    ]))
    sessions = read_sharegpt_sessions(path)
    assert [len(s.turns) for s in sessions] == [2, 1]
    first = sessions[0].turns
    assert first[0].user_text == "be brief hi there" and first[0].output_len == 4 and first[1].output_len == 1
    spec = WorkloadSpec.model_validate({"arrival": {"kind": "poisson", "rate": 1}, "num_requests": 2,
                                        "sessions": {"turns": 1, "file": {"format": "sharegpt", "path": str(path),
                                                                          "shuffle": False}}})
    rs = build_requests(spec, 0, VOCAB)
    assert [r.prompt_text for r in rs.measured] == [
        "be brief hi there", "be brief hi there hello how are you fine thanks", "one"]
    assert rs.measured[1].history_len == 4 and rs.measured[1].segments == (4, 4, 2)


def test_session_trace_schema_and_its_errors(tmp_path):
    path = tmp_path / "s.jsonl"
    lines = [{"session": "b", "turn": 1, "timestamp": 5.0, "input_len": 30, "output_len": 10},
             {"session": "a", "turn": 2, "input_len": 20, "output_len": 8, "think_s": 2.0},
             {"session": "a", "turn": 1, "timestamp": 1.0, "input_len": 40, "output_len": 12}]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    sessions = read_session_trace(path)
    assert [len(s.turns) for s in sessions] == [1, 2] and sessions[1].start_s == 1.0
    spec = WorkloadSpec.model_validate({"num_requests": 2, "sessions": {
        "turns": 1, "file": {"format": "session-trace", "path": str(path), "shuffle": False, "timestamps": True,
                             "time_scale": 0.5}}})
    rs = build_requests(spec, 0, VOCAB)
    starts = sorted({(r.session, r.arrival_s) for r in rs.measured})
    assert [s for _, s in starts] == [0.0, 2.0] and rs.requested_rate == pytest.approx(0.5)
    assert [r.think_s for r in rs.measured if r.turn == 2] == [1.0]  # the file's, scaled
    for bad, msg in [({"session": "a", "turn": 2, "input_len": 5, "output_len": 1}, "has no turn 1"),
                     ({"session": "a", "turn": 1, "prompt": "x", "input_len": 5, "output_len": 1}, "exactly one"),
                     ({"session": "a", "turn": 1, "input_len": 5, "output_len": 1, "speaker": "x"}, "unknown key")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(TraceError, match=f"{path}:1: .*{msg}"):
            read_session_trace(path)


# ---------------------------------------------------------------- a study
def test_virtual_study_rows_carry_session_columns_and_a_capacity_in_sessions_per_second(tmp_path):
    study = parse_study(sim_doc(
        name="turns", seed=1,
        workload={"arrival": {"kind": "poisson", "rate": 1}, "num_requests": 20, "warmup_requests": 0,
                  "warmup": {"enabled": False}, "input_len": 200, "output_len": 64,
                  "sessions": {"turns": {"kind": "uniform", "min": 2, "max": 5}, "think_time_ms": 1000}},
        space={"max_model_len": 8192, "max_num_seqs": 64},
        objectives=["maximize capacity_rps"], constraints=["ttft_p99_ms <= 300"],
        capacity={"start_rate": 1, "max_levels": 4, "requests_per_level": 20}, output=str(tmp_path / "out")))
    trial = run_trial(study, {}, trial_id="t0", trial_number=0, ctx=TrialContext(run_id="r"))
    row = trial.row
    assert row["status"] == "completed" and row["capacity_rps"] > 1
    assert row["sessions"] == 20 and 2 <= row["turns_per_session_mean"] <= 5
    assert row["prefix_cache_hit_rate"] == pytest.approx(row["expected_prefix_hit_rate"], abs=0.05)
    extra = json.loads(row["extra_json"])
    assert extra["rate_unit"] == "sessions/s" and [t["turn"] for t in extra["turns"]][:2] == [1, 2]
    assert row["requested_rate"] in [p[0] for p in extra["capacity"]["curve"]]
