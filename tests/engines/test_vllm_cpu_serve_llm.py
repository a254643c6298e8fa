"""Real vLLM (the CPU build) behind ``ray.serve.llm``'s OpenAI ingress (``engine.ingress: serve_llm``).

One trial whose serving-layer settings are searched parameters: they must reach
``ray.serve.llm`` (its ``experimental_configs``), the trial must serve through Serve's
proxy, record vLLM's metrics as Ray exports them, and leave no application and no
engine process behind. The recommended deployment carries the serving settings.

The ingress is throttled on purpose: a 400 ms stream-batching window holds every first
token back, so the client's TTFT is far above the engine's own and the trial must be
flagged ``harness_bound``, naming TTFT as the limiting side.
"""

from __future__ import annotations

import json
import time

import pytest

from support.vllm_processes import vllm_processes

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_serve_llm_ingress_with_searched_serving_settings(tmp_path, engine_cluster):
    from ray import serve

    from orchestrator.apps.recommend import recommend
    from orchestrator.models.modelgen import make_model_dir
    from orchestrator.results import load_trials
    from orchestrator.search.driver import run_study
    from orchestrator.study.spec import parse_study
    from support.studies import cpu_vllm_doc

    model_dir = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights="random")
    study = parse_study(cpu_vllm_doc(
        model_dir, one_process=False, name="cpu-serve-llm", engine={"ingress": "serve_llm"},
        # No steady warm-up: what is checked here is where the settings went, not latencies.
        workload={"num_requests": 16, "warmup_requests": 2, "warmup": {"enabled": False},
                  "input_len": {"kind": "uniform", "min": 64, "max": 200}},
        space={"max_num_seqs": 4, "max_model_len": 1024, "enforce_eager": True,
               "stream_batching_interval_ms": [400.0], "num_ingress_replicas": [1]},
        objectives=["maximize output_throughput", "minimize ttft_p99_ms"],
        constraints=["ttft_p99_ms <= 5000"],
        search={"sampler": "random"}, budget={"trials": 1, "max_concurrent_trials": 1},
        output=str(tmp_path / "out")))
    run = run_study(study, quiet=True, serve_port=engine_cluster.serve_port)
    leftover = [a for a in serve.status().applications if a.startswith("tune-")]
    assert leftover == []
    time.sleep(2)
    assert vllm_processes(engine_cluster.cache_root) == [], "a vLLM process outlived its trial"

    (row,) = [r for _, r in load_trials(run.study_dir).iterrows()]
    assert row["status"] == "completed", (row["failure_kind"], row["failure_message"])
    assert row["completed"] == 16 and row["failed"] == 0
    facts = json.loads(row["extra_json"])["engine_facts"]
    # The searched serving settings reached ray.serve.llm, and the trial went through Serve's proxy.
    assert facts["ingress"] == "serve_llm"
    assert facts["llm_config"]["experimental_configs"] == {"stream_batching_interval_ms": 400.0,
                                                           "num_ingress_replicas": 1}
    assert json.loads(row["engine_args_json"])["stream_batching_interval_ms"] == 400.0
    assert "stream_batching_interval_ms" not in facts["llm_config"]["engine_kwargs"]
    assert "--stream-batching-interval-ms" not in row["vllm_command"]  # not a vLLM argument
    assert json.loads(row["extra_json"])["endpoint"].endswith("/tune-" + row["trial_id"])

    # vLLM's own histograms, as Ray exports them: the engine saw the first tokens long before the client.
    assert row["engine_ttft_p50_ms"] is not None and row["engine_output_throughput"] > 0
    assert row["engine_ttft_p50_ms"] <= row["ttft_p50_ms"]
    assert bool(row["harness_bound"]), row["harness_bound_reason"]
    assert row["harness_bound_reason"].startswith("client TTFT p50"), row["harness_bound_reason"]

    # Where the start went, read from the replica's lines in Ray's logs (the import phase counted from
    # the deploy, Serve placing the replica included); an eager engine compiles nothing.
    ran = ["start_import_s", "start_load_s", "start_profile_s", "start_ready_s"]
    assert all(row[c] == row[c] and row[c] >= 0 for c in ran), row[ran]
    assert sum(row[c] for c in ran) <= row["startup_s"] + 2.0, (row[ran], row["startup_s"])
    assert row["start_compile_s"] != row["start_compile_s"]  # NaN: no torch.compile

    rec = recommend(load_trials(run.study_dir), study)
    assert rec.llm_config()["experimental_configs"] == {"stream_batching_interval_ms": 400.0,
                                                        "num_ingress_replicas": 1}
