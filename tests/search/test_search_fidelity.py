"""``search.fidelity: sim`` end to end: the simulator screens, an external endpoint confirms.

The endpoint is the served simulator (``orchestrator serve-sim``: its OpenAI server over the engine
loop, in real time) with hidden calibration multipliers, the study's search sees the shipped simulator only.
The endpoint runs one configuration whose behaviour every configuration of the space shares
(``max_num_seqs`` above the workload's concurrency), so the prediction error of a real trial
is the simulator's error alone: after the calibration is fitted to the first real trial, the
next prediction must be closer. A real study: local Ray, Tune, Optuna, Parquet.
"""

from __future__ import annotations

import json
import math
import re
import time

import pandas as pd
import pytest

from orchestrator.study.spec import StudyFileError, parse_study
from support.studies import run_printed, tune_trials

pytestmark = pytest.mark.slow

HIDDEN = {"step_overhead": 1.6, "compute_efficiency": 1.0, "bandwidth_efficiency": 0.7, "slowdown": 1.0,
          "frontend_latency": 1.5}


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """``orchestrator serve-sim`` on a study of the hidden calibration, in its own process (as a
    user serves an external endpoint): in this one it shared the interpreter with the study's
    driver, and the driver's work between its steps once slowed a trial by a fifth."""
    import yaml

    from support.serve_sim import start_serve_sim, stop

    study_file = tmp_path_factory.mktemp("endpoint") / "endpoint.yaml"
    study_file.write_text(yaml.safe_dump({
        "name": "endpoint", "engine": {"kind": "sim", "calibration": HIDDEN}, "model": {"name": "llama-3.1-8b"},
        "hardware": {"gpu": "H100-80GB"}, "space": {"max_num_seqs": 64, "max_num_batched_tokens": 8192},
        "objectives": ["maximize output_throughput"]}))
    proc, url = start_serve_sim(str(study_file))
    try:
        yield url.removesuffix("/v1")
    finally:
        if proc.poll() is None:
            stop(proc)


def _doc(tmp_path, url: str, **search) -> dict:
    return {
        "name": "mf", "seed": 1, "engine": {"kind": "external", "base_url": url},
        "model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 1},
        "workload": {"arrival": {"kind": "concurrency", "concurrency": 4}, "num_requests": 24,
                     "warmup_requests": 4, "input_len": 256, "output_len": 48},
        "space": {"max_num_seqs": [8, 16, 32, 64], "max_num_batched_tokens": [2048, 8192]},
        "objectives": ["maximize output_throughput"], "constraints": ["tpot_p50_ms <= 200"],
        "search": {"fidelity": "sim", **search}, "budget": {"trials": 6, "max_concurrent_trials": 1},
        "output": str(tmp_path / "out"),
    }


