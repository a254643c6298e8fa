"""Multi-turn sessions on real vLLM (the CPU build, a tiny random model): one engine, a few sessions.

Token-id prompts over ``/v1/completions``: each turn's prompt is the previous prompt, the
workload's answer and a new user message. vLLM's prefix cache holds whole blocks (128 tokens
on CPU) of what it has seen, and the engine's own answer is not the workload's, so a turn's
hit is the previous prompt in whole blocks (never the last prompt token). The engine-measured
``prefix_cache_hit_rate`` is that share of the prompt tokens, within 0.02, and the row's
``expected_prefix_hit_rate`` (unrounded) is above it by at most a block per turn. Every turn is
sent after its previous answer ended plus the think time, and the row carries the session columns.
"""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.results.schema import requests_to_table
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import cpu_vllm_doc

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

BLOCK = 128  # vLLM's CPU default block size
KV_BYTES = 64 * 2**20
POINT = {"max_model_len": 2048, "enable_prefix_caching": True, "enforce_eager": True}


def test_sessions_on_cpu_vllm(tmp_path, engine_cluster):

    from orchestrator.models.modelgen import make_model_dir
    from orchestrator.study.spec import parse_study

    model_dir = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights="random", max_position_embeddings=4096)
    study = parse_study(cpu_vllm_doc(
        model_dir, name="cpu-sessions", seed=1, engine={"engine_kwargs": {"kv_cache_memory_bytes": KV_BYTES}},
        workload={"arrival": {"kind": "poisson", "rate": 2}, "num_requests": 4, "warmup_requests": 0,
                  "warmup": {"enabled": False}, "input_len": {"kind": "uniform", "min": 150, "max": 300},
                  "sessions": {"turns": 3, "think_time_ms": 100}},
        space=POINT, objectives=["maximize session_goodput"], constraints=["ttft_p99_ms <= 5000"],
        output=str(tmp_path / "out")))
    # The space's point, as the search hands it to the trial actor (eager: no torch.compile of the model).
    out = run_trial(study, POINT, trial_id="t1", trial_number=0,
                    ctx=TrialContext("r1", serve_port=engine_cluster.serve_port))
    row = out.row
    assert row["status"] == "completed", row.get("failure_message")
    assert "--enforce-eager" in row["vllm_command"] and "--max-model-len 2048" in row["vllm_command"]
    req = requests_to_table(out.records, study=study.name, run_id="r1", trial_id="t1").to_pandas()
    assert req["success"].all() and len(req) == 12 and row["sessions"] == 4
    assert (req["prompt_tokens"] == req["expected_prompt_tokens"]).all()  # token ids: the engine saw ours
    for _, turns in req.sort_values(["session", "turn"]).groupby("session"):
        assert list(turns["turn"]) == [1, 2, 3]
        assert (turns["sent_s"].to_numpy()[1:] >= turns["end_s"].to_numpy()[:-1] + 0.1).all()
    # What the cache can hold of each prompt: the previous prompt, in whole blocks, short of the last token.
    cached = np.minimum(req["expected_cached_tokens"], req["expected_prompt_tokens"] - 1) // BLOCK * BLOCK
    in_blocks = cached.sum() / req["expected_prompt_tokens"].sum()
    measured = row["prefix_cache_hit_rate"]
    print(f"prefix cache: measured {measured:.4f}, expected {row['expected_prefix_hit_rate']:.4f}, "
          f"in whole {BLOCK}-token blocks {in_blocks:.4f}")
    assert measured == pytest.approx(in_blocks, abs=0.02)
    lost = BLOCK * len(req) / req["expected_prompt_tokens"].sum()
    assert in_blocks <= row["expected_prefix_hit_rate"] <= in_blocks + lost
    assert row["session_slo_attainment"] == 1.0 and row["ttft_p50_ms_later_turns"] is not None
