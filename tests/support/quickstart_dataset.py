"""The quickstart's dataset of a test run: the real quickstart study (same space, workload, SLOs and
seed; one trial at a time, so that every run makes the same dataset) through ``orchestrator run``
once per run, shared by all xdist workers, in virtual time so that it takes seconds. Read by the query, report, recommend, plan, nightly and corrupt-results tests."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO

QUICKSTART_TRIALS = 8


def shared_quickstart(tmp_path_factory) -> Path:
    """The quickstart dataset of this test run (:func:`quickstart_results`), made once for all of its
    xdist workers (in the run's temporary folder, which they share) and read by each."""
    base = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = base.parent  # pytest-N/popen-gwK: pytest-N is this run's, shared by its workers
    base = base / "quickstart-virtual"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "quickstart.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a worker asking meanwhile waits, then finds it made
        return quickstart_results(base)


def quickstart_results(base: Path) -> Path:
    """``<base>/results/quickstart``, made once: the quickstart study in virtual time, ``QUICKSTART_TRIALS`` trials."""
    study_dir = base / "results" / "quickstart"
    done = base / "quickstart.done"
    if done.exists():
        return study_dir
    doc = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    doc["engine"] = {**doc["engine"], "mode": "virtual"}
    # One trial at a time: with two, the order in which trials finish moves TPE's later proposals, and
    # the dataset (how many pre-flight refusals it holds, which configurations) differed run to run.
    doc["budget"] = {**doc["budget"], "max_concurrent_trials": 1}
    base.mkdir(parents=True, exist_ok=True)
    study_file = base / "quickstart-virtual.yaml"
    study_file.write_text(yaml.safe_dump(doc))
    argv = ["run", str(study_file), "--output", str(base / "results"), "--trials", str(QUICKSTART_TRIALS), "--quiet"]
    import ray

    if ray.is_initialized():  # a test's Ray session is up (test_nightly): use it rather than start another
        from orchestrator.cli import main

        assert main(argv) == 0
    else:
        r = subprocess.run([sys.executable, "-m", "orchestrator", *argv], cwd=REPO, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    done.write_text("ok")
    return study_dir
