"""Damaged results, every file type in every way: the read commands never end in a traceback.

A small capacity study is measured in process (the virtual-time simulator, no Ray: two
trials with their requests and load levels), its Optuna journal, run state and nightly
summary written by the project's own writers. Each case copies it, damages one file the way
a killed copy, a full disk or a hand edit does (cut short, garbage bytes in the middle, a
column or key of another type, a column or key missing, a folder where the file belongs, a
file where its folder belongs: the table's, ``_runs``, ``_nightly``, for ``study.json`` and the
journal the study's; for the tables also a run's partition folder), and runs ``show``,
``pareto``, ``report --out`` and ``recommend`` through the command line's entry point:

* nothing escapes it (no traceback), and the exit code is 0, 1 (``recommend``: nothing
  qualifies) or 2 with one line naming the damaged path (a command that reads a table whose
  folder is a file, or a study folder that is a file: always 2, never "no trials recorded");
* a data file (or partition) that is skipped is named in a warning;
* no command changes a file of the study.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import optuna
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.apps.nightly import NightlySummary, write_summary
from orchestrator.cli import main
from orchestrator.results import query
from orchestrator.results.definition import write_study_definition
from orchestrator.results.levels import levels_to_table
from orchestrator.results.schema import requests_to_table
from orchestrator.results.store import ResultsStore
from orchestrator.search.resume import RunState
from orchestrator.search.state import optuna_storage
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.recorded_trial import run_trial
from support.studies import sim_doc

RUN = "r20261204-000000-abcd"
FILES = {  # one file of each type, relative to the study folder (the date partition is the day the trial ran)
    "trials": f"trials/date=*/run={RUN}/{RUN}-0000.parquet",
    "levels": f"levels/date=*/run={RUN}/{RUN}-0000.parquet",
    "requests": f"requests/date=*/run={RUN}/{RUN}-0000.parquet",
    "study.json": "study.json",
    "optuna.journal": "optuna.journal",
    "_runs": f"_runs/{RUN}.json",
    "_nightly": f"_nightly/{RUN}.json",
}
# The column left out, and the column written as text, of each table.
COLUMN = {"trials": ("status", "ttft_p99_ms"), "levels": ("rate", "rate"), "requests": ("ttft_ms", "ttft_ms")}
KEY = {"study.json": "study", "optuna.journal": "op_code", "_runs": "budget_trials", "_nightly": "best_capacity"}
DAMAGES = ["truncated", "garbage", "wrong_type", "missing_column", "folder_for_file", "file_for_folder"]
WARNED = ("truncated", "garbage", "wrong_type", "folder_for_file", "file_for_partition")  # a data file skipped
READERS = {"trials": {"show", "pareto", "report", "recommend"}, "requests": {"report"}, "levels": {"report"}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("damage-src")
    study = parse_study(sim_doc(
        name="cap", seed=0,
        workload={"arrival": {"kind": "poisson", "rate": 8}, "num_requests": 40, "warmup_requests": 1,
                  "input_len": {"kind": "uniform", "min": 200, "max": 800},
                  "output_len": {"kind": "uniform", "min": 16, "max": 64}},
        space={"max_num_seqs": [8, 64]}, objectives=["maximize capacity_rps"],
        constraints=["ttft_p99_ms <= 300", "tpot_p50_ms <= 30"],
        capacity={"tolerance": 0.2, "max_levels": 3, "level_duration_s": 4, "min_requests": 20}, output=str(out)))
    write_study_definition(study)
    store = ResultsStore(study.output, study.name)
    for i, seqs in enumerate([8, 64]):
        tid = f"{RUN}-{i:04d}"
        rec = run_trial(study, {"max_num_seqs": seqs}, trial_id=tid, trial_number=i, ctx=TrialContext(RUN))
        store.write_trial(rec.row, requests_to_table(rec.records, study=study.name, run_id=RUN, trial_id=tid),
                          levels=levels_to_table(rec.levels, study=study.name, run_id=RUN, trial_id=tid),
                          param_types=study.space.column_types())
    root = out / study.name
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ostudy = optuna.create_study(storage=optuna_storage(root), study_name="cap", direction="maximize")
    ostudy.optimize(lambda t: t.suggest_categorical("max_num_seqs", [8, 64]), n_trials=2)
    RunState(RUN, "finished", "2026-12-04T00:00:00+00:00", 2, study.fingerprint()).save(root)
    write_summary(str(root), NightlySummary(
        study="cap", night="2026-12-04", run_id=RUN, created_at="2026-12-04T00:00:00+00:00", previous_run_id=None,
        workload_hash="0", fingerprint=study.fingerprint(), capacity_metric="capacity_rps", best_capacity=32.0,
        best_trial=f"{RUN}-0001", threshold=0.03, regression=False, reasons=[], changes=[], remeasured=0,
        trials={"completed": 2}))
    for kind in FILES:
        assert _located(root, kind).is_file(), kind
    return root


def _located(study_dir: Path, kind: str) -> Path:
    """The one file of ``kind`` in ``study_dir``."""
    found = sorted(study_dir.glob(FILES[kind]))
    assert len(found) == 1, (kind, found)
    return found[0]


def _damage(study_dir: Path, kind: str, how: str) -> Path:
    """Damage the file of ``kind``; returns the path a message should name."""
    path = _located(study_dir, kind)
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":  # the middle third: a Parquet footer still reads, its pages do not
        rnd = random.Random(len(data))
        third = len(data) // 3
        path.write_bytes(data[:third] + bytes(rnd.randrange(256) for _ in range(third)) + data[2 * third:])
    elif how in ("wrong_type", "missing_column") and kind in COLUMN:
        table = pq.read_table(path)
        name = COLUMN[kind][how == "wrong_type"]
        i = table.schema.get_field_index(name)
        if how == "missing_column":
            table = table.remove_column(i)
        else:
            table = table.set_column(i, pa.field(name, pa.string()), table.column(i).cast(pa.string()))
        pq.write_table(table, path)
    elif how in ("wrong_type", "missing_column"):
        lines = data.decode().splitlines() if kind == "optuna.journal" else [data.decode()]
        record = json.loads(lines[-1])
        if how == "missing_column":
            del record[KEY[kind]]
        else:
            record[KEY[kind]] = ["not", "a", "value"]
        lines[-1] = json.dumps(record)
        path.write_text("\n".join(lines) + "\n")
    elif how == "folder_for_file":
        path.unlink()
        path.mkdir()
    else:  # a file where its folder belongs: the table's (or its run's), _runs, _nightly, else the study's
        parts = Path(FILES[kind]).parts
        folder = path.parent if how == "file_for_partition" else study_dir / parts[0] if len(parts) > 1 else study_dir
        shutil.rmtree(folder)
        folder.write_text("not a folder")
        return folder
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    if folder.is_file():
        return {".": folder.read_bytes()}
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>") for p in folder.rglob("*")}


@pytest.mark.parametrize("kind, how", [(k, h) for k in FILES for h in DAMAGES]
                         + [(k, "file_for_partition") for k in COLUMN])
def test_damaged_results_never_end_in_a_traceback(dataset, tmp_path, capsys, caplog, kind, how):
    study_dir = tmp_path / "cap"
    shutil.copytree(dataset, study_dir)
    damaged = _damage(study_dir, kind, how)
    before = _snapshot(study_dir)
    for command in ("show", "pareto", "report", "recommend"):
        caplog.clear()
        query._warned.clear()  # a command is a process of its own: it warns about each file once
        args = [command, str(study_dir)] + (["--out", str(tmp_path / "report")] if command == "report" else [])
        with caplog.at_level(logging.WARNING):
            rc = main(args)  # an exception here is the traceback a user would see
        out, err = capsys.readouterr()
        assert rc in ((0, 1, 2) if command == "recommend" else (0, 2)), (command, rc, err)
        if how == "file_for_folder" and (kind in ("study.json", "optuna.journal") or command in READERS.get(kind, ())):
            assert rc == 2, (command, out, err)  # never "no trials recorded"
        if rc == 2:  # one line, naming the study's folder or a path in it
            lines = err.strip().splitlines()
            assert len(lines) == 1 and str(study_dir) in lines[0], (command, err)
        warnings = " ".join(r.getMessage() for r in caplog.records)
        if kind in READERS and command in READERS[kind] and how in WARNED:
            assert str(damaged) in warnings, (command, warnings, err)
        if kind == "trials" and how == "missing_column" and rc == 0:  # the row without a status is named
            assert "without a status" in warnings and f"{RUN}-0000" in warnings, (command, warnings)
        assert _snapshot(study_dir) == before, f"{command} changed the study's files"
