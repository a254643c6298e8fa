"""``orchestrator plan``: the fleet for a target rate, from measured capacity per replica.

The arithmetic on plain inputs (replicas with headroom and rounding, sizing on the validated
low end, Little's law for autoscaling, cost per million tokens as pricing defines it, ties),
then the command on the H200 example datasets and on a small simulated capacity study with
TP 1 and TP 2, its Serve config loaded by Ray Serve's schema classes and its RayService
validated against KubeRay's CRD schema.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, ray_unit
from orchestrator.apps.plan import Candidate, PlanError, check_rate, plan_fleet, replicas_for, target_ongoing_requests
from orchestrator.cli import main
from orchestrator.hardware.pricing import unit_metrics
from support.kuberay_schema import validate_manifest

H200 = REPO / "results" / "examples" / "llama3-8b-h200"
INTERACTIVE = REPO / "results" / "examples" / "llama3-8b-h200-interactive"


def _cand(tid, low, gpus=1, point=None, high=None, **kw):
    return Candidate(trial_id=tid, gpus_per_replica=gpus, tensor_parallel_size=gpus,
                     capacity_rps=point if point is not None else low, capacity_rps_low=low,
                     capacity_rps_high=high, confidence=0.9, **kw)


# ---------------------------------------------------------------- the arithmetic
def test_replicas_round_up_with_headroom_and_not_on_float_noise():
    assert replicas_for(400, 48, 0.2) == 10  # ceil(480 / 48)
    assert 400 * (1 + 0.1) / 11 > 40  # 40.00000000000001 in floating point
    assert replicas_for(400, 11, 0.1) == 40  # not 41
    assert replicas_for(400, 110, 0.2) == 5  # ceil(4.36)
    assert replicas_for(401, 48, 0.2) == 11
    assert replicas_for(400, 48, 0.0) == 9  # ceil(8.33)
    assert replicas_for(0.5, 48, 0.2) == 1


def test_tp1_and_tp2_fleets_compared_by_cost_not_per_gpu_capacity():
    tp1, tp2 = _cand("tp1", 48.0, gpus=1), _cand("tp2", 110.0, gpus=2)
    # 400 req/s: 10 x 1 GPU vs 5 x 2 GPUs: the same 10 GPUs; TP 2 holds 550 req/s to TP 1's 480: first
    plans = plan_fleet([tp1, tp2], 400, headroom=0.2, price_per_gpu_hour=2.0)
    by = {p.candidate.trial_id: p for p in plans.plans}
    assert (by["tp1"].replicas, by["tp1"].gpus) == (10, 10) and (by["tp2"].replicas, by["tp2"].gpus) == (5, 10)
    assert by["tp1"].cost_per_hour == by["tp2"].cost_per_hour == 20.0
    assert [p.candidate.trial_id for p in plans.plans] == ["tp2", "tp1"]
    assert by["tp2"].utilisation == pytest.approx(400 / 550) and by["tp1"].utilisation == pytest.approx(400 / 480)
    # 500 req/s: 13 GPUs (TP 1) vs 6 x 2 = 12 (TP 2): TP 2 is cheaper
    plans = plan_fleet([tp1, tp2], 500, headroom=0.2, price_per_gpu_hour=2.0)
    assert [(p.candidate.trial_id, p.gpus, p.cost_per_hour) for p in plans.plans] == [("tp2", 12, 24.0),
                                                                                    ("tp1", 13, 26.0)]
    # 100 req/s: TP 2 is better per GPU (55 vs 48) but rounds up to 2 x 2 = 4 GPUs; TP 1 needs 3
    plans = plan_fleet([tp1, tp2], 100, headroom=0.2, price_per_gpu_hour=2.0)
    assert [(p.candidate.trial_id, p.gpus) for p in plans.plans] == [("tp1", 3), ("tp2", 4)]


def test_sized_on_the_validated_low_end_not_the_point_estimate():
    c = _cand("t", 46.875, point=49.53, high=58.59)
    plan = plan_fleet([c], 400, headroom=0.2).best
    assert plan.replicas == math.ceil(480 / 46.875) == 11
    assert plan.replicas_on_point == math.ceil(480 / 49.53) == 10  # one replica short on the point
    assert plan.cost_per_hour is None and plan.cost_per_mtok is None  # no price given
    assert "validated" in c.sized_on
    old = Candidate("old", 1, 1, capacity_rps=52.5)  # a row without an interval: its point, said so
    assert old.sizing_rps == 52.5 and "no interval" in old.sized_on
    assert plan_fleet([old], 400).best.replicas == 10


def test_autoscaling_target_from_littles_law():
    c = _cand("t", 50.0, rate_at_capacity=52.0, e2el_mean_s_at_capacity=2.0)
    assert c.concurrency_at_capacity() == 104.0  # requests in flight at capacity
    # a replica sized to carry 50 / 1.25 = 40 req/s holds 40 x 2 s = 80 requests
    assert target_ongoing_requests(c, 0.25) == 80.0
    plan = plan_fleet([c], 400, headroom=0.25, min_replicas=2).best
    assert plan.autoscaling.config() == {"min_replicas": 2, "max_replicas": 10, "target_ongoing_requests": 80.0}
    assert "Little's law" in plan.autoscaling.derivation
    no_latency = plan_fleet([_cand("t", 50.0)], 400).best.autoscaling
    assert "target_ongoing_requests" not in no_latency.config() and "default" in no_latency.derivation
    assert plan_fleet([c], 10, min_replicas=5).best.autoscaling.min_replicas == 1  # never above max


def test_fleet_cost_per_mtok_is_pricings_definition():
    """At an exact fit (no headroom, the rate a whole number of replicas carries) the fleet's cost per
    million output tokens is one replica's, as pricing.unit_metrics computes it at that replica's rate."""
    c = _cand("t", 40.0, gpus=2, output_tokens_per_request=120.0)
    plan = plan_fleet([c], 200, headroom=0.0, price_per_gpu_hour=3.0).best
    assert plan.replicas == 5 and plan.cost_per_hour == 30.0
    one = unit_metrics({"output_throughput": 40.0 * 120.0}, 2, 3.0)["cost_per_mtok"]
    assert plan.cost_per_mtok == pytest.approx(one)
    # headroom is paid for: 20% more replicas, same tokens served
    assert plan_fleet([c], 200, headroom=0.2, price_per_gpu_hour=3.0).best.cost_per_mtok == pytest.approx(one * 6 / 5)


def test_ties_on_capacity_per_gpu_are_said():
    a, b = _cand("a", 45.0, point=50.0, high=55.0), _cand("b", 90.0, gpus=2, point=104.0, high=112.0)
    c = _cand("c", 20.0, point=22.0, high=24.0)
    plans = {p.candidate.trial_id: p for p in plan_fleet([a, b, c], 100).plans}
    assert plans["a"].tied_with == ("b",) and plans["b"].tied_with == ("a",)
    assert plans["a"].tie_note == "tied with 1 other within the noise"
    assert plans["c"].tied_with == () and plans["c"].tie_note == ""


@pytest.mark.parametrize("rate", [0, -1, "nan", "inf", "abc", None])
def test_bad_rates_are_refused(rate):
    with pytest.raises(PlanError, match="--rate must be"):
        check_rate(rate)
    with pytest.raises(PlanError):
        plan_fleet([_cand("t", 10.0)], rate)


def test_nothing_to_size_on_says_why():
    with pytest.raises(PlanError, match="no configuration has a measured capacity.*\n  t: no validated capacity"):
        plan_fleet([_cand("t", 0.0, point=30.0)], 100)
    plans = plan_fleet([_cand("t", 0.0, point=30.0), _cand("u", 10.0)], 100)
    assert [p.candidate.trial_id for p in plans.plans] == ["u"] and plans.skipped[0][0] == "t"
    with pytest.raises(PlanError, match="--headroom"):
        plan_fleet([_cand("u", 10.0)], 100, headroom=-0.1)


# ---------------------------------------------------------------- the command
def _plan(capsys, *argv):
    rc = main(["plan", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _check_serve_config(path: Path) -> dict:
    """Ray Serve's own schema classes accept the config and its autoscaling."""
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load(path.read_text())
    ServeDeploySchema.model_validate(doc)
    llm = doc["applications"][0]["args"]["llm_configs"][0]
    AutoscalingConfig(**llm["deployment_config"]["autoscaling_config"])
    return llm


