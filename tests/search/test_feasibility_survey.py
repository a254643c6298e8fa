"""Pre-flight over the whole space: a study that cannot start anything ends with a report, not a front."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.search import feasibility
from orchestrator.search.driver import StudyStopped, run_study
from orchestrator.study.spec import parse_study


def infeasible_doc(study_doc, tmp_path):
    """Llama-3.1-70B on 24 GB L4s: bf16 weights need 131 GiB; TP 4 leaves 33 GiB per GPU."""
    doc = copy.deepcopy(study_doc)
    doc.update(name="hopeless", output=str(tmp_path / "out"))
    doc["model"] = {"name": "llama-3.1-70b"}
    doc["hardware"] = {"gpu": "L4", "gpus_per_node": 4}
    doc["space"] = {"tensor_parallel_size": [1, 2, 4, 8], "gpu_memory_utilization": [0.8, 0.95],
                    "max_num_seqs": [16, 64]}
    return doc


def test_survey_explains_why_nothing_can_start(study_doc, tmp_path):
    study = parse_study(infeasible_doc(study_doc, tmp_path))
    found = feasibility.survey(study, cluster_units=4, units_per_node=4)
    assert found.all_infeasible and not found.sampled and found.checked == 16
    assert found.failures == {"weights_oom": 12, "preflight": 4}  # TP 8 does not fit a 4-GPU node
    report = found.report()
    assert report.startswith("no configuration of the search space can start (all 16 configurations checked")
    assert "12 x weights_oom: the weights do not fit" in report and "raise tensor_parallel_size" in report
    assert "4 x preflight: the cluster is too small" in report
    assert "model weights need" in report  # vLLM's own message, with the numbers


def test_survey_counts_what_can_start(study_doc, tmp_path):
    doc = infeasible_doc(study_doc, tmp_path)
    doc["hardware"] = {"gpu": "H200", "gpus_per_node": 8}
    found = feasibility.survey(parse_study(doc), cluster_units=8, units_per_node=8)
    assert not found.all_infeasible and 0 < found.feasible < found.checked
    assert found.report().startswith(f"pre-flight: {found.feasible} of all 16 configurations can start")


def test_large_spaces_are_sampled_with_the_study_seed(study_doc, tmp_path):
    doc = infeasible_doc(study_doc, tmp_path)
    doc["space"]["max_num_seqs"] = {"type": "int", "low": 1, "high": 4096}
    study = parse_study(doc)
    a = feasibility.survey(study, max_points=200)
    assert a.sampled and a.checked == 200 and a.space_size == 4 * 2 * 4096
    assert a == feasibility.survey(study, max_points=200)


def test_run_study_stops_before_starting_anything(study_doc, tmp_path):
    study = parse_study(infeasible_doc(study_doc, tmp_path))
    with pytest.raises(StudyStopped) as info:
        run_study(study, quiet=True)
    assert str(info.value).startswith("study hopeless: no configuration of the search space can start")
    assert not (tmp_path / "out").exists()  # no run state, no journal, no Ray


def test_cli_reports_it_in_plain_words(study_doc, tmp_path, repo):
    path = tmp_path / "hopeless.yaml"
    path.write_text(yaml.safe_dump(infeasible_doc(study_doc, tmp_path)))
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(path)], capture_output=True, text=True,
                       timeout=120, cwd=repo)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "no configuration of the search space can start" in r.stderr and "weights_oom" in r.stderr


def test_cpu_engines_are_checked_against_their_kv_space(study_doc):
    """vLLM-CPU: the KV cache is exactly VLLM_CPU_KVCACHE_SPACE; one max_model_len sequence must fit."""
    doc = copy.deepcopy(study_doc)
    doc["engine"] = {"kind": "vllm", "platform": "cpu", "load_format": "dummy", "cpu_kv_cache_gib": 1}
    doc["hardware"] = {"gpu": "CPU"}
    study = parse_study(doc)
    args = feasibility.resolve_args(study, EngineArgs(max_model_len=8192, dtype="float32"))
    # Llama-3.1-8B in float32: 32 layers x 8 KV heads x 128 x 2 x 4 B = 256 KiB per token -> 4096 tokens in 1 GiB.
    from orchestrator.models.shapes import ModelShape

    assert feasibility.cpu_kv_tokens(ModelShape.load("llama-3.1-8b"), args, 1) == 4096
    verdict = feasibility.check(study, args)
    assert not verdict.ok and verdict.kind.value == "kv_cache_too_small" and "VLLM_CPU_KVCACHE_SPACE" in verdict.reason
    assert feasibility.check(study, feasibility.resolve_args(study, EngineArgs(max_model_len=4096))).ok
