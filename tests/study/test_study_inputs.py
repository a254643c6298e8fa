"""Study files and command lines that used to validate but break (or silently bend) the run.

Every case goes through the real command line (``orchestrator ...``, :mod:`support.cli`): one line per
problem naming the key path, exit code 2, never a traceback.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from orchestrator.study.load import load_study
from support.cli import orchestrator


def validate(path: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    r = orchestrator("validate", str(path), cwd=cwd)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    return r


def problem_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.strip()]


def the_one_problem(tmp_path: Path, doc: dict) -> tuple[Path, str]:
    """``doc`` as a study file, refused by ``validate`` with exactly one problem: the file and its line."""
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = validate(f)
    assert r.returncode == 2, r.stdout
    (line,) = problem_lines(r)
    return f, line


# ------------------------------------------------------------------ duplicate keys
def test_duplicate_yaml_keys_are_an_error_naming_key_path_and_line(tmp_path, study_doc):
    text = yaml.safe_dump(study_doc, sort_keys=False)
    # The same parameter twice in the space (the last one used to win silently) and the name twice.
    text = text.replace("space:\n", "space:\n  max_num_seqs: 8\n", 1) + "name: other\n"
    f = tmp_path / "dup.yaml"
    f.write_text(text)
    lines = text.splitlines()
    seqs_line = [i + 1 for i, l in enumerate(lines) if l.strip().startswith("max_num_seqs:")][1]
    name_line = len(lines)
    r = validate(f)
    assert r.returncode == 2, r.stdout
    out = problem_lines(r)
    assert len(out) == 2, out
    assert any(l.startswith(f"{f}: space.max_num_seqs: duplicate key on line {seqs_line}") for l in out), out
    assert any(l.startswith(f"{f}: name: duplicate key on line {name_line}") and "first on line 1" in l
               for l in out), out


def test_duplicate_keys_inside_lists_name_the_index(tmp_path, study_doc):
    study_doc["search"] = {"initial_points": [{"max_num_seqs": 16}, {"max_num_seqs": 32}]}
    text = yaml.safe_dump(study_doc, sort_keys=False, default_flow_style=False)
    text = text.replace("  - max_num_seqs: 32\n", "  - max_num_seqs: 32\n    max_num_seqs: 64\n")
    f = tmp_path / "dup.yaml"
    f.write_text(text)
    r = validate(f)
    assert r.returncode == 2
    (line,) = problem_lines(r)
    assert line.startswith(f"{f}: search.initial_points.1.max_num_seqs: duplicate key on line"), line


def test_yaml_anchors_and_merge_keys_still_load(tmp_path, study_doc):
    """Only real duplicates are errors: a merge key's entries may be overridden, as YAML allows."""
    del study_doc["space"]
    text = yaml.safe_dump(study_doc, sort_keys=False)
    text += ("space:\n"
             "  max_num_seqs: &seqs {type: int, low: 8, high: 256}\n"
             "  max_num_batched_tokens: {<<: *seqs, low: 1024, high: 8192}\n")
    f = tmp_path / "ok.yaml"
    f.write_text(text)
    r = validate(f)
    assert r.returncode == 0, r.stderr
    p = load_study(f).space.params["max_num_batched_tokens"]
    assert (p.low, p.high) == (1024, 8192)


# ------------------------------------------------------------------ initial points
@pytest.mark.parametrize("point, expected", [
    ({"max_num_seqs": "lots"}, "search.initial_points.0.max_num_seqs: not in the space: an integer in [8, 256]"
                               " (got 'lots')"),
    ({"max_num_seqs": 100000}, "search.initial_points.0.max_num_seqs: not in the space: an integer in [8, 256]"
                               " (got 100000)"),
    ({"max_num_seqs": True}, "search.initial_points.0.max_num_seqs: not in the space: an integer in [8, 256]"
                             " (got true)"),
    ({"max_num_batched_tokens": 4096}, "search.initial_points.0.max_num_batched_tokens: not in the space: one of"
                                       " [2048, 8192] (got 4096)"),
    ({"gpu_memory_utilization": 0.83}, "search.initial_points.0.gpu_memory_utilization: not in the space: a number"
                                       " in [0.8, 0.9] in steps of 0.05 from 0.8 (got 0.83)"),
    ({"gpu_memory_utilization": 0.95}, "search.initial_points.0.gpu_memory_utilization: not in the space: a number"
                                       " in [0.8, 0.9] in steps of 0.05 from 0.8 (got 0.95)"),
    ({"enforce_eager": True}, "search.initial_points.0.enforce_eager: not in the space: the fixed value false"
                              " (got true)"),
    ({"max_num_seq": 16}, "search.initial_points.0.max_num_seq: not a parameter of the space"),
])
def test_initial_points_are_checked_against_the_space(tmp_path, study_doc, point, expected):
    study_doc["space"]["gpu_memory_utilization"] = {"type": "float", "low": 0.8, "high": 0.9, "step": 0.05}
    study_doc["space"]["enforce_eager"] = False
    study_doc["search"] = {"initial_points": [point]}
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: {expected}"), line


