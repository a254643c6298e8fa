"""Running a study in the test's process, as ``orchestrator run`` does, and reading what Tune ran."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pandas as pd

from orchestrator.results import load_trials
from orchestrator.search.driver import run_study
from orchestrator.study.state_dir import local_state_dir


def run_printed(study, serve_port: int = 8131) -> tuple[pd.DataFrame, str]:
    """The study through ``run_study`` on the Ray this process is connected to: its rows and
    what it printed."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        run = run_study(study, serve_port=serve_port)
    return load_trials(run.study_dir), printed.getvalue()


def tune_trials(study) -> list[dict]:
    """The params of every Tune trial that ran (from Tune's own experiment state)."""
    out = []
    for state in (local_state_dir(study) / "_tune").rglob("experiment_state-*.json"):
        for entry in json.loads(state.read_text())["trial_data"]:
            out.append(json.loads(entry[0])["config"] if isinstance(entry, list) else entry["config"])
    return out
