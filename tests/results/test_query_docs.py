"""The quickstart's dataset: readable without project code, and every example of docs/querying.md runs on it
and prints what plain pandas finds on the same files.

The dataset is ``support.quickstart_dataset``'s: the real quickstart study through ``orchestrator run``
once per test run (all xdist workers share it), in virtual time so that it takes seconds; the
report, recommend, plan, nightly and corrupt-results tests reuse it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from conftest import REPO
from support.doc_examples import BLOCK_RUNNER, printed_values, python_blocks
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


def test_documented_examples_print_what_pandas_finds(quickstart, tmp_path):
    """Every python block of docs/querying.md, run as written from a directory holding results/quickstart:
    each value it prints is the answer the same question gets in plain pandas on the same files
    (the pandas blocks against another pandas formulation, numpy's percentiles, or the files read one by one)."""
    blocks = python_blocks((REPO / "docs" / "querying.md").read_text())
    assert len(blocks) >= 8
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "quickstart").symlink_to(quickstart, target_is_directory=True)
    kept = tmp_path / "printed.pkl"
    r = subprocess.run([sys.executable, "-c", BLOCK_RUNNER, *blocks], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                         "DOC_BLOCKS_PRINTED": str(kept)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    printed = printed_values(kept)
    data = _Plain.read(quickstart)
    for i, code in enumerate(blocks, 1):
        checks = [check for marker, check in CHECKS.items() if marker in code]
        assert len(checks) == 1, f"block {i} needs one pandas check in CHECKS (found {len(checks)}):\n{code}"
        assert printed.get(i), f"block {i} printed nothing:\n{code}"
        checks[0](printed[i], data)


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


# ---------------------------------------------------------------- each docs block's question, asked in pandas
THR, TTFT, TPOT = "output_throughput_per_gpu", "ttft_p99_ms", "tpot_p50_ms"


@dataclass(frozen=True)
class _Plain:
    """The quickstart's tables as plain pandas reads them (trials file by file: ``run_id`` is the row's own, not
    the partition's ``run``), and its SLOs from study.json."""

    trials: pd.DataFrame
    requests: pd.DataFrame
    objectives: list[tuple[str, str]]
    constraints: list[tuple[str, str, float]]

    @classmethod
    def read(cls, study_dir: Path) -> "_Plain":
        files = sorted((study_dir / "trials").rglob("*.parquet"))
        trials = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
        study = json.loads((study_dir / "study.json").read_text())["study"]
        return cls(trials, pd.read_parquet(study_dir / "requests"),
                   [(o["metric"], o["direction"]) for o in study["objectives"]],
                   [(c["metric"], c["op"], float(c["value"])) for c in study["constraints"]])

    @property
    def completed(self) -> pd.DataFrame:
        return self.trials[self.trials["status"] == "completed"]

    def meeting(self, *limits: tuple[str, float]) -> pd.DataFrame:
        """Completed trials under every ``(metric, upper limit)``."""
        c = self.completed
        return c[np.logical_and.reduce([c[m] <= v for m, v in limits])] if limits else c

    def top(self, frame: Optional[pd.DataFrame] = None, n: int = 5) -> pd.DataFrame:
        return (self.completed if frame is None else frame).nlargest(n, THR)


def _point_front(rows: pd.DataFrame, objectives: list[tuple[str, str]]) -> set[str]:
    """Trial ids no other row beats on every objective (and strictly on one): the textbook definition."""
    loss = np.column_stack([rows[m] * (-1 if d == "maximize" else 1) for m, d in objectives])
    return {tid for tid, mine in zip(rows["trial_id"], loss)
            if not any((other <= mine).all() and (other < mine).any() for other in loss)}


def _same(got, want) -> None:
    assert np.allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=1e-9), (got, want)


def _pandas_head(printed, d: _Plain) -> None:
    (head,), (counts,) = printed
    want = d.top()
    assert list(head["trial_id"]) == list(want["trial_id"])
    _same(head[THR], want[THR])
    _same(head[TTFT], want[TTFT])
    kinds = Counter((s, k if isinstance(k, str) else None) for s, k in zip(d.trials["status"], d.trials["failure_kind"]))
    assert {(s, k if isinstance(k, str) else None): n for (s, k), n in counts.items()} == kinds


def _pyarrow_filter(printed, d: _Plain) -> None:
    (rows, _text), (version,) = printed
    assert rows == int(((d.trials["status"] == "completed") & (d.trials[TTFT] < 10_000)).sum())
    assert version == str(int(d.trials["schema_version"].iloc[0])).encode()


def _request_percentiles(printed, d: _Plain) -> None:
    ((frame,),) = printed
    ok = d.requests[~d.requests["warmup"] & d.requests["success"]]
    assert list(frame.index) == sorted(ok["trial_id"].unique())[:5]
    for tid, got in frame.iterrows():
        ttft = ok.loc[ok["trial_id"] == tid, "ttft_ms"].to_numpy()
        _same([got[0.5], got[0.99]], np.percentile(ttft, [50, 99]))


def _duckdb_per_run(printed, d: _Plain) -> None:
    ((frame,),) = printed
    want = d.completed.groupby("run_id").agg(trials=("trial_id", "size"), best=(THR, "max")).sort_index()
    assert list(frame["run"]) == list(want.index) and list(frame["trials"]) == list(want["trials"])
    _same(frame["best_tok_s_per_gpu"], want["best"])


