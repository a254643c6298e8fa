"""Corrupt results: never a traceback, a warning or an error line naming the file, the file left alone.

The dataset is the quickstart's, written by ``orchestrator run`` once per test run for every
module that reads it (``support.quickstart_dataset``: the virtual-time simulator, seconds). Each
case copies it, breaks one thing the way a full disk, a killed copy or a hand edit does (a
truncated or empty trial Parquet file, a truncated request file, a garbled ``study.json``), and
runs the commands people run on it:

* an unreadable data file is skipped with one warning line naming it; the command goes on
  (exit 0) with the rest;
* an unreadable ``study.json`` stops the command with one line naming it (exit 2): without
  it the objectives and SLOs are unknown;
* ``run`` continues the study beside a bad data file and refuses to start over a bad
  ``study.json``; it never rewrites or deletes either (byte-identical afterwards).
"""

from __future__ import annotations

import shutil
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from support.cli import orchestrator

pytestmark = pytest.mark.slow  # `orchestrator run` joins the Ray unit's cluster (conftest's unit_ray)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """The folder holding the quickstart's ``results/`` and the study file that wrote it."""
    from support.quickstart_dataset import shared_quickstart

    return shared_quickstart(tmp_path_factory).parent.parent


@pytest.fixture
def copy(dataset, tmp_path) -> Path:
    """A private copy of the dataset, and its study file (``study.yaml``) writing into the copy."""
    shutil.copytree(dataset / "results", tmp_path / "results", ignore=shutil.ignore_patterns("*.flock"))
    doc = yaml.safe_load((dataset / "quickstart-virtual.yaml").read_text())
    doc["output"] = str(tmp_path / "results")
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


@pytest.fixture
def ray_address(unit_ray) -> str:
    """The Ray the ``run`` commands join (``--address``, as on a cluster) instead of starting one each."""
    import ray

    return ray.get_runtime_context().gcs_address


def data_files(study_dir: Path, table: str) -> list[Path]:
    return sorted((study_dir / table).rglob("*.parquet"))


def budgeted_rows_since(study_dir: Path, before: list[Path]) -> int:
    """Trial rows written since ``before`` that took a slot of the budget (pre-flight refusals are
    rows beyond it: the quickstart's space holds configurations that cannot start)."""
    import pyarrow.parquet as pq

    new = [f for f in data_files(study_dir, "trials") if f not in before]
    return sum(s != "pruned" for f in new for s in pq.read_table(f, columns=["status"]).column("status").to_pylist())


def assert_clean(r: subprocess.CompletedProcess, codes=(0,)) -> None:
    assert r.returncode in codes, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]


def test_unreadable_data_files_are_skipped_with_a_warning(copy, ray_address):
    study_dir = copy / "results" / "quickstart"
    trials = data_files(study_dir, "trials")
    requests = data_files(study_dir, "requests")
    n = len(trials)
    assert n >= 4, trials
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
        # a new run of two trials
        "run": ["run", str(copy / "study.yaml"), "--trials", "2", "--quiet", "--address", ray_address],
    }
    for name, args in commands.items():
        r = orchestrator(*args)
        assert_clean(r, codes=(0, 1) if name == "recommend" else (0,))  # recommend: 1 if nothing qualifies
        warned = [line for line in r.stderr.splitlines() if "skipped" in line]
        for path in (truncated, emptied):
            assert any(str(path.resolve()) in line and "not a readable Parquet file" in line for line in warned), \
                (name, r.stderr[-3000:])
        if name == "report":
            assert any(str(other.resolve()) in line for line in warned), r.stderr[-3000:]
            assert (copy / "report" / "index.html").is_file()
        if name == "show":  # the two readable trials are shown
            assert f": {n - 2} trials (" in r.stdout, r.stdout
        for path, content in bad.items():
            assert path.read_bytes() == content, f"{name} changed {path}"
    # run went on beside the bad files: two more trials of its own
    assert budgeted_rows_since(study_dir, trials) == 2


@pytest.mark.parametrize("garbage", [b'{"study": {"name": "quick', b"", b"{}", b'{"study": {"name": 3}}'],
                         ids=["truncated", "empty", "no-study", "not-a-study"])
def test_an_unreadable_study_json_is_one_line_and_exit_2(copy, garbage):
    study_dir = copy / "results" / "quickstart"
    n = len(data_files(study_dir, "trials"))
    definition = study_dir / "study.json"
    definition.write_bytes(garbage)
    for args in (["show", str(study_dir)], ["pareto", str(study_dir)],
                 ["report", str(study_dir), "--output", str(copy / "report")],
                 ["recommend", str(study_dir)], ["run", str(copy / "study.yaml"), "--quiet"]):
        r = orchestrator(*args)
        assert_clean(r, codes=(2,))
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(definition.resolve()) in lines[0], (args, r.stderr[-2000:])
        assert "unreadable study definition" in lines[0]
        assert definition.read_bytes() == garbage, f"{args[0]} changed study.json"
    assert len(data_files(study_dir, "trials")) == n  # run did not start


