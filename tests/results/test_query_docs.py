"""The quickstart's dataset: readable without project code, and every example of docs/querying.md runs on it.

The dataset is ``support.quickstart_dataset``'s: the real quickstart study through ``orchestrator run``
once per test run (all xdist workers share it), in virtual time so that it takes seconds; the
report, recommend, plan, nightly and corrupt-results tests reuse it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from support.doc_examples import BLOCK_RUNNER, python_blocks
from support.quickstart_dataset import QUICKSTART_TRIALS, shared_quickstart

@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    return shared_quickstart(tmp_path_factory)


pytestmark = pytest.mark.slow  # the fixture starts Ray (once per session)


def test_dataset_layout_and_plain_readers(quickstart):
    """pandas and pyarrow read the tables with no project code; the layout is the documented one."""
    trials_dir = quickstart / "trials"
    files = sorted(trials_dir.rglob("*.parquet"))
    statuses = [s for f in files for s in pq.read_table(f, columns=["status"]).column("status").to_pylist()]
    assert sum(s != "pruned" for s in statuses) == QUICKSTART_TRIALS  # pre-flight refusals are rows beyond the budget
    for f in files:
        rel = f.relative_to(trials_dir).parts
        assert re.fullmatch(r"date=\d{4}-\d{2}-\d{2}", rel[0])
        assert re.fullmatch(r"run=r\d{8}-\d{6}-[a-z]{4}", rel[1]), rel[1]  # never a date or number to a reader
    for name in ("study.json", "optuna.journal", "_runs", "requests"):
        assert (quickstart / name).exists(), name

    trials = pd.read_parquet(trials_dir)
    assert len(trials) == len(files) and trials["trial_id"].is_unique
    assert set(trials["run"]) == set(trials["run_id"])  # the partition column matches the row
    assert (trials["schema_version"] == 1).all()

    dataset = ds.dataset(trials_dir, format="parquet", partitioning="hive")
    completed = dataset.to_table(filter=ds.field("status") == "completed", columns=["trial_id", "ttft_p99_ms"])
    assert completed.num_rows == int((trials["status"] == "completed").sum()) > 0
    requests = ds.dataset(quickstart / "requests", format="parquet", partitioning="hive").to_table()
    assert set(requests.column("trial_id").to_pylist()) <= set(trials["trial_id"])
    assert requests.num_rows > 0


def test_documented_examples_run(quickstart, tmp_path):
    """Every python block of docs/querying.md, run as written from a directory holding results/quickstart."""
    blocks = python_blocks((REPO / "docs" / "querying.md").read_text())
    assert len(blocks) >= 8
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "quickstart").symlink_to(quickstart, target_is_directory=True)
    r = subprocess.run([sys.executable, "-c", BLOCK_RUNNER, *blocks], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    outputs = re.split(r"^=== block \d+\n", r.stdout, flags=re.M)[1:]
    assert len(outputs) == len(blocks)
    for i, (code, out) in enumerate(zip(blocks, outputs), 1):
        assert out.strip(), f"block {i} printed nothing:\n{code}"


def test_results_readme_names_the_layout():
    text = (REPO / "results" / "README.md").read_text()
    for name in ("study.json", "trials/", "requests/", "_runs/", "optuna.journal", "_tune/", ".tmp/", "date=",
                 "run=", "schema_version", "(run_id, trial_id)"):
        assert name in text, name


def test_query_helpers_answer_on_the_quickstart(quickstart):
    from orchestrator.results import best_per_gpu, config_history, load_trials, param_importance
    from orchestrator.results.definition import read_study_definition

    study = read_study_definition(str(quickstart))
    trials = load_trials(quickstart)
    completed = trials[trials["status"] == "completed"]
    best = best_per_gpu(trials, "output_throughput_per_gpu")
    assert list(best.index) == ["H100-80GB"]
    assert best.iloc[0]["output_throughput_per_gpu"] == completed["output_throughput_per_gpu"].max()

    tight = best_per_gpu(trials, "output_throughput_per_gpu", constraints=["ttft_p99_ms <= 0.001"])
    assert tight.empty

    importance = param_importance(trials, "output_throughput_per_gpu", space=study.space)
    assert set(importance.index) <= set(study.space.sampled_names()) and len(importance) >= 2
    assert abs(importance.sum() - 1) < 1e-6 and importance.is_monotonic_decreasing

    history = config_history(trials, completed["trial_id"].iloc[0])
    assert list(history["trial_id"]) == [completed["trial_id"].iloc[0]]
    params = json.loads(completed["params_json"].iloc[0])
    assert config_history(trials, params)["trial_id"].tolist() == history["trial_id"].tolist()
