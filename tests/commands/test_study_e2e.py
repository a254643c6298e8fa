"""The README's quickstart end to end: ``orchestrator run`` on its own local Ray, the rows it writes, the front
it prints. (A study through Serve's HTTP proxy on the served unit's Ray: tests/search/test_study_served.py.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest

from orchestrator.results import load_trials, pareto_front
from orchestrator.results.decisions import front_note
from orchestrator.results.ties import front_with_ties
from orchestrator.study.load import load_study

pytestmark = pytest.mark.slow

# The quickstart's budget in the CLI test: past the sampler's 5 random start-up trials
# (orchestrator.search.samplers.default_startup_trials), so TPE proposes at least one.
QUICKSTART_TRIALS = 6


def test_quickstart_cli(tmp_path, repo):
    """The README's quickstart: a row per trial, all their requests, pandas one-liner, printed front.

    The study file as shipped, with the trial budget cut from 16 to QUICKSTART_TRIALS (``--trials``):
    5 random start-up trials, then TPE proposes (the sampler's model is used), in 3 rounds of 2
    concurrent trials instead of 8. Nothing asserted here depends on the budget's size."""
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", "search_spaces/quickstart.yaml",
                        "--output", str(out), "--port", "8124", "--trials", str(QUICKSTART_TRIALS)],
                       cwd=repo, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stdout
    # The study writes no Tune result files (its rows are the results) and Tune does not warn about them.
    assert "Failed to fetch metrics" not in r.stderr, r.stderr[-3000:]
    study = load_study(repo / "search_spaces/quickstart.yaml")

    # The README's one-liner, verbatim apart from the path.
    one_liner = f"import pandas as pd; print(len(pd.read_parquet('{out}/quickstart/trials')))"
    n = subprocess.run([sys.executable, "-c", one_liner], capture_output=True, text=True, check=True)
    assert int(n.stdout.strip()) >= QUICKSTART_TRIALS  # pre-flight refusals are rows beyond the budget

    trials = pd.read_parquet(out / "quickstart" / "trials")
    assert len(trials) >= QUICKSTART_TRIALS
    not_ok = trials[trials["status"] != "completed"]
    assert not_ok["failure_kind"].notna().all() and not_ok["failure_message"].str.len().gt(0).all()
    requests = pd.read_parquet(out / "quickstart" / "requests")
    completed = trials[trials["status"] == "completed"]
    expected = study.workload.num_requests + completed.set_index("trial_id")["warmup_requests_used"]
    assert requests.groupby("trial_id").size().reindex(expected.index).eq(expected).all()

    # The printed front: the rows no other row beats by a decided comparison. Those on the point values'
    # front are printed plainly; a row only an undecided comparison keeps on it is marked; a row of the
    # point values' front that another beats on one objective and matches within the equivalence margin
    # on the others is left off (a decision, not a tie).
    front = pareto_front(load_trials(out / "quickstart"), study.objectives, study.constraints)
    printed = dict(re.findall(r"^(r\d{8}-\d{6}-[a-z]{4}-\d{4}) (.*)$", r.stdout, flags=re.M))
    # The words the front prints for a row only the noise keeps on it (the progress line's, written once).
    within_noise = {t for t, line in printed.items() if front_note(False, 0, 0) in line}
    assert set(printed) - within_noise <= set(front["trial_id"]), r.stdout[-2000:]
    noisy = front_with_ties(load_trials(out / "quickstart"), study.objectives, study.constraints)
    assert set(printed) == set(noisy["trial_id"]), r.stdout[-2000:]
    assert within_noise == set(noisy.loc[~noisy["strict_front"], "trial_id"]), r.stdout[-2000:]
    assert len(front) >= 1