def test_the_simulator_screens_and_real_trials_confirm(endpoint, unit_ray, tmp_path):
    import ray

    # 3%: on this GPU the simulator's measured throughput margin (docs/simulator.md, "Out-of-sample error")
    # keeps another trial's expected gain in a flat landscape near 2% for many trials; above it, the
    # search stops once its confirmations are in.
    study = parse_study(_doc(tmp_path, endpoint, fidelity_min_gain=0.03))
    rows, out = run_printed(study, serve_port=8133)
    actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    # Nothing is deployed for an endpoint that runs elsewhere: no Serve controller or proxy was started.
    assert not any(name.startswith("SERVE_") for name in actors), actors
    rows = rows.sort_values("trial_number")
    tuned = tune_trials(study)
    # Every real trial is a Tune trial and a row; the stop rule ended the run before the budget (every
    # configuration behaves alike here, so once the simulator is calibrated no trial is worth running).
    assert len(rows) == len(tuned) >= 1, (rows[["trial_number", "status"]], out)
    assert len(rows) < study.budget.trials and "fidelity sim: stop:" in out, out
    assert "fidelity sim: scored 8 of 8 configurations" in out
    assert (rows["status"] == "completed").all() and (rows["fidelity"] == "real").all()
    for m in ("output_throughput", "tpot_p50_ms"):
        assert rows[f"predicted_{m}"].notna().all() and rows[f"prediction_error_{m}"].notna().all()
        err = (rows[m] - rows[f"predicted_{m}"]) / rows[f"predicted_{m}"]
        assert (err - rows[f"prediction_error_{m}"]).abs().max() < 1e-9
    # The shipped simulator is off by the hidden multipliers; the calibration fitted to the real trials
    # predicts them far better: the measured configurations under the last calibration, and the next
    # real trial's prediction where there was one.
    first = abs(rows["prediction_error_tpot_p50_ms"].iloc[0])
    assert first > 0.1, rows["prediction_error_tpot_p50_ms"].tolist()
    preds = pd.concat(pd.read_parquet(p) for p in (tmp_path / "out" / "mf" / "predictions").glob("*.parquet"))
    refitted = preds[preds["measured"]].set_index("params_json")["predicted_tpot_p50_ms"]
    measured = rows.set_index(rows["params_json"].map(lambda s: json.dumps(json.loads(s), sort_keys=True)))
    after = ((measured["tpot_p50_ms"] - refitted.reindex(measured.index)) / refitted.reindex(measured.index)).abs()
    assert after.notna().all() and (after < first / 2).all(), (first, after.tolist())
    assert (rows["prediction_error_tpot_p50_ms"].abs().iloc[1:] < first / 2).all()
    # Every configuration is predicted alike here: the first pick is the predicted best (a tie), so it says so.
    journal = (tmp_path / "out" / "mf" / "optuna.journal").read_text()
    picks = re.findall(r'"fidelity_pick":\s*"(\w+)"', journal)
    assert picks and picks[0] == "best", picks
    # The simulator's scores are kept apart from the measured trials.
    assert len(preds) == 8 and (preds["fidelity"] == "sim").all() and preds["measured"].sum() == len(rows)
    assert "predicted_tpot_p50_ms" in preds.columns
    _predictions_were_printed_before_each_trial_and_show_counts_them(study, rows, out, tmp_path / "out" / "mf")


def _predictions_were_printed_before_each_trial_and_show_counts_them(study, rows, out: str, study_dir) -> None:
    """Each real trial's prediction and its stated error (the simulator's measured error on the GPU, one
    log sd either way) were printed before the trial ran, and after it against the measurement;
    ``show``'s share of trials within their stated error is the rows' own."""
    from orchestrator.results.definition import write_study_definition
    from orchestrator.search.fidelity.margin import screening_rule
    from support.cli import orchestrator

    metrics = ("output_throughput", "tpot_p50_ms")
    rule = screening_rule(study.hardware.gpu)
    within = pd.Series(True, index=rows.index)
    for m in metrics:
        sd = rule.sd(m)
        assert (rows[f"predicted_{m}_low"] - rows[f"predicted_{m}"] * math.exp(-sd)).abs().max() < 1e-6
        assert (rows[f"predicted_{m}_high"] - rows[f"predicted_{m}"] * math.exp(sd)).abs().max() < 1e-6
        within &= rows[m].between(rows[f"predicted_{m}_low"], rows[f"predicted_{m}_high"])
    printed = {}
    for _, row in rows.iterrows():
        tid = row["trial_id"]
        before = re.search(rf"trial {tid}: the simulator predicts output_throughput [\d,.]+ \(stated error "
                           rf"[\d,.]+–[\d,.]+\), tpot_p50_ms [\d,.]+ \([\d,.]+–[\d,.]+\)", out)
        result = re.search(rf"\] {tid} completed.*\n.*\n\s+(output_throughput .*)", out)
        assert before and result and before.start() < result.start(), out
        said = result.group(1).split("; ")
        for m, text in zip(metrics, said):
            inside = row[f"predicted_{m}_low"] <= row[m] <= row[f"predicted_{m}_high"]
            assert text.startswith(f"{m} ") and ("within" in text) == inside, (text, row[m])
        printed[tid] = result.group(1)
    write_study_definition(study)  # as `orchestrator run` does before its study runs
    shown = orchestrator("show", str(study_dir))
    assert shown.returncode == 0, shown.stderr
    assert (f"predictions within their stated error: {int(within.sum())} of {len(rows)} trials"
            in shown.stdout), shown.stdout
    assert all(f"{tid}: {text}" in shown.stdout for tid, text in printed.items()), shown.stdout  # as printed


