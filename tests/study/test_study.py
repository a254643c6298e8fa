"""Study-file validation: one clear line per problem, naming key, value and what is allowed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.study.load import load_study
from orchestrator.study.space import SearchSpace
from orchestrator.study.spec import StudyFileError, parse_study


def problems_of(doc) -> list[str]:
    with pytest.raises(StudyFileError) as info:
        parse_study(doc, "s.yaml")
    return [str(p) for p in info.value.problems]


def test_valid_study_parses(study_doc):
    s = parse_study(study_doc)
    assert s.directions == ["maximize", "minimize"]
    assert s.request_slo().ttft_ms == 2000
    assert s.space.ordered_names() == ["max_num_seqs", "max_num_batched_tokens"]


def test_typo_key_names_the_key_and_suggests(study_doc):
    study_doc["hardware"]["gpus_per_nod"] = 2
    (line,) = problems_of(study_doc)
    assert line.startswith("hardware.gpus_per_nod: unknown key")
    assert "did you mean 'gpus_per_node'" in line and "allowed: gpu, gpus_per_node, nodes" in line


def test_wrong_type(study_doc):
    study_doc["workload"]["num_requests"] = "many"
    (line,) = problems_of(study_doc)
    assert line.startswith("workload.num_requests:") and "'many'" in line


def test_out_of_range_engine_arg(study_doc):
    study_doc["space"]["gpu_memory_utilization"] = {"type": "float", "low": 0.5, "high": 1.5}
    (line,) = problems_of(study_doc)
    assert line.startswith("space.gpu_memory_utilization:")
    assert "1.5" in line and "<= 1" in line


def test_empty_choice_list(study_doc):
    study_doc["space"]["kv_cache_dtype"] = []
    (line,) = problems_of(study_doc)
    assert line.startswith("space.kv_cache_dtype.choices:") and "at least 1" in line


def test_bad_categorical_value_lists_allowed(study_doc):
    study_doc["space"]["kv_cache_dtype"] = ["auto", "fp9"]
    (line,) = problems_of(study_doc)
    assert "'fp9'" in line and "'fp8'" in line


def test_condition_on_unknown_parameter(study_doc):
    study_doc["space"]["long_prefill_token_threshold"] = {
        "type": "int", "low": 0, "high": 512, "when": {"enable_chunked_prefil": True}}
    (line,) = problems_of(study_doc)
    assert line.startswith("space.long_prefill_token_threshold.when.enable_chunked_prefil:")
    assert "unknown parameter" in line and "max_num_seqs" in line


def test_unknown_engine_argument_suggests(study_doc):
    study_doc["space"]["max_num_seq"] = 8
    (line,) = problems_of(study_doc)
    assert "did you mean 'max_num_seqs'" in line


@pytest.mark.parametrize("space", [
    {"max_num_seq": 8},  # unknown engine argument
    {"gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 1.5}},  # value the argument does not allow
    {"max_num_seqs": {"type": "int", "low": 8, "high": 64, "when": {"enforce_eager": True}}},  # unknown parent
    {"enforce_eager": {"type": "categorical", "choices": [True, False], "when": {"enforce_eager": True}}},
    {"enforce_eager": {"type": "categorical", "choices": [True, False], "when": {"max_num_seqs": 8}},
     "max_num_seqs": {"type": "int", "low": 8, "high": 64, "when": {"enforce_eager": True}}},  # a cycle
])
def test_search_space_and_study_file_report_the_same_problems(study_doc, space):
    study_doc["space"] = space
    lines = problems_of(study_doc)
    with pytest.raises(ValidationError) as info:
        SearchSpace.model_validate(space)
    assert lines and all(line in str(info.value) for line in lines)


def test_unknown_metric_and_bad_constraint(study_doc):
    study_doc["objectives"] = ["maximize output_throughput_per_gpus"]
    study_doc["constraints"] = ["ttft_p99_ms <== 5"]
    lines = problems_of(study_doc)
    assert any(l.startswith("objectives.0: unknown metric") and "output_throughput_per_gpu" in l
               for l in lines)
    assert any(l.startswith("constraints.0:") and "METRIC <= NUMBER" in l for l in lines)


def test_several_problems_reported_together(study_doc):
    study_doc["hardware"]["gpu"] = "H1000"
    study_doc["budget"] = {"trials": 0}
    study_doc["model"]["name"] = "llama-9"
    lines = problems_of(study_doc)
    assert len(lines) == 3
    assert any(l.startswith("hardware.gpu:") and "H100-80GB" in l for l in lines)


def test_condition_cycle_rejected(study_doc):
    study_doc["space"]["enable_chunked_prefill"] = {"type": "categorical", "choices": [True, False],
                                                    "when": {"enforce_eager": True}}
    study_doc["space"]["enforce_eager"] = {"type": "categorical", "choices": [True, False],
                                           "when": {"enable_chunked_prefill": True}}
    lines = problems_of(study_doc)
    assert any("cycle" in l for l in lines)


def test_validate_cli_exit_code_and_no_traceback(tmp_path, study_doc):
    study_doc["hardware"]["gpus_per_nod"] = 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(study_doc))
    good = tmp_path / "good.yaml"
    del study_doc["hardware"]["gpus_per_nod"]
    good.write_text(yaml.safe_dump(study_doc))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    r = subprocess.run([sys.executable, "-m", "orchestrator", "validate", str(bad), str(good), str(broken)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr + r.stdout
    assert f"{bad}: hardware.gpus_per_nod: unknown key" in r.stderr
    assert f"{broken}: <root>: line" in r.stderr and "not valid YAML" in r.stderr
    assert f"{good}: OK" in r.stdout


def test_shipped_study_files_are_valid(repo):
    paths = sorted((repo / "search_spaces").glob("*.yaml"))
    # a moved folder or a wrong pattern would check nothing
    assert repo / "search_spaces" / "quickstart.yaml" in paths and len(paths) >= 10, paths
    for path in paths:
        load_study(path)
