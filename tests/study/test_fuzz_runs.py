"""Every study file the project's fuzzers accept runs to a clean end (issue 43): a crash in ``run`` that
``validate`` could have foreseen is a validate bug.

The study files come from the fuzzers' own strategies: ``mutated_docs`` (a valid study with wrong types,
junk, deleted keys, faults, stages, samplers; the served simulator) and ``runnable_candidates`` (odd and
extreme numbers, initial points out of the space, a key given twice; the virtual-time simulator) of
test_fuzz_study, and the trace files of test_fuzz_trace inside a study. Each one ``validate`` accepts
runs one trial (``--max-trials 1``) through the command line's entry point, in this process, on the
served unit's Ray (one Ray for all: a run joins the Ray it finds). The end is clean: exit 0 (the trial
measured), or 1 with the reason in a line of its own; every trial recorded has a status and a classified
failure, never ``error`` (the orchestrator's own failure); no traceback anywhere in what it printed or
logged. A served case must be quick (see :func:`_quick`), so that a few of them cost a minute or two.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import re
import traceback

import optuna  # noqa: F401 - imported here, outside a test's captured stderr, which its log handler would keep
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import BASE_STUDY, SHARED_SERVE_PORT, shared_serve
from orchestrator.cli import main
from support.fuzz_studies import LINE, mutated_docs, runnable_candidates, study_with_trace

pytestmark = pytest.mark.slow

# A served case's load and start, at most: a case is one trial in real time.
QUICK_S = 20.0
# What the Ray workers of the served unit's Ray print, forwarded to this process (a driver that ``run``
# connects or starts does not forward them): Ray's own messages of a trial actor that Tune ends.
RAY_WORKER_LINE = re.compile(r"^(\x1b\[\d+m)?\([^)]*pid=\d+[^)]*\)")
_case = itertools.count()
FUZZ_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                           HealthCheck.too_slow, HealthCheck.filter_too_much])


def _quick(study) -> bool:
    """Whether one trial of ``study`` takes seconds: in virtual time always; served, when its engine starts
    at once and its load lasts at most :data:`QUICK_S` (a fault that keeps it from ever being ready waits
    out its start timeout)."""
    from orchestrator.search.trial_plan import load_plan

    engine = study.engine
    if engine.kind != "sim":
        return False
    if engine.mode == "virtual":
        return True
    never_ready = any(f.kind == "never_ready" for f in engine.faults)
    start_s = (engine.start_timeout_s or 3 * engine.startup_s + 60) if never_ready else engine.startup_s
    if study.capacity is not None or start_s > 5:
        return False
    measured = load_plan(study).requests().measured
    return bool(measured) and max(r.arrival_s for r in measured) + start_s <= QUICK_S


def _runs_cleanly(tmp_path, capsys, caplog, text: str, files: dict | None = None) -> int:
    """``text`` as a study file (beside ``files``): if ``validate`` accepts it and it is quick, one trial of
    it runs to a clean end. Returns the exit code."""
    folder = tmp_path / f"case-{next(_case)}"
    folder.mkdir()
    for name, content in (files or {}).items():
        (folder / name).write_text(content)
    path = folder / "study.yaml"
    path.write_text(text)
    accepted = main(["validate", str(path)]) == 0
    capsys.readouterr()
    assume(accepted)
    from orchestrator.study.load import load_study

    study = load_study(path)
    assume(_quick(study))
    out_dir = folder / "out"
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING):
            rc = main(["run", str(path), "--max-trials", "1", "--quiet", "--port", str(SHARED_SERVE_PORT),
                       "--output", str(out_dir)])
    except BaseException:  # noqa: BLE001 - what a user would see as a traceback
        pytest.fail(f"run ended in a traceback for\n{text}\n{traceback.format_exc()}")
    out, err = capsys.readouterr()
    err = "\n".join(line for line in err.splitlines() if not RAY_WORKER_LINE.match(line))
    said = out + err + caplog.text
    assert "Traceback" not in said, f"{text}\n{said[-4000:]}"
    assert rc in (0, 1), f"exit {rc} for\n{text}\n{said[-4000:]}"
    if rc == 1:
        assert err.strip(), f"exit 1 without a reason for\n{text}"
    _trials_are_classified(out_dir / study.name, text)
    return rc


def _trials_are_classified(study_dir, text: str) -> None:
    from orchestrator.failures import FailureKind, TrialStatus
    from orchestrator.results import load_trials

    if not (study_dir / "trials").exists():
        return
    rows = load_trials(study_dir)
    statuses = {s.value for s in TrialStatus} - {TrialStatus.ERROR.value}
    kinds = {k.value for k in FailureKind}
    for row in rows.to_dict("records"):
        what = json.dumps({k: str(row.get(k)) for k in ("status", "failure_kind", "failure_message")})
        assert row["status"] in statuses, f"{what} for\n{text}"
        if row["status"] != TrialStatus.COMPLETED.value:
            assert row["failure_kind"] in kinds and row["failure_message"], f"{what} for\n{text}"


@pytest.fixture(scope="module")
def served_ray():
    return shared_serve()  # the served unit's Ray, with Serve's proxy on SHARED_SERVE_PORT


@settings(max_examples=2, **FUZZ_SETTINGS)
@given(doc=mutated_docs())
def test_every_mutated_study_validate_accepts_runs_to_a_clean_end(served_ray, tmp_path, capsys, caplog, doc):
    _runs_cleanly(tmp_path, capsys, caplog, yaml.safe_dump(doc, allow_unicode=True))


@settings(max_examples=3, **FUZZ_SETTINGS)
@given(text=runnable_candidates())
def test_every_odd_numbered_study_validate_accepts_runs_to_a_clean_end(served_ray, tmp_path, capsys, caplog, text):
    _runs_cleanly(tmp_path, capsys, caplog, text)


@settings(max_examples=1, **FUZZ_SETTINGS)
@given(lines=st.lists(LINE, min_size=1, max_size=6))
def test_every_fuzzed_trace_validate_accepts_runs_to_a_clean_end(served_ray, tmp_path, capsys, caplog, lines):
    doc = study_with_trace("t.jsonl")
    _runs_cleanly(tmp_path, capsys, caplog, yaml.safe_dump(doc), files={"t.jsonl": "\n".join(lines) + "\n"})


def test_an_nsga2_study_runs(served_ray, tmp_path, capsys, caplog):
    """Found by the runs above: Tune pickled its searcher at every checkpoint, and Optuna's NSGA-II
    sampler holds a lock, so every ``sampler: nsga2`` run ended in ``TypeError: cannot pickle
    '_thread.lock' object``."""
    doc = {**copy.deepcopy(BASE_STUDY), "engine": {"kind": "sim", "mode": "virtual"}, "search": {"sampler": "nsga2"}}
    assert _runs_cleanly(tmp_path, capsys, caplog, yaml.safe_dump(doc)) == 0
