"""The timing benchmarks' datasets: written whole or not at all, and read by the docs' pure functions."""

from __future__ import annotations

import json
import shutil
import sys

import pandas as pd
import pytest

from conftest import REPO
from orchestrator.doc_tables import overhead, scaling, start_cost

sys.path.insert(0, str(REPO / "benchmarks"))
from dataset import RUN_FILE, RunRecord, write_files  # noqa: E402

EX = REPO / "results" / "examples"


def test_the_gap_before_a_trial_runs_from_the_slot_it_took():
    # 2 at a time: trials 0 and 1 start together; 0 ends at 10, 1 at 12; trial 2 starts at 10.5
    # (the slot of the first to end: gap 0.5), trial 3 at 12.25 (gap 0.25).
    rows = pd.DataFrame({"started_s": [0.0, 0.0, 10.5, 12.25], "wall_s": [10.0, 12.0, 5.0, 5.0],
                         "startup_s": [1.0] * 4, "load_s": [8.0] * 4, "in_trial_s": [0.5] * 4})
    trials = overhead.slot_trials(rows, 2)
    assert [round(t.gap, 2) for t in trials] == [0.5, 0.25]
    assert [round(t.overhead, 2) for t in trials] == [1.0, 0.75]
    assert [round(t.wall, 2) for t in trials] == [5.5, 5.25]
    seq = rows.assign(started_s=[0.0, 10.2, 22.5, 27.75])  # one at a time: from the previous trial's end
    assert [round(t.gap, 2) for t in overhead.slot_trials(seq, 1)] == [0.2, 0.3, 0.25]


def test_a_dataset_is_replaced_whole_or_left_as_it_was(tmp_path):
    folder = tmp_path / "bench"
    record = RunRecord("python benchmarks/x.py")
    write_files(folder, record.finish(), {"a.json": lambda p: p.write_text("1")})
    run = json.loads((folder / RUN_FILE).read_text())
    assert run["command"] == "python benchmarks/x.py" and len(run["load_avg_before"]) == 3
    assert len(run["load_avg_after"]) == 3 and run["cpu_count"] >= 1

    def broken(path):
        path.write_text("half")
        raise RuntimeError("the run died")

    with pytest.raises(RuntimeError):
        write_files(folder, record.finish(), {"a.json": lambda p: p.write_text("2"), "b.json": broken})
    assert (folder / "a.json").read_text() == "1" and not (folder / "b.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench"]  # no temporary folder left behind


def test_every_benchmark_dataset_has_one_run_record_shape():
    # the keys RunRecord writes, in every run.json under results/examples (older records may lack the
    # machine's figures they did not measure, never name them otherwise)
    fields = set(RunRecord("x").__dict__)
    renamed = {"cores", "date", "load_average_1m"}
    records = sorted(EX.glob("*/" + RUN_FILE))
    assert len(records) >= 9
    for path in records:
        run = json.loads(path.read_text())
        assert {"command", "started"} <= set(run), path
        assert not renamed & set(run), path
    assert {"command", "started", "cpu_count", "load_avg_before", "load_avg_after", "commit"} <= fields


def test_a_run_record_names_the_command_from_the_repository_root():
    record = RunRecord.for_script("x.py", ["--output", str(EX / "x"), "--seeds", "3"])
    assert record.command == "python benchmarks/x.py --output results/examples/x --seeds 3"


@pytest.mark.parametrize("dataset,build", [("orchestration-overhead", overhead.overhead_setup),
                                           ("run-start-cost", start_cost.start_cost_setup),
                                           ("parallel-scaling", scaling.scaling_setup)])
def test_the_machine_load_the_text_states_is_the_recorded_one(tmp_path, dataset, build):
    copy = tmp_path / dataset
    shutil.copytree(EX / dataset, copy)
    run = json.loads((copy / RUN_FILE).read_text())
    assert f"load average {run['load_avg_before'][0]:.1f} before" in build(copy)
    run["load_avg_before"][0] = 42.3
    (copy / RUN_FILE).write_text(json.dumps(run))
    assert "load average 42.3 before" in build(copy)