def test_plan_h200_dataset_writes_valid_serve_config_and_rayservice(capsys, tmp_path):
    from orchestrator.results import load_trials
    from orchestrator.results.levels import load_levels

    serve, service = tmp_path / "serve.yaml", tmp_path / "rayservice.yaml"
    rc, out, err = _plan(capsys, H200, "--rate", 400, "--serve-config", serve, "--rayservice", service)
    assert rc == 0, err
    trials = load_trials(H200)
    best = trials.loc[trials["capacity_rps"].idxmax()]
    replicas = math.ceil(round(400 * 1.2 / best["capacity_rps"], 9))  # no interval in this dataset: the point
    assert replicas == 10
    assert f"{replicas} replicas x 1 H200 (TP 1) = {replicas} H200, ${replicas * 7.90:,.2f}/hour" in out
    assert "no interval recorded" in out and "tied with 1 other within the noise" in out

    llm = _check_serve_config(serve)
    chosen = next(line for line in out.splitlines() if line.startswith("Cheapest: trial ")).split()[2].rstrip(":")
    level = load_levels(H200, [chosen]).query("rate == 52.5").iloc[0]
    scaling = llm["deployment_config"]["autoscaling_config"]
    assert scaling["min_replicas"] == 1 and scaling["max_replicas"] == replicas
    assert scaling["target_ongoing_requests"] == pytest.approx(52.5 / 1.2 * level["e2el_mean_ms"] / 1000, abs=0.1)
    row = trials.set_index("trial_id").loc[chosen]
    assert llm["engine_kwargs"]["max_num_seqs"] == row["max_num_seqs"]

    doc = yaml.safe_load(service.read_text())
    validate_manifest(doc)
    assert yaml.safe_load(doc["spec"]["serveConfigV2"]) == yaml.safe_load(serve.read_text())
    group, = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (1, replicas)
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_plan_interactive_dataset_sizes_on_the_low_end(capsys, tmp_path):
    rc, out, err = _plan(capsys, INTERACTIVE, "--rate", 400, "--rayservice", tmp_path / "rs.yaml")
    assert rc == 0, err
    assert "11 replicas x 1 H200" in out and "on the point estimate it would be 10 replicas" in out
    assert "not planned: r20261204-200906-dhcj-0001: no validated capacity" in out
    validate_manifest(yaml.safe_load((tmp_path / "rs.yaml").read_text()))