def test_a_capacity_study_fits_each_load_level_at_its_own_rate(endpoint, unit_ray, tmp_path):
    """A capacity trial's metrics are measured at its capacity, the simulator's at the capacity it
    predicts: with TPOT the SLO both sit just under the limit, whatever the step costs are. The
    calibration is fitted to each measured load level against the simulator at that level's rate,
    so the calibrated simulator reproduces the levels (the hidden multipliers slow decode ~1.4x); the
    old fit, trial to prediction, moved step_overhead the wrong way (0.43) and fails here."""
    from orchestrator.results.levels import load_levels
    from orchestrator.search.fidelity.search import fit_levels, score_in_simulator

    doc = _doc(tmp_path, endpoint)
    doc["workload"] = {"arrival": {"kind": "poisson", "rate": 8}, "num_requests": 60, "warmup_requests": 4,
                       "input_len": 1024, "output_len": 48}
    doc["space"] = {"max_num_seqs": [64, 128], "max_num_batched_tokens": 8192}  # both as the endpoint runs
    doc["objectives"] = ["maximize capacity_rps"]
    doc["constraints"] = ["tpot_p50_ms <= 15"]
    doc["capacity"] = {"start_rate": 8, "growth": 1.5, "tolerance": 0.15, "max_levels": 4, "requests_per_level": 60}
    doc["budget"] = {"trials": 2, "max_concurrent_trials": 1}
    study = parse_study(doc)
    rows, out = run_printed(study, serve_port=8134)
    assert len(rows) >= 1 and (rows["status"] == "completed").all(), (rows[["status", "failure_message"]], out)
    levels = load_levels(tmp_path / "out" / "mf")
    preds = pd.concat(pd.read_parquet(p) for p in (tmp_path / "out" / "mf" / "predictions").glob("*.parquet"))
    cal = json.loads(preds[preds["measured"]]["calibration_json"].iloc[-1])
    seen = levels.reindex(columns=["trial_id", "rate", "ttft_p50_ms", "tpot_p50_ms", "harness_bound",
                                   "stopped_early", "slo_met"]).to_dict("records")
    # Decode slowed, as hidden. The levels' decode steps stream the weights: ~2.5 ms x step_overhead + ~5.3 ms /
    # bandwidth_efficiency. Their TPOT pins that sum (1.48x the shipped step under the hidden multipliers; the
    # endpoint's TPOT is the hidden simulator's within 4%), not the split: the served endpoint has no modelled
    # frontend latency (its TTFT is 0.4x the hidden virtual one) and the fit absorbs that partly through
    # step_overhead, which scales it. step_overhead / bandwidth_efficiency came out anywhere in 1.1-2.6 on
    # alike levels; the step itself 1.5-1.8x (the top on a loaded machine, whose TPOT is longer). Bound: half
    # the hidden slowdown in log, so the shipped simulator (1.0x) or a fit the wrong way fails.
    slowed, hidden = (_decode_slowdown(study, json.loads(rows["params_json"].iloc[0]), c) for c in (cal, HIDDEN))
    assert slowed > hidden ** 0.5, (slowed, hidden, cal, seen, out)
    # The fit's printed RMS log error is the calibrated simulator's against each level at that level's own rate
    # (printed to 3 decimals). A fit of every level at one rate (the start rate, or the capacity the simulator
    # predicts) prints an error of its own, 0.02-0.4 off this one: a level's throughput is off by its rate's
    # distance from that one. (The calibration it gives still slows decode, which the throughput pins.)
    printed = float(re.findall(r"fidelity sim: \d+ real trial\(s\); calibration .*RMS log error ([\d.]+)", out)[-1])
    assert abs(printed - _own_rate_rms(study, rows, levels, cal)) < 6e-4, (printed, cal, seen)

    first = rows.sort_values("trial_number").iloc[0]
    fitted = fit_levels(study, levels[levels["trial_id"] == first["trial_id"]].to_dict("records"))
    assert len(fitted) >= 2 and all("tpot_p50_ms" in lv for lv in fitted), fitted
    params = json.loads(first["params_json"])
    rates = [lv["rate"] for lv in fitted]
    plain, calibrated = ([m["tpot_p50_ms"] for _, m in score_in_simulator(study, [params] * len(rates), c, rates)]
                         for c in ({}, cal))
    real = [lv["tpot_p50_ms"] for lv in fitted]
    err = lambda pred: max(abs(p - y) / y for p, y in zip(pred, real))  # noqa: E731
    # The endpoint runs in real time on this machine's CPUs: its TPOT near the knee carries some of
    # their load (one run under a second study: 6-12% off the calibrated simulator, 37% off the plain one).
    assert err(plain) > 0.2 and err(calibrated) < err(plain) / 2, (real, plain, calibrated)