def test_initial_points_inside_the_space_validate(tmp_path, study_doc):
    """A point may leave parameters out; values on the space's grid and the fixed value are fine."""
    study_doc["space"]["gpu_memory_utilization"] = {"type": "float", "low": 0.8, "high": 0.9, "step": 0.05}
    study_doc["space"]["enforce_eager"] = False
    study_doc["search"] = {"initial_points": [
        {"max_num_seqs": 8}, {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
        {"gpu_memory_utilization": 0.85, "enforce_eager": False}, {"gpu_memory_utilization": 0.9}, {}]}
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(study_doc))
    r = validate(f)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ model path beside the study
def _study_with_local_model(tmp_path: Path, study_doc: dict) -> Path:
    folder = tmp_path / "studies"
    (folder / "mymodel").mkdir(parents=True)
    shutil.copy(REPO / "search_spaces" / "models" / "tiny-llama.json", folder / "mymodel" / "config.json")
    study_doc["model"]["name"] = "mymodel/config.json"
    study_doc["engine"] = {"kind": "sim", "mode": "virtual"}
    study_doc["workload"]["num_requests"] = 8
    study_doc["budget"] = {"trials": 1}
    study_doc["output"] = str(tmp_path / "results")
    f = folder / "study.yaml"
    f.write_text(yaml.safe_dump(study_doc))
    return f


def test_relative_model_path_resolves_from_the_study_folder(tmp_path, study_doc):
    f = _study_with_local_model(tmp_path, study_doc)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for path, cwd in ((f, elsewhere), (Path("studies/study.yaml"), tmp_path), (Path("study.yaml"), f.parent)):
        r = validate(path, cwd=cwd)
        assert r.returncode == 0, (path, cwd, r.stderr)
    # Next to a study, a model that is not there is still an error naming the key.
    study_doc["model"]["name"] = "othermodel/config.json"
    (f.parent / "bad.yaml").write_text(yaml.safe_dump(study_doc))
    r = validate(f.parent / "bad.yaml", cwd=elsewhere)
    assert r.returncode == 2 and "model: no model 'othermodel/config.json'" in r.stderr


@pytest.mark.slow
def test_relative_model_path_runs_and_reads_back_from_another_folder(tmp_path, study_doc):
    """``run`` from another working directory, then ``show``/``pareto``/``report`` from a third."""
    f = _study_with_local_model(tmp_path, study_doc)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = orchestrator("run", str(f), "--quiet", cwd=elsewhere)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "1 trial(s)" in r.stdout
    third = tmp_path / "third"
    third.mkdir()
    study_dir = tmp_path / "results" / "unit"
    for args in (["show", str(study_dir)], ["pareto", str(study_dir)],
                 ["report", str(study_dir), "--output", str(tmp_path / "rep")],
                 ["report", str(study_dir), "--out", str(tmp_path / "rep2")]):
        r = orchestrator(*args, cwd=third)
        assert r.returncode == 0, (args, r.stderr[-3000:])
        assert "Traceback" not in r.stderr
    for rep in ("rep", "rep2"):  # report --output (and its alias --out) is where the page goes
        assert (tmp_path / rep / "index.html").is_file()


# ------------------------------------------------------------------ command-line counts
@pytest.mark.parametrize("args, option", [
    (["--trials", "0"], "--trials"), (["--trials", "-3"], "--trials"), (["--max-trials", "0"], "--max-trials"),
    (["--trials", "two"], "--trials"),
])
def test_trial_counts_must_be_positive(tmp_path, study_doc, args, option):
    f = tmp_path / "s.yaml"
    study_doc["engine"] = {"kind": "sim", "mode": "virtual"}
    study_doc["output"] = str(tmp_path / "results")
    f.write_text(yaml.safe_dump(study_doc))
    for command in ("run", "nightly") if option == "--trials" else ("run",):
        r = orchestrator(command, str(f), *args, "--quiet")
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert f"argument {option}: expected a positive integer" in last, last
        assert not (tmp_path / "results").exists()  # nothing was run or written


