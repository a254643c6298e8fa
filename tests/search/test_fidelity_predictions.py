"""``search.fidelity: sim``: a real trial's prediction, its stated error and what was measured.

The end-to-end run (the served simulator as the real engine, the progress lines before and after
each trial, ``show``'s share) is in test_search_fidelity.py; here the rules that decide what the
share counts, and that ``--quiet`` prints none of it.
"""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest

from orchestrator.results.predictions import prediction_checks, prediction_share
from orchestrator.search.fidelity.margin import screening_rule
from orchestrator.search.fidelity.search import PREDICTED_KEY, PREDICTION_KEY, prediction_columns
from orchestrator.search.optuna_search import TRIAL_NUMBER_KEY
from orchestrator.search.progress import ProgressPrinter
from orchestrator.study.spec import parse_study

PREDICTED = {"output_throughput": 1000.0, "tpot_p50_ms": 20.0}


@pytest.fixture
def study(tmp_path):
    return parse_study({
        "name": "mf", "engine": {"kind": "external", "base_url": "http://127.0.0.1:9"},
        "model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "H200", "gpus_per_node": 1},
        "space": {"max_num_seqs": [8, 64]}, "objectives": ["maximize output_throughput"],
        "constraints": ["tpot_p50_ms <= 200"], "search": {"fidelity": "sim"}, "output": str(tmp_path / "out"),
    })


def _row(study, status: str = "completed", **measured) -> dict:
    row = {"trial_id": "r-0000", "status": status, **measured}
    row.update(prediction_columns(study, PREDICTED, row))
    return row


def test_the_stated_error_is_one_measured_log_sd_either_way_and_its_ends_count_as_within(study):
    rule = screening_rule("H200")
    row = _row(study, output_throughput=1000.0, tpot_p50_ms=20.0)
    for m, p in PREDICTED.items():
        assert row[f"predicted_{m}_low"] == pytest.approx(p * math.exp(-rule.sd(m)))
        assert row[f"predicted_{m}_high"] == pytest.approx(p * math.exp(rule.sd(m)))
    low = row["predicted_output_throughput_low"]
    at_end = _row(study, output_throughput=low, tpot_p50_ms=20.0)
    below = _row(study, output_throughput=low * 0.999, tpot_p50_ms=20.0)
    assert [c.within for c in prediction_checks(at_end)] == [True, True]
    assert [c.within for c in prediction_checks(below)] == [False, True]
    # The band is the log sd's, not a symmetric percentage: 27% low is outside a stated error of +/-37%.
    assert rule.sd("capacity_rps") == pytest.approx(0.313)
    assert rule.band("capacity_rps", 100.0)[0] == pytest.approx(73.1, abs=0.05)


def test_the_share_counts_completed_trials_with_a_measurement_each_within_on_every_metric(study):
    high = PREDICTED["tpot_p50_ms"] * math.exp(screening_rule("H200").sd("tpot_p50_ms"))
    rows = pd.DataFrame([
        _row(study, output_throughput=1010.0, tpot_p50_ms=19.0),  # within on both
        _row(study, output_throughput=1010.0, tpot_p50_ms=high * 1.01),  # TPOT outside: the trial is outside
        _row(study, output_throughput=1010.0),  # no TPOT measured: throughput alone is checked
        _row(study, status="error"),  # nothing measured
        _row(study, status="degraded", output_throughput=5.0, tpot_p50_ms=19.0),  # not a measurement to judge by
    ])
    share = prediction_share(rows)
    assert (share.within, share.trials) == (2, 3)
    assert share.by_metric == {"output_throughput": (3, 3), "tpot_p50_ms": (1, 2)}
    # The one-liner docs/search.md gives, on the same rows.
    done = rows[rows.status == "completed"]
    assert done.output_throughput.between(done.predicted_output_throughput_low,
                                          done.predicted_output_throughput_high).sum() == 3
    assert prediction_share(rows.drop(columns=[c for c in rows if c.endswith(("_low", "_high"))])) is None


def test_a_quiet_run_prints_no_prediction(study):
    config = {"max_num_seqs": 8, TRIAL_NUMBER_KEY: 3, PREDICTION_KEY: json.dumps(PREDICTED)}
    row = _row(study, output_throughput=900.0, tpot_p50_ms=21.0)
    result = {"status": "completed", "tid": "r-0003", "feasible": True, "output_throughput": 900.0,
              PREDICTED_KEY: json.dumps(row)}
    printed = {}
    for quiet in (False, True):
        stream = io.StringIO()
        printer = ProgressPrinter(study, total=4, quiet=quiet, stream=stream)
        printer.run_id = "r"
        printer.trial_started(config)
        printer.trial_finished(result, config)
        printed[quiet] = stream.getvalue()
    lines = printed[False].splitlines()
    assert lines[0].startswith("  trial r-0003: the simulator predicts output_throughput 1,000 (stated error "), lines
    assert "output_throughput 1,000 predicted, 900 measured (-10.0%, outside" in lines[-1], lines
    assert printed[True] == ""