def _retype(path: Path, column: str) -> None:
    """The column as text (a hand edit in a notebook, a tool that wrote numbers as strings)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, pa.field(column, pa.string()), table.column(column).cast(pa.string())), path)


def test_a_column_of_another_type_and_a_row_without_status(copy, ray_address):
    """A file whose ``ttft_p99_ms`` is text is skipped with a warning naming the file and the column
    (the other files read); a row without ``status`` is counted and named, never dropped silently."""
    import pyarrow.parquet as pq

    study_dir = copy / "results" / "quickstart"
    before = data_files(study_dir, "trials")
    n = len(before)
    retyped, no_status = before[:2]
    statuses = Counter(s for f in before[2:] for s in pq.read_table(f, columns=["status"]).column("status").to_pylist())
    statuses["no status"] = 1
    completed = statuses["completed"]
    _retype(retyped, "ttft_p99_ms")
    pq.write_table(pq.read_table(no_status).drop(["status"]), no_status)
    bad = {p: p.read_bytes() for p in (retyped, no_status)}
    no_status_id = no_status.stem
    commands = {
        "show": ["show", str(study_dir)],
        "pareto": ["pareto", str(study_dir)],
        "report": ["report", str(study_dir), "--output", str(copy / "report")],
        "recommend": ["recommend", str(study_dir), "--slo", "ttft_p99_ms <= 1e9"],
        "run": ["run", str(copy / "study.yaml"), "--trials", "1", "--quiet", "--address", ray_address],
    }
    for name, args in commands.items():
        r = orchestrator(*args)
        assert_clean(r, codes=(0, 1) if name == "recommend" else (0,))
        warned = r.stderr.splitlines()
        assert any(str(retyped.resolve()) in line and "column 'ttft_p99_ms' is string where double belongs" in line
                   for line in warned), (name, r.stderr[-3000:])
        assert any("1 trial(s) without a status" in line and no_status_id in line for line in warned), \
            (name, r.stderr[-3000:])
        if name == "show":  # all but the retyped file read, one of them counted without a status
            counts = ", ".join(f"{v} {k}" for k, v in sorted(statuses.items()))  # pre-flight refusals included
            assert f": {n - 1} trials ({counts})" in r.stdout, r.stdout
        if name == "pareto":
            assert f"trials: {completed} completed, 1 no status" in r.stdout, r.stdout
        for path, content in bad.items():
            assert path.read_bytes() == content, f"{name} changed {path}"
    assert budgeted_rows_since(study_dir, before) == 1  # run went on beside them


def test_a_file_where_the_trials_folder_belongs_is_one_line(copy):
    study_dir = copy / "results" / "quickstart"
    shutil.rmtree(study_dir / "trials")
    (study_dir / "trials").write_text("not a folder")
    for args in (["show", str(study_dir)], ["pareto", str(study_dir)],
                 ["report", str(study_dir), "--output", str(copy / "report")], ["recommend", str(study_dir)],
                 ["run", str(copy / "study.yaml"), "--quiet"]):
        r = orchestrator(*args)
        assert_clean(r, codes=(2,))
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"{(study_dir / 'trials').resolve()}: a file where the trials folder belongs"), \
            (args, line)
    assert (study_dir / "trials").read_text() == "not a folder"


def _read_only(folder: Path, *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Run the commands with ``folder`` mounted read-only (a private mount namespace: gone with the
    process); skipped where this machine cannot make one."""
    import shlex

    q = shlex.quote(str(folder))
    script = f"mount --bind {q} {q} && mount -o remount,bind,ro {q} {q} || exit 99\n"
    for i, args in enumerate(commands):
        argv = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "orchestrator", *args])
        script += f"{argv} >{q}.out{i} 2>{q}.err{i}; echo $? >{q}.rc{i}\n"
    probe = subprocess.run(["unshare", "-rm", "--propagation", "private", "sh", "-c", script], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    if probe.returncode == 99 or not Path(f"{folder}.rc0").exists():
        pytest.skip(f"no read-only mount here: {probe.stderr.strip()[-200:]}")
    return [subprocess.CompletedProcess(args, int(Path(f"{folder}.rc{i}").read_text()),
                                        Path(f"{folder}.out{i}").read_text(), Path(f"{folder}.err{i}").read_text())
            for i, args in enumerate(commands)]


def test_a_read_only_study_folder_is_one_line_naming_the_way_out(copy):
    """``report`` into its default folder and ``run`` into a read-only study folder (a mounted
    archive): one line saying it is read-only and which option writes elsewhere; exit 2."""
    study_dir = copy / "results" / "quickstart"
    report, run = _read_only(study_dir, ["report", str(study_dir)], ["run", str(copy / "study.yaml"), "--quiet"])
    for r, option in ((report, "--out DIR"), (run, "--output DIR")):
        assert_clean(r, codes=(2,))
        (line,) = r.stderr.strip().splitlines()
        assert str(study_dir.resolve()) in line and "the folder is read-only" in line and option in line, line
    assert not (study_dir / "report").exists()