# ------------------------------------------------------------------ non-finite numbers and trace limits
@pytest.mark.parametrize("text, key", [
    ("  arrival: {kind: poisson, rate: .inf}\n", "workload.arrival.rate"),
    ("  timeout_s: .inf\n", "workload.timeout_s"),
    ("  arrival: {kind: gamma, rate: 4, burstiness: .nan}\n", "workload.arrival.burstiness"),
])
def test_infinite_or_nan_numbers_are_a_validate_error(tmp_path, study_doc, text, key):
    study_doc.pop("workload")
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(study_doc) + "workload:\n" + text)
    r = validate(f)
    assert r.returncode == 2
    (line,) = problem_lines(r)
    assert line.startswith(f"{f}: {key}: Input should be a finite number"), line


@pytest.mark.parametrize("entries, expected", [
    ([(0, 100, 10), (1e9, 100, 10)], "line 2: 1e+09 s after the request before it, more than 86400 s"),
    ([(0, 100, 10), (1, 10 ** 8, 10)], "line 2: input_len 100000000 + output_len 10 is more than the largest "
                                       "max_model_len any configuration has (4096)"),
    ([(0, 100, 10 ** 9)], "line 1: input_len 100 + output_len 1000000000 is more than"),
])
def test_trace_gaps_and_lengths_are_checked_against_the_study(tmp_path, study_doc, entries, expected):
    import json

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_len": i, "output_len": o}) + "\n"
                             for t, i, o in entries))
    study_doc["workload"] = {"trace": {"path": str(trace)}}
    study_doc["space"]["max_model_len"] = [2048, 4096]
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(study_doc))
    r = validate(f)
    assert r.returncode == 2
    (line,) = problem_lines(r)
    assert line.startswith(f"{f}: workload.trace.path: {expected}"), line


# ------------------------------------------------------------------ loads no run can hold
# Each of these validated and then grew one trial's process without bound (a hypothesis-drawn
# study once ran a 2-core, 24 GiB machine out of memory): a steady warm-up at the trial's own
# rate sends every request due before its first check, a closed loop sends `concurrency` at once,
# a level's count is rate x duration, and a simulated engine decodes any output length.
@pytest.mark.parametrize("workload, key, expected", [
    ({"arrival": {"kind": "poisson", "rate": 723052076}}, "workload.arrival.rate",
     "Input should be less than or equal to 10000 (got 723052076)"),
    ({"arrival": {"kind": "ramp", "start_rate": 1, "end_rate": 1e7}}, "workload.arrival.end_rate",
     "Input should be less than or equal to 10000"),
    ({"arrival": {"kind": "concurrency", "concurrency": 10 ** 9}}, "workload.arrival.concurrency",
     "Input should be less than or equal to 10000"),
    ({"output_len": 723052076}, "workload.output_len",
     "at least 723052076 tokens, more than the largest max_model_len any configuration has (4096); every "
     "request would fail"),
    ({"input_len": {"kind": "uniform", "min": 4000, "max": 5000}, "output_len": 200}, "workload.input_len",
     "input_len (at least 4000) + output_len (at least 200) is more than the largest max_model_len any "
     "configuration has (4096)"),
])
def test_loads_no_run_can_hold_are_a_validate_error(tmp_path, study_doc, workload, key, expected):
    study_doc["workload"] = {**study_doc["workload"], **workload}
    study_doc["space"]["max_model_len"] = [2048, 4096]
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: {key}: {expected}"), line


def test_a_capacity_level_beyond_a_million_requests_is_a_validate_error(tmp_path, study_doc):
    study_doc["capacity"] = {"max_rate": 1000, "level_duration_s": 86400}
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: capacity: level_duration_s (86400) at max_rate (1000) is 8.64e+07 requests a "
                           "level, more than 1,000,000"), line


def test_long_synthetic_requests_that_fit_the_model_still_validate(tmp_path, study_doc):
    """Without max_model_len in the space the model's own context is the limit (131072 here)."""
    study_doc["workload"] = {**study_doc["workload"], "input_len": 60000, "output_len": 60000}
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(study_doc))
    assert validate(f).returncode == 0


