"""Multi-turn sessions on the served simulator: Ray Serve, real HTTP, real time.

One trial of a chat session workload: every turn goes over HTTP after its previous answer's
last token plus the think time (the load generator's closed loop within a session), the row
carries the session columns and the per-turn table, the requests table the session and turn
of every request, and the engine's prefix-cache hit rate is what the sessions share (the
previous turn's prompt), less at most one 16-token block per turn.
"""

from __future__ import annotations

import json

import pytest

from conftest import shared_serve
from orchestrator.results import ResultsStore, load_requests
from orchestrator.results.schema import requests_to_table
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import sim_doc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_serve():
    return shared_serve()  # the port Serve's proxy listens on


def test_served_sim_sessions(tmp_path, ray_serve):
    doc = sim_doc(
        name="turns-served", seed=4, engine={"mode": "served"},
        workload={"api": "chat", "arrival": {"kind": "poisson", "rate": 4}, "num_requests": 10,
                  "warmup_requests": 0, "warmup": {"enabled": False},
                  "input_len": {"kind": "uniform", "min": 100, "max": 300}, "output_len": 16,
                  "sessions": {"turns": {"kind": "uniform", "min": 2, "max": 4}, "think_time_ms": 200},
                  "timeout_s": 30},
        objectives=["maximize session_goodput"], constraints=["ttft_p99_ms <= 2000"], output=str(tmp_path / "out"))
    # The whole space: max_num_seqs stays vLLM's default.
    study = parse_study(doc | {"space": {"max_model_len": 8192, "enable_prefix_caching": True}})
    out = run_trial(study, {}, trial_id="t1", trial_number=0, ctx=TrialContext("r1", serve_port=ray_serve))
    row = out.row
    assert row["status"] == "completed", row.get("failure_message")
    ResultsStore(study.output, study.name).write_trial(
        row, requests_to_table(out.records, study=study.name, run_id="r1", trial_id="t1"),
        param_types=study.space.column_types())
    requests = load_requests(tmp_path / "out" / study.name)
    assert requests["success"].all() and requests["session"].nunique() == 10 == row["sessions"]
    by = requests.sort_values(["session", "turn"]).groupby("session")
    for _, turns in by:
        assert list(turns["turn"]) == list(range(1, len(turns) + 1))
        prev_end, sent = turns["end_s"].to_numpy()[:-1], turns["sent_s"].to_numpy()[1:]
        assert (sent >= prev_end + 0.2).all()  # think time after the previous answer's last token
    # Every turn met the 2 s TTFT: every session is good.
    assert row["session_slo_attainment"] == 1.0
    assert row["session_goodput"] == pytest.approx(10 / row["duration_s"])
    turns = json.loads(row["extra_json"])["turns"]
    assert [t["turn"] for t in turns][:2] == [1, 2] and turns[0]["requests"] == 10
    assert row["ttft_p50_ms_first_turn"] is not None and row["ttft_p50_ms_later_turns"] is not None
    # The served engine counts prompt tokens of the chat template-free word encoding: the same tokens.
    expected = row["expected_prefix_hit_rate"]
    print(f"prefix cache: measured {row['prefix_cache_hit_rate']:.4f}, expected {expected:.4f}")
    lost = 16 * len(requests) / requests["expected_prompt_tokens"].sum()
    assert expected - lost - 0.01 <= row["prefix_cache_hit_rate"] <= expected + 0.01
