"""Run ids are text to every reader of the results dataset.

Hive partition values carry no type, so readers guess one: Polars took the legacy id
``20261203T071410-2711`` (an all-digit suffix, about 1 run in 11) for a datetime and
failed. New ids cannot be read as a date, a timestamp or a number; datasets holding a
legacy id still load, with ``orchestrator.results`` and with the examples of
docs/querying.md that need no project code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.dataset as ds
import pytest
import yaml

from conftest import REPO
from orchestrator.results import load_requests, load_trials, requests_to_table
from orchestrator.search.state import new_run_id
from orchestrator.search.tune import ResultsSinkActor
from orchestrator.study.spec import parse_study
from orchestrator.trial.run import TrialContext
from support.doc_examples import BLOCK_RUNNER, python_blocks
from support.recorded_trial import run_trial

LEGACY_RUN = "20261203T071410-2711"  # the old format with a suffix of digits only: Polars' worst case
NEW_RUN = re.compile(r"r\d{8}-\d{6}-[a-z]{4}")
POINTS = [
    {"max_num_seqs": 64, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9, "max_model_len": 8192,
     "kv_cache_dtype": "auto", "enable_prefix_caching": True, "stream_interval": 4},
    {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.85, "max_model_len": 8192,
     "kv_cache_dtype": "fp8", "enable_prefix_caching": False, "stream_interval": 4},
]


def _quickstart():
    doc = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    doc["engine"] = {**doc["engine"], "mode": "virtual"}
    return parse_study(doc)


def _write_run(output: Path, study, run_id: str) -> None:
    """Trials measured by the virtual-time engine, written by the sink a search writes through."""
    sink = ResultsSinkActor(str(output), study.name, study.space.column_types())
    for i, params in enumerate(POINTS):
        trial_id = f"{run_id}-{i:04d}"
        outcome = run_trial(study, params, trial_id=trial_id, trial_number=i, ctx=TrialContext(run_id=run_id))
        sink.write(outcome.row, requests_to_table(outcome.records, study=study.name, run_id=run_id, trial_id=trial_id))


def test_new_run_ids_are_short_sortable_and_never_all_digits():
    before = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    ids = [new_run_id(_quickstart()) for _ in range(200)]
    after = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    for run_id in ids:
        assert NEW_RUN.fullmatch(run_id), run_id
        assert before <= run_id[1:16] <= after  # UTC start time up front: ids sort by time
    assert len(set(ids)) >= 190  # a random suffix, not a counter
    assert LEGACY_RUN < min(ids)  # a study's older runs still sort first


def test_plain_readers_infer_text_for_a_new_run_id(tmp_path):
    """Even with every reader's default type guessing, a new id comes back as a string."""
    study = _quickstart()
    run_id = new_run_id(study)
    _write_run(tmp_path, study, run_id)
    trials = tmp_path / study.name / "trials"

    polars = pl.scan_parquet(f"{trials}/**/*.parquet", hive_partitioning=True).select("run", "run_id").collect()
    assert polars.schema["run"] == pl.String and set(polars["run"]) == {run_id}
    rows = duckdb.sql(f"SELECT DISTINCT typeof(run), run FROM read_parquet('{trials}/**/*.parquet', "
                      "hive_partitioning = true)").fetchall()
    assert rows == [("VARCHAR", run_id)]
    table = ds.dataset(trials, format="parquet", partitioning="hive").to_table(columns=["run"])
    assert str(table.schema.field("run").type) == "string" and set(table.column("run").to_pylist()) == {run_id}


@pytest.mark.parametrize("with_new_run", [False, True], ids=["legacy-only", "legacy-then-new"])
def test_legacy_all_digit_run_id_loads_everywhere(tmp_path, with_new_run):
    """An old study (one legacy run), then one the new tool added a run to: load_trials, load_requests, the docs."""
    study = _quickstart()
    output = tmp_path / "results"
    runs = [LEGACY_RUN, new_run_id(study)] if with_new_run else [LEGACY_RUN]
    for run_id in runs:
        _write_run(output, study, run_id)

    trials = load_trials(output / study.name)
    assert sorted(trials["run"]) == sorted(trials["run_id"]) == sorted(runs * len(POINTS))
    legacy = load_trials(output, run=LEGACY_RUN)
    assert list(legacy["trial_id"]) == [f"{LEGACY_RUN}-{i:04d}" for i in range(len(POINTS))]
    requests = load_requests(output / study.name, include_warmup=True)
    assert set(requests["run"]) == set(runs) and len(requests) > 0

    # docs/querying.md's examples are written for results/quickstart: run them from a directory holding it.
    blocks = [b for b in python_blocks((REPO / "docs" / "querying.md").read_text())
              if not re.search(r"^(from|import) (orchestrator|optuna)\b", b, flags=re.M)]
    assert len(blocks) >= 5 and any("import duckdb" in b for b in blocks) and any("import polars" in b for b in blocks)
    r = subprocess.run([sys.executable, "-c", BLOCK_RUNNER, *blocks], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    outputs = dict(zip(blocks, re.split(r"^=== block \d+\n", r.stdout, flags=re.M)[1:]))
    for code, out in outputs.items():
        if "import duckdb" in code or "import polars" in code:  # both print the run column
            assert all(run_id in out for run_id in runs), out
