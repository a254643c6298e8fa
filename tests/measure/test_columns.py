"""A trial's column groups hold only the names they declare, and cross Ray's object store intact."""

import pickle

import pytest

from orchestrator.measure.columns import EngineColumns, ProbeColumns, SessionColumns
from orchestrator.trial.result import TrialResult


def test_a_name_outside_the_vocabulary_fails_where_the_group_is_made():
    with pytest.raises(KeyError, match="kv_cache_usage_peek"):
        EngineColumns({"kv_cache_usage_peek": 0.5})  # a typo is an error, not a silent extra column
    with pytest.raises(KeyError, match="ttft_p99_ms"):
        SessionColumns({"ttft_p99_ms": 1.0})  # a load metric is not a session column
    assert dict(EngineColumns({"kv_cache_usage_peak": 0.5, "engine_ttft_p50_ms": 12.0})) == {
        "kv_cache_usage_peak": 0.5, "engine_ttft_p50_ms": 12.0}


def test_groups_are_read_only_and_picklable():
    probe = ProbeColumns({"token_agreement": 0.9, "probe_reference": "weights"})
    with pytest.raises(TypeError):
        probe["token_agreement"] = 1.0  # type: ignore[index]
    again = pickle.loads(pickle.dumps(probe))
    assert type(again) is ProbeColumns and dict(again) == dict(probe)


def test_the_row_reads_every_group():
    from datetime import datetime, timezone

    from orchestrator.failures import TrialStatus

    now = datetime.now(timezone.utc)
    result = TrialResult(run_id="r", trial_id="r-0000", trial_number=0, params={}, args=None, started_at=now,
                         finished_at=now, status=TrialStatus.COMPLETED,
                         telemetry=EngineColumns({"kv_cache_usage_peak": 0.5}),
                         probe=ProbeColumns({"token_agreement": 0.9}), sessions=SessionColumns({"sessions": 4.0}))
    measured = result.measured()
    assert measured["kv_cache_usage_peak"] == 0.5 and measured["token_agreement"] == 0.9
    assert measured["sessions"] == 4.0