def _own_rate_rms(study, rows, levels, calibration) -> float:
    """RMS log error of the simulator under ``calibration`` against every fitted level of ``rows``, each
    simulated at its own rate (a metric the simulator leaves out counts as no error, as in the fit)."""
    from orchestrator.search.fidelity.search import fidelity_metrics, fit_levels, score_in_simulator

    errors = []
    for _, row in rows.iterrows():
        fitted = fit_levels(study, levels[levels["trial_id"] == row["trial_id"]].to_dict("records"))
        scores = score_in_simulator(study, [json.loads(row["params_json"])] * len(fitted), calibration,
                                    [lv["rate"] for lv in fitted])
        errors += [math.log(lv[m] / p[m]) if p.get(m) else 0.0
                   for lv, (_, p) in zip(fitted, scores) for m in fidelity_metrics(study) if m in lv]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _decode_slowdown(study, params, calibration) -> float:
    """A decode step of the levels' batch under ``calibration``, over the shipped simulator's: 8 sequences
    (the endpoint runs ~5-15 at the levels' rates; the ratio is flat there) at the workload's mid context."""
    from orchestrator.hardware.gpus import get_gpu
    from orchestrator.sim.cost import StepCostModel
    from orchestrator.study.spec import SimCalibration

    args = study.with_device_defaults(study.engine_args(params))
    context = study.workload.input_len.value + study.workload.output_len.value // 2
    step = [StepCostModel(study.model_shape, get_gpu(study.hardware.gpu), args, c).decode_step_time(8, context)
            for c in (SimCalibration(**calibration), None)]
    return step[0] / step[1]


@pytest.mark.parametrize("change, message", [
    ({"engine": {"kind": "sim"}}, "search.fidelity: 'sim' needs a real engine"),
    ({"hardware": {"gpu": "CPU"}}, "search.fidelity: 'sim' needs a GPU from the simulator's catalog"),
    ({"search": {"fidelity": "low"}}, "search.fidelity: not allowed; expected one of 'real' or 'sim'"),
])
def test_bad_fidelity_settings_are_one_line_errors(tmp_path, change, message):
    doc = {**_doc(tmp_path, "http://127.0.0.1:9"), **change}
    with pytest.raises(StudyFileError) as e:
        parse_study(doc)
    assert message in str(e.value)