def _run(study_file: Path, output: Path, *argv: str) -> None:
    r = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(study_file), "--output", str(output),
                        "--quiet", *argv], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_plan_refuses_the_quickstart_which_has_no_capacity_search(capsys, tmp_path_factory):
    from support.quickstart_dataset import shared_quickstart

    assert "capacity" not in yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    # The quickstart's dataset of this test run, in virtual time (made once for the modules that read it).
    rc, out, err = _plan(capsys, shared_quickstart(tmp_path_factory), "--rate", 10)
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert "no capacity search" in err and "capacity_rps" in err and "`capacity:` section" in err


def test_plan_refuses_bad_rates(capsys):
    for bad in ("0", "-3", "fast"):
        with pytest.raises(SystemExit) as e:
            main(["plan", str(H200), "--rate", bad])
        assert e.value.code == 2
        assert "--rate" in capsys.readouterr().err


SIM_STUDY = """
name: plan-sim
seed: 0
engine: {kind: sim, mode: virtual}
model: {name: llama-3.1-8b}
hardware: {gpu: H100-80GB, gpus_per_node: 2}
workload:
  arrival: {kind: poisson, rate: 8}
  num_requests: 120
  warmup_requests: 1
  input_len: {kind: uniform, min: 200, max: 1500}
  output_len: {kind: uniform, min: 16, max: 96}
space:
  tensor_parallel_size: [1, 2]
  max_num_seqs: 64
objectives: [maximize capacity_rps]
constraints: ["ttft_p99_ms <= 300", "tpot_p50_ms <= 30"]
capacity: {tolerance: 0.05}
search: {sampler: grid}
budget: {trials: 2, max_concurrent_trials: 1}
"""


