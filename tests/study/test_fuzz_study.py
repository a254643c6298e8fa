"""Fuzzing the study-file loader: any input is a study or one line per problem and exit code 2.

Hypothesis mutates a valid study (wrong types, unknown keys, out-of-range values, deleted
keys, junk YAML) and feeds it to ``orchestrator validate`` in process; a few cases also go
through the real command line. Never a traceback, never an empty or multi-line problem.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BASE_STUDY
from orchestrator.cli import main
from support.fuzz_studies import mutated_docs, runnable_candidates, set_key

def _check_outcome(rc: int, out: str, err: str, path: str) -> None:
    assert "Traceback" not in out + err
    if rc == 0:
        assert out.startswith(f"{path}: OK") and not err
        return
    assert rc == 2, (rc, out, err)
    assert out == ""  # nothing half-written on stdout
    lines = err.splitlines()
    assert lines, "a rejected file must say why"
    for line in lines:
        assert line.startswith(f"{path}: ") and len(line) > len(path) + 3, line


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(doc=mutated_docs())
def test_mutated_study_files_give_one_line_per_problem(tmp_path, capsys, doc):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    rc = main(["validate", str(path)])
    captured = capsys.readouterr()
    _check_outcome(rc, captured.out, captured.err, str(path))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_arbitrary_text_is_rejected_in_one_line(tmp_path, capsys, text):
    path = tmp_path / "junk.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    rc = main(["validate", str(path)])
    captured = capsys.readouterr()
    _check_outcome(rc, captured.out, captured.err, str(path))


def test_bad_files_through_the_real_command(tmp_path, study_doc):
    """Exit codes as a shell sees them, and ``run`` stops before anything is started or written."""
    stages = copy.deepcopy(study_doc)
    stages["search"] = {"stages": [{"params": ["max_num_seqs"], "trials": 99}, {"params": ["max_num_batched_tokens"]}]}
    stages["output"] = str(tmp_path / "out")
    faults = copy.deepcopy(stages)
    del faults["search"]
    faults["engine"] = {"kind": "sim", "faults": [{"kind": "crash", "after_requests": -1}]}
    paths = []
    for name, doc in (("stages", stages), ("faults", faults)):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(doc))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x00\xff\xfe name: [")
    r = subprocess.run([sys.executable, "-m", "orchestrator", "validate", *map(str, paths), str(binary)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == f"{paths[0]}: search.stages: the stages need 99 trials and the last stage at least one more; " \
                       "budget.trials is 16"
    assert lines[1].startswith(f"{paths[1]}: engine.faults.0.after_requests:") and "(got -1)" in lines[1]
    assert lines[2].startswith(f"{binary}: <root>:")
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(paths[0])], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.splitlines() == lines[:1]
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


# ------------------------------------------------------------------ accepted files run (test_fuzz_runs: the whole run)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(text=runnable_candidates())
def test_every_accepted_file_runs_a_trial_without_an_internal_error(tmp_path, capsys, text):
    from orchestrator.search.trial_plan import run_trial
    from orchestrator.study.load import load_study
    from orchestrator.trial.run import TrialContext

    path = tmp_path / "study.yaml"
    path.write_text(text)
    rc = main(["validate", str(path)])
    captured = capsys.readouterr()
    _check_outcome(rc, captured.out, captured.err, str(path))
    if rc != 0:
        return
    study = load_study(path)
    point = dict(study.search.initial_points[0]) if study.search.initial_points else study.space.grid()[0]
    result = run_trial(study, point, trial_id="f-0000", trial_number=0, ctx=TrialContext("f"))
    assert result.status.value != "error", result.failure


@pytest.mark.parametrize("value, said", [(-1.0, "Input should be greater than or equal to 0"),
                                         (2**32, "Input should be less than or equal to 4294967295")])
@pytest.mark.parametrize("where", ["seed", "search.seed"])
def test_a_seed_out_of_range_is_refused_by_validate(tmp_path, capsys, where, value, said):
    """Found by the fuzz tests: ``seed: -1.0`` passed validation and the trial failed internally when it
    seeded its request streams; ``seed: 4642428597.0`` passed it, and ``run`` ended in a traceback when
    Optuna seeded NumPy's legacy generator (test_fuzz_runs)."""
    doc = copy.deepcopy(BASE_STUDY)
    set_key(doc, where, value)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc = main(["validate", str(path)])
    captured = capsys.readouterr()
    _check_outcome(rc, captured.out, captured.err, str(path))
    assert rc == 2 and f"{where}: {said}" in captured.err
