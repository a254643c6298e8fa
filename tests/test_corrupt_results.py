"""Corrupt results: never a traceback, a warning or an error line naming the file, the file left alone.

A real dataset is written once by ``orchestrator run`` (a quickstart-like study on the
virtual-time simulator: seconds). Each case copies it, breaks one thing the way a full disk,
a killed copy or a hand edit does (a truncated or empty trial Parquet file, a truncated
request file, a garbled ``study.json``), and runs the commands people run on it:

* an unreadable data file is skipped with one warning line naming it; the command goes on
  (exit 0) with the rest;
* an unreadable ``study.json`` stops the command with one line naming it (exit 2): without
  it the objectives and SLOs are unknown;
* ``run`` continues the study beside a bad data file and refuses to start over a bad
  ``study.json``; it never rewrites or deletes either (byte-identical afterwards).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # `orchestrator run` starts Ray

REPO = Path(__file__).resolve().parents[1]
TRIALS = 4


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def write_study(base: Path) -> Path:
    doc = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    doc["engine"] = {"kind": "sim", "mode": "virtual"}
    doc["workload"]["num_requests"] = 40
    doc["budget"] = {"trials": TRIALS, "max_concurrent_trials": 2}
    doc["output"] = str(base / "results")
    study = base / "study.yaml"
    study.write_text(yaml.safe_dump(doc))
    return study


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("corrupt-src")
    r = cli("run", str(write_study(base)), "--quiet")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return base


@pytest.fixture
def copy(dataset, tmp_path) -> Path:
    """A private copy of the dataset (and its study file, pointing at the copy)."""
    shutil.copytree(dataset / "results", tmp_path / "results")
    write_study(tmp_path)
    return tmp_path


def data_files(study_dir: Path, table: str) -> list[Path]:
    return sorted((study_dir / table).rglob("*.parquet"))


def assert_clean(r: subprocess.CompletedProcess, codes=(0,)) -> None:
    assert r.returncode in codes, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]


def test_unreadable_data_files_are_skipped_with_a_warning(copy):
    study_dir = copy / "results" / "quickstart"
    trials = data_files(study_dir, "trials")
    requests = data_files(study_dir, "requests")
    assert len(trials) == TRIALS
    truncated, emptied, other = trials[0], trials[1], requests[-1]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    emptied.write_bytes(b"")
    other.write_bytes(other.read_bytes()[:100])
    bad = {p: p.read_bytes() for p in (truncated, emptied, other)}

    commands = {
        "show": ["show", str(study_dir)],
        "pareto": ["pareto", str(study_dir)],
        "report": ["report", str(study_dir), "--output", str(copy / "report")],
        "recommend": ["recommend", str(study_dir), "--slo", "ttft_p99_ms <= 1e9"],
        "run": ["run", str(copy / "study.yaml"), "--trials", "2", "--quiet"],  # a new run of two trials
    }
    for name, args in commands.items():
        r = cli(*args)
        assert_clean(r, codes=(0, 1) if name == "recommend" else (0,))  # recommend: 1 if nothing qualifies
        warned = [line for line in r.stderr.splitlines() if "skipped" in line]
        for path in (truncated, emptied):
            assert any(str(path.resolve()) in line and "not a readable Parquet file" in line for line in warned), \
                (name, r.stderr[-3000:])
        if name == "report":
            assert any(str(other.resolve()) in line for line in warned), r.stderr[-3000:]
            assert (copy / "report" / "index.html").is_file()
        if name == "show":  # the two readable trials are shown
            assert f": {TRIALS - 2} trials (" in r.stdout, r.stdout
        for path, content in bad.items():
            assert path.read_bytes() == content, f"{name} changed {path}"
    # run went on beside the bad files: two more trials of its own
    assert len(data_files(study_dir, "trials")) == TRIALS + 2


@pytest.mark.parametrize("garbage", [b'{"study": {"name": "quick', b"", b"{}", b'{"study": {"name": 3}}'],
                         ids=["truncated", "empty", "no-study", "not-a-study"])
def test_an_unreadable_study_json_is_one_line_and_exit_2(copy, garbage):
    study_dir = copy / "results" / "quickstart"
    definition = study_dir / "study.json"
    definition.write_bytes(garbage)
    for args in (["show", str(study_dir)], ["pareto", str(study_dir)],
                 ["report", str(study_dir), "--output", str(copy / "report")],
                 ["recommend", str(study_dir)], ["run", str(copy / "study.yaml"), "--quiet"]):
        r = cli(*args)
        assert_clean(r, codes=(2,))
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(definition.resolve()) in lines[0], (args, r.stderr[-2000:])
        assert "unreadable study definition" in lines[0]
        assert definition.read_bytes() == garbage, f"{args[0]} changed study.json"
    assert len(data_files(study_dir, "trials")) == TRIALS  # run did not start
