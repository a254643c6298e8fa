"""The simulator's out-of-sample error, and the fidelity search's margins that come from it.

``results/examples/sim-error`` holds every recorded real trial replayed in the simulator
(``benchmarks/sim_error.py``, an hour of simulations): docs/simulator.md's tables are generated
from it (tests/apps/test_docs_tables.py), the margins in ``orchestrator/search/fidelity/margin.py``
must equal what it gives, and a cheap part of it is replayed again here, so a simulator that
changed under the stored dataset fails instead of leaving the docs and the margins stale.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import REPO
from orchestrator.doc_tables import sim_error as tables
from orchestrator.search.fidelity import error, margin, replay

DATASET = REPO / "results" / "examples" / "sim-error"
EXAMPLES = REPO / "results" / "examples"


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return tables.load(DATASET)


@pytest.fixture(scope="module")
def recorded() -> tuple[list, dict]:
    return replay.recorded_trials(EXAMPLES)


def test_the_margins_are_what_the_recorded_errors_give(rows):
    measured, unmeasured = error.margins(rows, replay.TABLE_METRICS)
    assert measured == margin.MEASURED_LOG_SD, "rerun benchmarks/sim_error.py's margins into fidelity/margin.py"
    assert unmeasured == margin.UNMEASURED_LOG_SD
    assert set(measured) == {"H200", "H100-80GB"}  # both GPUs of the recorded datasets


def test_every_recorded_real_trial_is_replayed_or_said_why_not(rows, recorded):
    """A real dataset added under results/examples fails here until the benchmark runs again."""
    trials, skipped = recorded
    run = json.loads((DATASET / tables.RUN_FILE).read_text())
    assert set(run["left_out"]) <= set(skipped), "left out then, not now: run benchmarks/sim_error.py again"
    assert "speculative decoding (not modelled)" in skipped.values()
    assert set(rows["dataset"]) == {t.dataset for t in trials}
    assert set(rows["trial_id"]) == {t.trial_id for t in trials}
    # Every scheme predicts every trial: leave-one-out and other-GPU folds cover each dataset once.
    for scheme in replay.SCHEMES:
        assert set(rows[rows["scheme"] == scheme]["trial_id"]) == {t.trial_id for t in trials}, scheme
    lodo = rows[rows["scheme"] == replay.LEAVE_ONE_OUT]
    for dataset, g in lodo.groupby("dataset"):
        assert dataset not in g["trained_on"].iloc[0].split(", ") and g["trained_on"].nunique() == 1


@pytest.mark.parametrize("scheme, dataset", [(replay.SHIPPED, "trained-base-spec-h100"),
                                             (replay.LEAVE_ONE_OUT, "trained-base-spec-h100"),
                                             (replay.OTHER_GPU, "llama3-8b-h200-reference")])
def test_the_stored_predictions_are_what_the_simulator_gives_now(rows, recorded, scheme, dataset):
    """A small H100 and a small H200 dataset simulated again, with no calibration and with the one its
    fold stored: the same numbers. When this fails, the simulator changed: `python benchmarks/sim_error.py
    --jobs 2 --iterations 1`, then `python -m orchestrator.doc_tables.registry --write` (and the margins, if
    they moved)."""
    mine = [t for t in recorded[0] if t.dataset == dataset]
    stored = rows[(rows["scheme"] == scheme) & (rows["dataset"] == dataset)]
    calibration = json.loads(stored["calibration_json"].iloc[0])
    fold = replay.Fold(scheme, mine[0].gpu, (dataset,), tuple(stored["trained_on"].iloc[0].split(", ")))
    again = [r for t in mine
             for r in replay.prediction_rows(str(EXAMPLES), t, fold, calibration, replay.sequential(str(EXAMPLES)))]
    key = ["trial_id", "level", "metric"]
    got = pd.DataFrame(again).set_index(key)["predicted"].sort_index()
    want = stored.set_index(key)["predicted"].sort_index()
    assert list(got.index) == list(want.index), dataset
    pd.testing.assert_series_equal(got, want, rtol=1e-6, obj=f"{dataset} ({scheme}): predictions")
    if scheme != replay.SHIPPED:  # the fold's calibration is one its fit found
        fits = pd.read_parquet(DATASET / tables.FITS_FILE)
        fit = fits[(fits["scheme"] == scheme) & (fits["gpu"] == mine[0].gpu)
                   & fits["held_out"].str.split(", ").apply(lambda held: dataset in held)].iloc[0]
        assert {f: fit[f] for f in calibration} == pytest.approx(calibration) and fit["fit_points"] > 0


def test_a_gpu_never_measured_gets_a_wider_margin_and_more_confirmations():
    h200, h100, other = (margin.screening_rule(g) for g in ("H200", "H100", "A100-80GB"))
    assert h200.measured and h100.measured and not other.measured and h100.gpu == "H100-80GB"
    for rule in (h200, h100):
        for m in replay.TABLE_METRICS:
            assert other.sd(m) > rule.sd(m), (rule.gpu, m)
            assert other.confirmations(m) >= rule.confirmations(m), (rule.gpu, m)
        assert other.confirmations("capacity_rps") > rule.confirmations("capacity_rps"), rule.gpu
    # The study in the test below: a throughput objective, confirmed once on the H200, more elsewhere.
    assert h200.confirmations("output_throughput") < other.confirmations("output_throughput")
    # A metric the table has no row for takes its family's widest: goodput is a throughput.
    assert h200.sd("goodput") == max(h200.sd("capacity_rps"), h200.sd("output_throughput"))
    with pytest.raises(KeyError, match="unknown GPU"):
        margin.screening_rule("H300")


def _study(gpu: str):
    from orchestrator.study.spec import parse_study
    from support.studies import external_doc

    doc = external_doc("http://127.0.0.1:9", name="margins", seed=1, hardware={"gpu": gpu},
                       space={"max_num_seqs": [8, 16, 32, 64], "max_num_batched_tokens": [2048, 8192]},
                       constraints=["tpot_p50_ms <= 200"], search={"fidelity": "sim"}, budget={"trials": 8})
    return parse_study(doc | {"workload": {"arrival": {"kind": "concurrency", "concurrency": 4}, "num_requests": 8,
                                           "warmup_requests": 0, "input_len": 256, "output_len": 48}})


@pytest.mark.parametrize("gpu", ["H200", "A100-80GB"])
def test_the_fidelity_search_confirms_as_many_real_trials_as_its_gpus_error_asks(gpu):
    """Real trials that measure exactly what the simulator predicted: the search stops as soon as its
    rule lets it, after the confirmations of its GPU (more on a GPU never measured), and says the rule."""
    from orchestrator.search.fidelity.search import FidelitySearch, fidelity_metrics

    study = _study(gpu)
    notes: list[str] = []
    search = FidelitySearch(study, note=notes.append)
    search.prepare()
    rule = margin.screening_rule(gpu)
    assert search.rule == rule and search.confirmations == rule.confirmations("output_throughput")
    assert any(f"simulator error on {rule.gpu}" in n for n in notes), notes
    measured = 0
    while (pick := search.next_pick()) is not None:
        score = search.scorer([pick.params], search.calibration())[0][1]
        search.observe(pick.params, "completed", {m: score.get(m) for m in fidelity_metrics(study)}, refit=False)
        measured += 1
    assert measured == search.confirmations, (measured, search.stop_reason)
    assert "below" in search.stop_reason


def _capacity_row(config: str, measured: float, low, high, predicted: float) -> dict:
    return {"scheme": replay.SHIPPED, "gpu": "H100-80GB", "dataset": "d", "trial_id": config, "config": config,
            "objective": "capacity_rps", "metric": "capacity_rps", "maximize": True, "margin": 0.05, "level": -1,
            "measured": measured, "measured_low": low, "measured_high": high, "predicted": predicted,
            "scored": True}


def test_a_pair_counts_as_decided_only_when_its_measured_intervals_lie_apart():
    frame = pd.DataFrame([
        _capacity_row("a", 30.0, 0.0, None, 42.0),   # overlaps b: the engine did not tell a and b apart
        _capacity_row("b", 49.5, 46.9, 58.6, 41.0),  # predicted below a: out of the measured order
        _capacity_row("c", 16.7, 13.5, 19.2, 25.0),  # apart from b (and below it as predicted); overlaps a
        _capacity_row("e", 20.0, None, None, 20.0),  # no interval recorded: in no decided pair; below c as predicted
    ])
    r = error.ranking(frame).iloc[0]
    assert (r.pairs, r.right) == (6, 4), r.wrong  # a-b and c-e out of order
    assert (r.with_intervals, r.decided, r.decided_right) == (3, 1, 1), r.to_dict()  # only b-c decided
    assert "not told apart as measured" in r.wrong and "30 [0, inf]" in r.wrong