# ------------------------------------------------------------------ credentials in problem lines
PLANTED = "hf_planted_validate_3b7e"


@pytest.mark.parametrize("engine, expected", [
    # A misspelt kind: the bad tag, not the block it selects (an env token, a URL with user:pw@).
    ({"kind": "vlm", "env": {"HF_TOKEN": PLANTED, "HTTPS_PROXY": f"http://u:{PLANTED}@proxy:3128"},
      "base_url": f"https://u:{PLANTED}@h:8000"},
     "engine: not allowed; expected one of 'sim', 'vllm', 'external' (got 'vlm')"),
    ({"kind": "external", "base_url": f"https://u:{PLANTED}@h:8000/v1"},
     "engine.base_url: credentials do not belong in the URL (it is recorded); put the key in an environment "
     "variable and name it in api_key_env (got 'https://***@h:8000/v1')"),
    ({"kind": "external", "base_url": f"https://h:8000/#access_token={PLANTED}"},
     "engine.base_url: the fragment carries a credential (access_token)"),
])
def test_problem_lines_never_echo_a_credential(tmp_path, study_doc, engine, expected):
    study_doc["engine"] = engine
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: {expected}") and PLANTED not in line, line


def test_a_problem_with_the_whole_study_summarises_it(tmp_path, study_doc):
    """A problem of the study as a whole would show the document, which starts with the engine and
    its token here: its keys are shown instead."""
    engine = {"kind": "vllm", "env": {"HF_TOKEN": PLANTED, "NOTE": f"via http://u:{PLANTED}@proxy"}}
    doc = {"engine": engine, **study_doc, "objectives": ["maximize output_throughput"] * 2}
    f, line = the_one_problem(tmp_path, doc)
    assert line.startswith(f"{f}: <root>: objectives: each metric at most once"), line
    assert "(got a mapping with keys constraints, engine, hardware, " in line and PLANTED not in line, line
    f.write_text(yaml.safe_dump([doc]))  # not a mapping at all: redacted, and cut short
    (line,) = problem_lines(validate(f))
    assert line.startswith(f"{f}: <root>: expected a mapping at the top level (got a list of 1 entries)"), line


# ------------------------------------------------------------------ served name
@pytest.mark.parametrize("name", ["llama\nrm -rf ~", "llama\x00", "llama\tb", "llama\x1b[2J"])
def test_a_served_name_with_control_characters_is_a_validate_error(tmp_path, study_doc, name):
    """It is printed inside recommend's `vllm serve` command and sent as the model id."""
    study_doc["model"]["served_name"] = name
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: model.served_name: control characters (line breaks, tabs, NUL, ...) are not "
                           "allowed; use printable characters (letters, digits, punctuation, spaces) (got "), line
    assert line.isprintable()


def test_a_served_name_of_printable_characters_validates(tmp_path, study_doc):
    study_doc["model"]["served_name"] = "Llama 3.1 8B (ß, 量化)/v2"
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(study_doc, allow_unicode=True))
    assert load_study(f).model.served_name == "Llama 3.1 8B (ß, 量化)/v2"


# ------------------------------------------------------------------ validate OK, then a hang or nothing measured
@pytest.mark.parametrize("arrival", [{"kind": "gamma", "rate": 4, "burstiness": 1e-12},
                                     {"kind": "gamma", "rate": 4, "burstiness": 1e308},
                                     {"kind": "ramp", "start_rate": 1, "end_rate": 4, "burstiness": 0.001}])
def test_burstiness_that_collapses_the_gaps_is_a_validate_error(tmp_path, study_doc, arrival):
    """Gamma gaps of shape 1e-12 are all 0.0 (every request at one instant, and a virtual warm-up that
    sent requests for ever); of shape 1e308, the scale underflows to 0 the same way."""
    study_doc["workload"]["arrival"] = arrival
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: workload.arrival.burstiness: must be in [0.01, 1e+06]"), line


def test_a_grid_too_large_for_the_grid_sampler_is_a_validate_error(tmp_path, study_doc):
    study_doc["search"] = {"sampler": "grid"}
    study_doc["space"]["max_num_seqs"] = {"type": "int", "low": 1, "high": 65536}
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: search.sampler: 'grid' lists every configuration: this space has 131,072, "
                           "more than 100,000"), line
    study_doc["search"] = {"sampler": "tpe"}  # other samplers draw from it: fine
    f.write_text(yaml.safe_dump(study_doc))
    assert validate(f).returncode == 0