def test_the_space_is_scored_over_the_cluster_as_in_one_process(unit_ray, tmp_path):
    """Before the first real trial the whole space is scored in Ray tasks over the free CPUs;
    the scores are the ones this process computes (the virtual simulator is deterministic)."""
    import ray

    from orchestrator.search.feasibility import space_points
    from orchestrator.search.fidelity.search import SimScorer, score_in_simulator

    doc = _doc(tmp_path, "http://127.0.0.1:9")
    doc["workload"] = {**doc["workload"], "num_requests": 8, "warmup_requests": 0}
    doc["space"] = {"max_num_seqs": {"type": "int", "low": 4, "high": 512, "log": True},
                    "max_num_batched_tokens": [2048, 4096, 8192, 16384], "gpu_memory_utilization": [0.85, 0.9]}
    doc["search"]["fidelity_candidates"] = 64
    study = parse_study(doc)
    points, _ = space_points(study.space, study.seed, max_points=study.search.fidelity_candidates)
    assert len(points) == 64 >= SimScorer.PARALLEL_MIN
    cal = {"step_overhead": 1.3, "bandwidth_efficiency": 0.8}
    def scoring_tasks() -> list[dict]:
        return [e for e in ray.timeline() if "score_in_simulator" in str(e.get("name", ""))]

    before = {json.dumps(e, sort_keys=True) for e in scoring_tasks()}  # the module's cluster: earlier studies'
    scored = SimScorer(study).over_cluster(points, cal)
    time.sleep(2)  # task events reach the GCS in batches, about every second
    ran = {e.get("tid") for e in scoring_tasks() if json.dumps(e, sort_keys=True) not in before}
    assert len(ran) >= 2  # over the cluster, in more than one worker
    here = score_in_simulator(study, points[::8], cal)
    wall = {"load_window_s", "wall_time_s", "overhead_s"}  # this machine's time, not the simulated engine's
    strip = lambda scores: [(s, {k: v for k, v in m.items() if k not in wall}) for s, m in scores]  # noqa: E731
    assert strip(scored[::8]) == strip(here)
    assert len(scored) == len(points) and all(st == "completed" for st, _ in scored)


def test_measurements_far_from_any_calibration_keep_the_fit_within_its_bounds(tmp_path):
    """One H200 capacity trial once pulled bandwidth_efficiency past the calibration's limit,
    and the error hung the study. Measurements 20x off fit to multipliers at their bounds, the
    search goes on and its calibration is one the simulator accepts."""
    from orchestrator.search.fidelity import model as fm
    from orchestrator.search.fidelity.search import FidelitySearch, fidelity_metrics
    from orchestrator.study.engine import SimCalibration

    doc = _doc(tmp_path, "http://127.0.0.1:9")
    doc["workload"] = {**doc["workload"], "num_requests": 8, "warmup_requests": 0}
    study = parse_study(doc)
    notes: list[str] = []
    search = FidelitySearch(study, note=notes.append)
    search.prepare()
    first = search.next_pick()
    predicted = search.prediction_for(first.params)
    score = search.scorer([first.params], search.calibration())[0][1]
    fast = {m: (score[m] * 20 if "throughput" in m else score[m] / 20) for m in fidelity_metrics(study)
            if isinstance(score.get(m), float)}
    search.observe(first.params, "completed", fast)
    cal = search.calibration()
    SimCalibration(**cal)
    assert any(abs(cal[f] - fm.BOUNDS[f][1]) < 1e-9 for f in ("compute_efficiency", "bandwidth_efficiency"))
    assert all(fm.BOUNDS[f][0] <= v <= fm.BOUNDS[f][1] for f, v in cal.items()), cal
    assert not any("fit failed" in n for n in notes), notes
    # The search goes on: another configuration is picked, not the one just measured.
    following = search.next_pick()
    assert following is not None and following.params != first.params, search.stop_reason
    assert predicted["output_throughput"] > 0


def test_a_trial_run_as_the_trial_actor_runs_it_keeps_the_prediction_it_was_picked_on(endpoint, tmp_path):
    """The trial actor's own steps (``measure_trial``, as ``tune_trainable`` runs them): the row holds
    what the simulator predicted and how far the measurement was from it."""
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial

    study = parse_study(_doc(tmp_path, endpoint))
    predicted = {"output_throughput": 1000.0, "tpot_p50_ms": 20.0}
    row = run_trial(study, {"max_num_seqs": 64, "max_num_batched_tokens": 8192}, trial_id="r-0000",
                    trial_number=0, ctx=TrialContext("r"), prediction=predicted).row
    assert row["status"] == "completed", row.get("failure_message")
    for metric, p in predicted.items():
        assert row[f"predicted_{metric}"] == p
        assert row[f"prediction_error_{metric}"] == pytest.approx((row[metric] - p) / p)
