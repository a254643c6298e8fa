"""Per-GPU and per-dollar metrics (``goodput_per_gpu``, ``capacity_rps_per_gpu``, ``cost_per_mtok``).

Real path: ``orchestrator run`` on the virtual-time simulator (a grid over TP 1 and 2, so
the GPU count varies), then ``show``, ``pareto`` and ``recommend`` on its results, as a user
runs them. Every value is checked against its definition (docs/metrics.md) from the other
columns of the same row; objectives and constraints on the new metrics are checked through
the rows' ``feasible`` and ``constraint_violation`` and through the front.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO
from support.cli import orchestrator
from orchestrator.cli import main
from orchestrator.hardware.gpus import GPUS
from orchestrator.hardware.pricing import DEFAULT_PRICE_PER_GPU_HOUR, gpu_hour_price, unit_metrics
from orchestrator.measure.limits import violation
from orchestrator.results.pareto import pareto_front
from orchestrator.study.spec import Constraint, parse_study
from support.studies import merged, sim_doc

PRICE = 3.6  # $/GPU-hour: one GPU for one second costs a thousandth of a dollar


def _doc(base: Path, name: str, **top) -> dict:
    """``top``: sections merged in, section by section."""
    doc = sim_doc(
        name=name, seed=0, hardware={"gpus_per_node": 2},
        workload={"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 40, "output_len": 32},
        space={"tensor_parallel_size": [1, 2], "max_num_seqs": [8, 32]},
        objectives=["maximize goodput_per_gpu", "minimize cost_per_mtok"],
        search={"sampler": "grid"}, budget={"trials": 4, "max_concurrent_trials": 2}, output=str(base / "results"))
    return merged(doc, **top)


def _run(base: Path, doc: dict, capsys) -> tuple[Path, pd.DataFrame, str]:
    """``orchestrator run`` through the command line's entry point, on the module's Ray (as on a
    cluster: the run joins the Ray it finds); the study's rows and what the run printed."""
    path = base / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    code = main(["run", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    study_dir = base / "results" / doc["name"]
    return study_dir, pd.read_parquet(study_dir / "trials"), out


def _check_definitions(trials: pd.DataFrame, price: float) -> None:
    """Each unit metric is what docs/metrics.md says, from the row's own columns."""
    for _, row in trials.iterrows():
        assert row["gpus"] == row["tensor_parallel_size"] * 1  # one replica, PP 1
        assert row["goodput_per_gpu"] == pytest.approx(row["goodput"] / row["gpus"])
        assert row["cost_per_mtok"] == pytest.approx(price * row["gpus"] / 3600 / row["output_throughput"] * 1e6)
        if "capacity_rps" in row and pd.notna(row["capacity_rps"]):
            assert row["capacity_rps_per_gpu"] == pytest.approx(row["capacity_rps"] / row["gpus"])
        else:
            assert pd.isna(row["capacity_rps_per_gpu"])


def _check_judged(trials: pd.DataFrame, constraints: list[str]) -> None:
    """``feasible`` and ``constraint_violation`` follow the constraints on the new metrics."""
    parsed = [Constraint.model_validate(c) for c in constraints]
    for _, row in trials.iterrows():
        margins = [violation(c.op, c.value, row[c.metric]) for c in parsed]
        assert row["constraint_violation"] == pytest.approx(max(margins))
        assert row["feasible"] == all(m <= 0 for m in margins)


def _check_sampler_saw(study, study_dir: Path, trials: pd.DataFrame) -> None:
    """What Optuna was told: the new metrics as objective values and constraint margins, per trial."""
    import optuna

    from orchestrator.search.state import optuna_storage, optuna_study_name

    told = optuna.load_study(study_name=optuna_study_name(study), storage=optuna_storage(study_dir))
    by_params = {(r["tensor_parallel_size"], r["max_num_seqs"]): r for _, r in trials.iterrows()}
    finished = [t for t in told.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == len(trials)
    for t in finished:
        row = by_params[(t.params["tensor_parallel_size"], t.params["max_num_seqs"])]
        assert t.values == pytest.approx([row[o.metric] for o in study.objectives])
        margins = {f"slo{i}": violation(c.op, c.value, row[c.metric]) for i, c in enumerate(study.constraints)}
        assert t.constraints == pytest.approx({"engine_started": 0.0, **margins})


@pytest.mark.slow  # `orchestrator run` starts Ray
def test_objectives_constraints_and_commands_on_unit_metrics(tmp_path, capsys, unit_ray):
    # A rate-bound workload: every configuration serves about the same tokens per second, so
    # cost grows with the GPU count and this limit lies between one and two GPUs' cost.
    limit = 1.5 * PRICE / 3600 / (4 * 32) * 1e6
    constraints = [f"cost_per_mtok <= {limit:.4f}", "goodput_per_gpu >= 1", "ttft_p99_ms <= 2000"]
    doc = _doc(tmp_path, "unit-cost", constraints=constraints)
    doc["hardware"]["price_per_gpu_hour"] = PRICE
    study_dir, trials, out = _run(tmp_path, doc, capsys)
    assert f"price ${PRICE:.2f} per GPU-hour (hardware.price_per_gpu_hour)" in out

    assert len(trials) == 4 and (trials["status"] == "completed").all()
    assert sorted(trials["gpus"]) == [1, 1, 2, 2]
    _check_definitions(trials, PRICE)
    _check_judged(trials, constraints)
    # The cost limit separates one GPU from two: both sides are present.
    assert set(trials.loc[trials["feasible"], "gpus"]) == {1}
    assert not trials.loc[trials["gpus"] == 2, "feasible"].any()

    study = parse_study(doc)
    _check_sampler_saw(study, study_dir, trials)
    front = pareto_front(trials, study.objectives, study.constraints)
    assert len(front) and set(front["gpus"]) == {1}

    show = orchestrator("show", str(study_dir))
    assert show.returncode == 0, show.stderr
    assert f"price ${PRICE:.2f} per GPU-hour" in show.stdout
    _assert_best_line(show.stdout, "maximize", "goodput_per_gpu", trials)  # best completed trial per objective
    ok = trials[trials["feasible"]]
    _assert_best_line(show.stdout, "minimize", "cost_per_mtok", ok)

    pareto = orchestrator("pareto", str(study_dir))
    assert pareto.returncode == 0, pareto.stderr
    header = next(line for line in pareto.stdout.splitlines() if line.lstrip().startswith("trial_id"))
    assert "goodput_per_gpu" in header and "cost_per_mtok" in header
    for trial_id in front["trial_id"]:
        assert trial_id in pareto.stdout

    rec = orchestrator("recommend", str(study_dir), "--objective", "minimize cost_per_mtok")
    assert rec.returncode == 0, rec.stderr
    first = rec.stdout.splitlines()[0]
    chosen = ok[ok["trial_id"] == first.split()[1]]  # "trial <id> ..."
    assert len(chosen) == 1 and chosen.iloc[0]["cost_per_mtok"] == ok["cost_per_mtok"].min(), first
    assert f"cost_per_mtok {chosen.iloc[0]['cost_per_mtok']:,.4g}" in first
    assert f"goodput_per_gpu {chosen.iloc[0]['goodput_per_gpu']:,.4g}" in first

    report = orchestrator("report", str(study_dir), "--output", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    html = next((tmp_path / "report").rglob("*.html")).read_text()
    assert "cost_per_mtok" in html and "goodput_per_gpu" in html and "per GPU-hour" in html


@pytest.mark.slow
def test_capacity_per_gpu_as_objective_and_constraint(tmp_path, capsys, unit_ray):
    """The capacity objective per GPU, with the default price of the study's GPU."""
    constraints = ["capacity_rps_per_gpu >= 1", "ttft_p99_ms <= 300", "tpot_p50_ms <= 30"]
    doc = _doc(tmp_path, "unit-capacity", objectives=["maximize capacity_rps_per_gpu"], constraints=constraints,
               capacity={"tolerance": 0.1, "max_levels": 6},
               space={"tensor_parallel_size": [1, 2], "max_num_seqs": 32},
               budget={"trials": 2, "max_concurrent_trials": 2})
    doc["workload"].update(num_requests=60, input_len={"kind": "uniform", "min": 200, "max": 1500})
    study_dir, trials, out = _run(tmp_path, doc, capsys)
    assert "default list price for H100-80GB" in out
    assert (trials["status"] == "completed").all() and (trials["capacity_rps"] > 0).all()
    _check_definitions(trials, DEFAULT_PRICE_PER_GPU_HOUR["H100-80GB"])
    _check_judged(trials, constraints)
    show = orchestrator("show", str(study_dir))
    _assert_best_line(show.stdout, "maximize", "capacity_rps_per_gpu", trials)
    # The metrics that are not objectives: the best trial meeting the SLOs by each, and in the front table.
    ok = trials[trials["feasible"]]
    assert len(ok), trials[["gpus", "capacity_rps_per_gpu", "constraint_violation"]]
    assert "per GPU and per dollar, best trial meeting the SLOs:" in show.stdout
    _assert_best_line(show.stdout, "minimize", "cost_per_mtok", ok)
    header = next(line for line in show.stdout.splitlines() if line.lstrip().startswith("trial_id"))
    assert {"capacity_rps_per_gpu", "goodput_per_gpu", "cost_per_mtok"} <= set(header.split())


@pytest.mark.parametrize("value", [-1, 0, "cheap", ".inf", ".nan"])
def test_a_bad_price_is_one_line_naming_the_key(study_doc, tmp_path, value):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study_doc).replace("gpus_per_node: 2", f"gpus_per_node: 2\n  price_per_gpu_hour: "
                                                                          f"{value}"))
    r = orchestrator("validate", str(path))
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "hardware.price_per_gpu_hour" in lines[0], r.stderr


def test_every_catalog_gpu_has_a_price_and_cpu_has_none():
    assert set(DEFAULT_PRICE_PER_GPU_HOUR) == set(GPUS)
    cpu = gpu_hour_price("CPU")
    assert cpu.value is None and "cost_per_mtok stays empty" in cpu.describe()
    assert gpu_hour_price("CPU", 0.5).value == 0.5  # a study file's price covers any device
    # No price: the cost is empty, the per-GPU metrics are still there.
    row = unit_metrics({"goodput": 3.0, "output_throughput": 100.0}, 2, cpu.value)
    assert row == {"goodput_per_gpu": 1.5, "capacity_rps_per_gpu": None, "cost_per_mtok": None}
    assert unit_metrics({"goodput": 0.0, "output_throughput": 0.0}, 1, 1.0)["cost_per_mtok"] is None


def test_the_documented_price_table_is_the_one_in_use():
    text = (REPO / "docs" / "metrics.md").read_text()
    gpus = next(line for line in text.splitlines() if line.startswith("| GPU | "))
    prices = next(line for line in text.splitlines() if line.startswith("| $/GPU-hour | "))
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")][1:]  # noqa: E731
    assert dict(zip(cells(gpus), map(float, cells(prices)))) == DEFAULT_PRICE_PER_GPU_HOUR


def test_the_price_is_hashed_only_when_set(study_doc):
    plain = parse_study(copy.deepcopy(study_doc))
    priced = copy.deepcopy(study_doc)
    priced["hardware"]["price_per_gpu_hour"] = 2.0
    assert parse_study(priced).fingerprint() != plain.fingerprint()  # a price changes what the rows say
    # Unset, the study's fingerprint is what it was before prices existed: the recorded runs still resume
    # (tests/trial/test_degraded.py::test_a_run_recorded_before_the_limit_existed_still_resumes).


def test_imported_vllm_bench_results_get_them_from_their_gpu():
    """``import-bench --gpus N --gpu TYPE``: the same definitions, the table's price for TYPE."""
    import json

    from orchestrator.apps.interchange import from_bench_result

    sample = REPO / "tests" / "data" / "vllm_bench_rate64_S256.json"
    data = json.loads(sample.read_text())

    def imported(**kw):
        return from_bench_result(data, raw=sample.read_bytes(), source=sample.name, study_name="s", fingerprint="f",
                                 param_types={}, **kw)[0]

    row = imported(gpus=2, gpu="H200")
    assert row["cost_per_mtok"] == pytest.approx(DEFAULT_PRICE_PER_GPU_HOUR["H200"] * 2 / 3600
                                                 / data["output_throughput"] * 1e6)
    assert imported(gpus=2, gpu="H200", price_per_gpu_hour=1.0)["cost_per_mtok"] == pytest.approx(
        2 / 3600 / data["output_throughput"] * 1e6)
    unknown = imported(gpus=2, gpu="MI300X")  # not in the table, no price given: no cost, no crash
    assert unknown["cost_per_mtok"] is None and unknown["gpu"] == "MI300X"
    assert data["request_goodput"] is None and row["goodput_per_gpu"] is None  # run without --goodput
    data["request_goodput"] = 40.0  # what `vllm bench serve --goodput ...` writes
    assert imported(gpus=2, gpu="H200")["goodput_per_gpu"] == 20.0


def _assert_best_line(out: str, direction: str, metric: str, candidates) -> None:
    """``show``'s best line for ``metric`` names a trial of ``candidates`` with the best value (several
    may share it: a rate-bound workload gives equal configurations equal goodput), that value and,
    where the row has one, its interval (``value [low, high]``)."""
    import math
    import re

    line = re.search(rf"^  {direction} {metric}: (.*)$", out, flags=re.M)
    assert line, out
    text = line.group(1)
    named = re.search(r"\(([^;,)]+)", text)
    assert named, text
    best = candidates[metric].max() if direction == "maximize" else candidates[metric].min()
    rows = candidates[candidates["trial_id"] == named.group(1)]
    assert len(rows) == 1 and rows.iloc[0][metric] == best, (text, candidates[["trial_id", metric]])
    row = rows.iloc[0]
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    shown = f"{row[metric]:,.4g}"
    if low is not None and not (isinstance(low, float) and math.isnan(low)):
        high_text = "inf" if math.isinf(high) else f"{high:,.4g}"
        shown += f" [{low:,.4g}, {high_text}]"
    assert text.startswith(f"{shown} ({row['trial_id']}"), text