def test_the_pre_flight_line_of_a_wide_space_is_short_and_quick(study_doc):
    """A space of 1e9 points: the survey samples it without listing any parameter's values, and the
    line names a few values that never start and counts the rest."""
    import time

    from orchestrator.search.feasibility import survey
    from orchestrator.study.spec import parse_study

    study_doc["space"] = {"max_num_seqs": {"type": "int", "low": 1, "high": 65536},
                          "max_num_batched_tokens": {"type": "int", "low": 16, "high": 16399},
                          "gpu_memory_utilization": 0.9, "max_model_len": 8192}
    study = parse_study(study_doc)
    t0 = time.monotonic()
    found = survey(study, cluster_units=2, units_per_node=2)
    assert time.monotonic() - t0 < 30 and found.space_size == 65536 * 16384
    text = found.report()
    assert found.never and len(text) < 1000 and text.endswith("more"), text


@pytest.mark.parametrize("output, expected", [
    ("{tmp}/a-file", "{tmp}/a-file is a file, not a folder"),
    ("{tmp}/a-file/results", "{tmp}/a-file is a file, not a folder"),
    ("s3://", "no bucket in 's3://'"),
    ("", "empty; name a folder"),
])
def test_an_output_that_cannot_hold_results_is_a_validate_error(tmp_path, study_doc, output, expected):
    (tmp_path / "a-file").write_text("x")
    study_doc["output"] = output.format(tmp=tmp_path)
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: output: {expected.format(tmp=tmp_path)}"), line
    r = orchestrator("run", str(f), "--quiet")  # refused before anything starts
    assert r.returncode == 2 and r.stderr.strip() == line and "Traceback" not in r.stderr


def test_an_output_option_that_cannot_hold_results_is_refused(tmp_path, study_doc):
    (tmp_path / "a-file").write_text("x")
    study_doc["output"] = str(tmp_path / "results")
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(study_doc))
    for value, expected in ((str(tmp_path / "a-file"), f"{tmp_path / 'a-file'} is a file"), ("", "empty")):
        r = orchestrator("run", str(f), "--output", value, "--quiet")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().startswith(f"--output: {expected}"), r.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("workload, key", [
    ({"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 20, "warmup_s": 3, "cooldown_s": 2},
     "workload.warmup_s"),
    ({"arrival": {"kind": "constant", "rate": 4}, "num_requests": 20, "cooldown_s": 10}, "workload.cooldown_s"),
    ({"arrival": {"kind": "burst"}, "num_requests": 20, "warmup_s": 0.1}, "workload.warmup_s"),
])
def test_windows_that_exclude_every_request_are_a_validate_error(tmp_path, study_doc, workload, key):
    study_doc["workload"] = {**workload, "output_len": 32}
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: {key}: warmup_s (") and "leave no request to measure" in line, line
    study_doc["workload"].update(warmup_s=1, cooldown_s=1) if workload["arrival"]["kind"] != "burst" else \
        study_doc["workload"].update(warmup_s=0)
    f.write_text(yaml.safe_dump(study_doc))
    assert validate(f).returncode == 0


def test_a_shared_prefix_longer_than_every_context_is_a_validate_error(tmp_path, study_doc):
    study_doc["workload"]["shared_prefix"] = {"groups": 2, "length": 5000}
    study_doc["space"]["max_model_len"] = [2048, 4096]
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: workload.shared_prefix.length: 5000 tokens + 1 of the request's own + output_len "
                           "(at least 32) is more than the largest max_model_len any configuration has (4096)"), line
    study_doc["workload"]["shared_prefix"]["length"] = 3000  # longer than input_len: documented, allowed
    f.write_text(yaml.safe_dump(study_doc))
    assert validate(f).returncode == 0


@pytest.mark.parametrize("where, value", [("workload.num_requests", True), ("workload.num_requests", "20"),
                                          ("budget.trials", True), ("workload.warmup_requests", False)])
def test_a_count_given_as_a_boolean_or_text_is_a_validate_error(tmp_path, study_doc, where, value):
    section, key = where.split(".")
    study_doc.setdefault(section, {})[key] = value
    f, line = the_one_problem(tmp_path, study_doc)
    assert line.startswith(f"{f}: {where}: Input should be a valid integer"), line