def _polars_top(printed, d: _Plain) -> None:
    ((frame,),) = printed
    want = d.top()
    assert frame["trial_id"].to_list() == list(want["trial_id"]) and frame["run"].to_list() == list(want["run_id"])
    _same(frame[THR].to_list(), want[THR])
    _same(frame[TTFT].to_list(), want[TTFT])


def _pareto(printed, d: _Plain) -> None:
    ((front,),) = printed
    feasible = d.meeting(*((m, v) for m, op, v in d.constraints if op == "<="))
    assert len(feasible) > 0 and all(op == "<=" for _, op, _ in d.constraints)
    assert set(front["trial_id"]) == _point_front(feasible, d.objectives)
    assert front[THR].iloc[0] == feasible[THR].max()  # best first by the first objective


def _best_per_gpu(printed, d: _Plain) -> None:
    ((best,),) = printed
    ok = d.meeting((TTFT, 10_000), (TPOT, 40))
    want = ok.loc[ok.groupby("gpu")[THR].idxmax()].set_index("gpu")
    assert list(best.index) == list(want.index) and list(best["trial_id"]) == list(want["trial_id"])
    _same(best[THR], want[THR])


def _ranked_and_compared(printed, d: _Plain) -> None:
    (ranked,), (difference,), (decision,) = printed
    ok = d.meeting((TTFT, 2000))
    want = ok.sort_values(THR, ascending=False)
    assert list(ranked["trial_id"]) == list(want["trial_id"]) and ranked["tied_with_best"].iloc[0]
    # The paired difference's point value: the second's TTFT p99 against the first's.
    first, second = want.iloc[0], want.iloc[1]
    assert difference.split(" ", 1)[0] == f"{second[TTFT] / first[TTFT] - 1:+.1%}", difference
    # The front it decides holds every trial no other beats on the point values, and only trials under the SLO.
    named = set(re.findall(r"r\d{8}-\d{6}-[a-z]{4}-\d{4}", decision))
    assert _point_front(ok, [(THR, "maximize"), (TTFT, "minimize")]) <= named <= set(ok["trial_id"]), decision


def _history(printed, d: _Plain) -> None:
    (history,), (by_night,) = printed
    best = d.trials.sort_values(THR, ascending=False).iloc[0]
    params = json.loads(best["params_json"])
    same = d.trials[[json.loads(p) == params for p in d.trials["params_json"]]]
    assert sorted(history["trial_id"]) == sorted(same["trial_id"])
    _same(history[THR], same.sort_values("started_at")[THR])
    # Configurations measured in two or more runs: none in one run, and a column per run.
    again = d.trials.assign(key=[json.dumps(json.loads(p), sort_keys=True) for p in d.trials["params_json"]])
    assert len(by_night) == int((again.groupby("key")["run_id"].nunique() >= 2).sum())
    assert list(by_night.columns) == sorted(d.trials["run_id"].unique())


def _varied_params(d: _Plain) -> set[str]:
    """The searched parameters that took more than one value among completed trials."""
    params = pd.DataFrame([json.loads(p) for p in d.completed["params_json"]])
    return {c for c in params.columns if params[c].nunique() > 1}


def _importance_from_rows(printed, d: _Plain) -> None:
    (importance,), (most, _text) = printed
    assert set(importance.index) == _varied_params(d) and importance.sum() == pytest.approx(1)
    assert most in _varied_params(d)


def _importance_from_journal(printed, d: _Plain) -> None:
    ((importance,),) = printed
    assert set(importance) == _varied_params(d) and sum(importance.values()) == pytest.approx(1)


def _recommend(printed, d: _Plain) -> None:
    (command,), (config,) = printed
    chosen = re.search(r"for trial (\S+) \(run", config).group(1)
    row = d.trials[d.trials["trial_id"] == chosen].iloc[0]
    argv = command.split()
    for name, value in json.loads(row["params_json"]).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # vLLM's --flag / --no-flag
            assert (flag if value else "--no-" + flag[2:]) in argv, (name, command)
        else:
            got = argv[argv.index(flag) + 1]
            assert (float(got) == pytest.approx(value)) if isinstance(value, float) else got == str(value), (name, got)
    # The best measured under the block's SLO, as its comment says; the one chosen within 5% of it.
    ok = d.meeting((TTFT, 30_000))
    best = ok.loc[ok[THR].idxmax()]
    assert f"best measured: trial {best['trial_id']}, {best[THR]:,.0f})" in config, config
    assert row[THR] >= 0.95 * best[THR]


# A marker of each block's code -> the check of what it prints (a block no marker names fails the test).
CHECKS = {
    'pd.read_parquet("results/quickstart/trials")': _pandas_head,
    "import pyarrow.dataset": _pyarrow_filter,
    'pd.read_parquet("results/quickstart/requests")': _request_percentiles,
    "import duckdb": _duckdb_per_run,
    "import polars": _polars_top,
    "pareto_front(": _pareto,
    "best_per_gpu(": _best_per_gpu,
    "decide_front(": _ranked_and_compared,
    "capacity_by_night(": _history,
    "param_importance(": _importance_from_rows,
    "JournalStorage(": _importance_from_journal,
    "rec.vllm_command()": _recommend,
}