@pytest.fixture(scope="module")
def sim_capacity_study(tmp_path_factory) -> Path:
    """A capacity search in virtual time over TP 1 and TP 2 (the quickstart runs none)."""
    import ray

    base = tmp_path_factory.mktemp("plan-sim")
    (base / "study.yaml").write_text(SIM_STUDY)
    ray_unit()  # the run joins the Ray unit's cluster instead of starting one
    _run(base / "study.yaml", base / "results", "--address", ray.get_runtime_context().gcs_address)
    return base / "results" / "plan-sim"


def test_plan_sim_capacity_study_compares_tp1_and_tp2(capsys, tmp_path, sim_capacity_study):
    from orchestrator.results import load_trials

    trials = load_trials(sim_capacity_study).set_index("trial_id")
    assert sorted(trials["gpus"]) == [1, 2] and trials["capacity_rps_low"].gt(0).all()
    rc, out, err = _plan(capsys, sim_capacity_study, "--rate", 400, "--price", 2.5)
    assert rc == 0, err
    table = out[out.index("configurations with a measured capacity"):].splitlines()[2:4]
    rows = [line.split() for line in table]
    costs = []
    for cells in rows:
        tid, tp, per_replica = cells[0], int(cells[1]), int(cells[2])
        band_end = next(i for i, cell in enumerate(cells) if cell.endswith("]"))  # capacity [low, high]
        replicas, gpus, cost = int(cells[band_end + 1]), int(cells[band_end + 2]), float(cells[band_end + 3])
        assert per_replica == tp == trials.loc[tid, "gpus"]
        assert replicas == max(1, math.ceil(round(480 / trials.loc[tid, "capacity_rps_low"], 9)))
        assert gpus == replicas * tp and cost == pytest.approx(gpus * 2.5)
        costs.append(cost)
    assert costs == sorted(costs)  # cheapest first

    tp2 = trials.index[trials["gpus"] == 2][0]
    serve, service = tmp_path / "serve.yaml", tmp_path / "rs.yaml"
    rc, out, err = _plan(capsys, sim_capacity_study, "--rate", 400, "--trial", tp2, "--serve-config", serve,
                         "--rayservice", service, "--min-replicas", 2)
    assert rc == 0, err
    llm = _check_serve_config(serve)
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 2
    assert llm["deployment_config"]["autoscaling_config"]["min_replicas"] == 2
    doc = yaml.safe_load(service.read_text())
    validate_manifest(doc)
    group, = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert group["maxReplicas"] == math.ceil(round(480 / trials.loc[tp2, "capacity_rps_low"], 9))


def test_docs_example_is_the_commands_output(capsys):
    """docs/planning.md shows what the command prints on the example dataset, and its Python runs."""
    import re
    import shlex

    text = (REPO / "docs" / "planning.md").read_text()
    marker = re.search(r"<!-- plan: (.+?) -->\n```text\n(.*?)```", text, re.S)
    path, *options = shlex.split(marker.group(1))
    rc, out, err = _plan(capsys, REPO / path, *options)
    assert rc == 0, err
    assert [line.rstrip() for line in out.splitlines()] == marker.group(2).splitlines()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/planning.md", "exec"), scope)
    capsys.readouterr()
    best = scope["best"]
    assert (best.candidate.trial_id, best.replicas, best.gpus) == ("tp2", 6, 12)
    assert best.cost_per_hour == pytest.approx(94.80)
