"""Schema of the results tables: columns, row validation and coercion, the requests table."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

from orchestrator.failures import FailureKind, TrialStatus
from orchestrator.measure.metrics import known_metric_names
from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.results import (REQUESTS_SCHEMA, SCHEMA_VERSION, constraint_summary, metric_columns, param_types_of,
                                  requests_to_table, trial_row_to_table, trials_schema)
from orchestrator.study.space import SearchSpace
from orchestrator.study.spec import Constraint

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
PARAM_TYPES = {"max_num_seqs": "int", "gpu_memory_utilization": "float", "enable_chunked_prefill": "bool",
               "kv_cache_dtype": "string"}


def base_row(**kw):
    row = dict(study="s", study_fingerprint="abc", run_id="r1", trial_id="t1", trial_number=0,
               status="completed", started_at=T0)
    row.update(kw)
    return row


def test_trials_schema_column_order_and_types():
    schema = trials_schema(PARAM_TYPES)
    names = schema.names
    assert names[:5] == ["schema_version", "study", "study_fingerprint", "run_id", "trial_id"]
    assert schema.field("started_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("schema_version").type == pa.int32()
    # Parameters follow the head columns and precede the JSON columns, typed per param_types.
    i = names.index("constraint_violation")
    assert names[i + 1:i + 5] == list(PARAM_TYPES)
    assert [schema.field(n).type for n in PARAM_TYPES] == [pa.int64(), pa.float64(), pa.bool_(), pa.string()]
    assert names[i + 5] == "params_json"
    # Every known metric is a column exactly once; gpus keeps its int64 head column.
    for m in known_metric_names():
        assert names.count(m) == 1, m
    assert schema.field("gpus").type == pa.int64()
    assert all(schema.field(m).type == pa.float64() for m in metric_columns())
    assert metric_columns() == [m for m in known_metric_names() if m != "gpus"]
    assert names[-1] == "extra_json"
    assert param_types_of(schema) == PARAM_TYPES
    assert schema.metadata[b"orchestrator.schema_version"] == str(SCHEMA_VERSION).encode()


def test_trials_schema_from_a_real_search_space():
    space = SearchSpace.model_validate({
        "max_num_seqs": {"type": "int", "low": 8, "high": 256},
        "kv_cache_dtype": ["auto", "fp8"],
        "enforce_eager": False,
        "gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.95},
    })
    schema = trials_schema(space.column_types())
    assert schema.field("enforce_eager").type == pa.bool_()
    assert schema.field("kv_cache_dtype").type == pa.string()


def test_param_names_may_not_clash_with_columns():
    with pytest.raises(ValueError, match="clash.*status"):
        trials_schema({"status": "string"})
    with pytest.raises(ValueError, match="clash.*date"):
        trials_schema({"date": "string"})
    with pytest.raises(ValueError, match="unknown parameter column types"):
        trials_schema({"x": "decimal"})


def test_row_unknown_keys_are_named():
    with pytest.raises(ValueError, match="unknown trials-table keys: bogus, ttft_p99"):
        trial_row_to_table(base_row(ttft_p99=1.0, bogus=2), trials_schema({}))


def test_row_missing_required_key():
    row = base_row()
    del row["trial_id"]
    with pytest.raises(ValueError, match="missing required .*trial_id"):
        trial_row_to_table(row, trials_schema({}))


def test_row_coercion_and_nulls():
    schema = trials_schema(PARAM_TYPES)
    t = trial_row_to_table(base_row(
        status=TrialStatus.COMPLETED, failure_kind=FailureKind.RUNTIME_OOM,
        max_num_seqs=np.int32(64), gpu_memory_utilization=1, enable_chunked_prefill=np.bool_(True),
        kv_cache_dtype=None, gpus=2.0, output_throughput=5, ttft_p99_ms=float("nan"),
        completed=np.int64(7), params_json={"b": 1, "a": [1, 2]}, extra_json={"note": "x"},
        started_at="2026-03-01T13:00:00+01:00",
    ), schema)
    assert t.schema == schema
    row = t.to_pylist()[0]
    assert row["status"] == "completed" and row["failure_kind"] == "runtime_oom"
    assert row["max_num_seqs"] == 64 and row["gpu_memory_utilization"] == 1.0
    assert row["enable_chunked_prefill"] is True
    assert row["kv_cache_dtype"] is None  # an inactive parameter stays null
    assert row["gpus"] == 2 and row["output_throughput"] == 5.0 and row["completed"] == 7.0
    assert row["ttft_p99_ms"] is None  # NaN is stored as null
    assert row["params_json"] == '{"a": [1, 2], "b": 1}'
    assert row["started_at"] == T0  # converted to UTC
    assert row["schema_version"] == SCHEMA_VERSION
    assert row["finished_at"] is None and row["engine"] is None


def test_string_param_stores_str_of_value():
    schema = trials_schema({"max_num_batched_tokens": "string"})
    t = trial_row_to_table(base_row(max_num_batched_tokens=2048), schema)
    assert t.column("max_num_batched_tokens").to_pylist() == ["2048"]


@pytest.mark.parametrize("key, value, match", [
    ("max_num_seqs", 1.5, "expected an integer"),
    ("max_num_seqs", "64", "expected an integer"),
    ("gpu_memory_utilization", "0.9", "expected a number"),
    ("enable_chunked_prefill", "yes", "expected a boolean"),
    ("started_at", datetime(2026, 1, 1), "time zone is required"),
    ("status", "done", "not one of"),
    ("engine", 3, "expected a string"),
    ("schema_version", 99, "schema_version"),
])
def test_row_bad_values(key, value, match):
    with pytest.raises(ValueError, match=match):
        trial_row_to_table(base_row(**{key: value}), trials_schema(PARAM_TYPES))


def test_constraint_summary():
    cs = [Constraint.model_validate("ttft_p99_ms <= 200"), Constraint.model_validate("output_throughput >= 100")]
    assert constraint_summary("completed", {"ttft_p99_ms": 150, "output_throughput": 120}, cs) == (True, -0.2)
    feasible, violation = constraint_summary("completed", {"ttft_p99_ms": 300, "output_throughput": 120}, cs)
    assert feasible is False and violation == pytest.approx(0.5)
    assert constraint_summary("completed", {"output_throughput": 120}, cs) == (False, 1.0)  # missing metric
    assert constraint_summary(TrialStatus.FAILED, {}, cs) == (False, None)
    assert constraint_summary("completed", {}, []) == (True, 0.0)  # no SLO: met, as the trials row says


# ------------------------------------------------------------------ requests
def _records() -> list[RequestRecord]:
    return [
        # streamed, no usage: output tokens = chunks
        RequestRecord(index=0, scheduled_s=0.0, sent_s=0.01, first_token_s=0.11, end_s=0.51,
                      token_times_s=[0.11, 0.21, 0.36, 0.51], expected_prompt_tokens=10, expected_output_tokens=4),
        # usage reported: tpot uses completion_tokens; ITL from chunks
        RequestRecord(index=1, scheduled_s=0.1, sent_s=0.1, first_token_s=0.3, end_s=1.0,
                      token_times_s=[0.3, 0.6, 1.0], prompt_tokens=12, completion_tokens=8,
                      expected_prompt_tokens=12, expected_output_tokens=8, prefix_group=3, level=2),
        # one token: no tpot, no itl
        RequestRecord(index=2, scheduled_s=0.2, sent_s=0.25, first_token_s=0.4, end_s=0.4, token_times_s=[0.4]),
        # failed before any token
        RequestRecord(index=3, scheduled_s=0.3, sent_s=0.3, error="HTTP 500", error_kind=RequestErrorKind.HTTP_STATUS),
        # never sent (client error)
        RequestRecord(index=4, scheduled_s=0.4, error="boom", error_kind=RequestErrorKind.CLIENT),
        # warm-up, failed mid-stream: ttft and itl exist, tpot does not
        RequestRecord(index=5, scheduled_s=0.5, sent_s=0.5, first_token_s=0.6, token_times_s=[0.6, 0.7],
                      error="reset", error_kind=RequestErrorKind.CONNECTION, warmup=True),
    ]


def _ms(x):
    return None if x is None else x * 1000.0


def test_requests_table_matches_record_properties():
    records = _records()
    t = requests_to_table(records, study="s", run_id="r1", trial_id="t1")
    assert t.schema == REQUESTS_SCHEMA
    rows = t.to_pylist()
    assert len(rows) == len(records)
    for r, row in zip(records, rows):
        assert row["schema_version"] == SCHEMA_VERSION
        assert (row["study"], row["run_id"], row["trial_id"]) == ("s", "r1", "t1")
        assert row["request_index"] == r.index and row["warmup"] == r.warmup and row["level"] == r.level
        assert row["prefix_group"] == r.prefix_group
        assert (row["scheduled_s"], row["sent_s"], row["first_token_s"], row["end_s"]) == (
            r.scheduled_s, r.sent_s, r.first_token_s, r.end_s)
        assert row["ttft_ms"] == _ms(r.ttft_s)
        assert row["e2el_ms"] == _ms(r.latency_s)
        assert row["tpot_ms"] == _ms(r.tpot_s)
        assert row["itl_ms"] == pytest.approx([x * 1000 for x in r.itl_s], rel=1e-6)
        assert len(row["itl_ms"]) == len(r.itl_s)
        assert row["prompt_tokens"] == r.prompt_tokens and row["completion_tokens"] == r.completion_tokens
        assert row["output_tokens"] == r.output_tokens
        assert row["expected_prompt_tokens"] == r.expected_prompt_tokens
        assert row["expected_output_tokens"] == r.expected_output_tokens
        assert row["success"] == r.success
        assert row["error"] == r.error
        assert row["error_kind"] == (r.error_kind.value if r.error_kind else None)
    # spot checks against hand-computed values
    assert rows[0]["ttft_ms"] == pytest.approx(100.0) and rows[0]["tpot_ms"] == pytest.approx(400 / 3)
    assert rows[0]["itl_ms"] == pytest.approx([100.0, 150.0, 150.0])
    assert rows[1]["tpot_ms"] == pytest.approx(700 / 7)  # (0.9 s - 0.2 s) / (8 - 1)
    assert rows[2]["tpot_ms"] is None and rows[2]["itl_ms"] == []
    assert rows[3]["ttft_ms"] is None and rows[3]["error_kind"] == "http_status"
    assert rows[5]["ttft_ms"] == pytest.approx(100.0) and rows[5]["tpot_ms"] is None
    assert rows[5]["itl_ms"] == pytest.approx([100.0])


def test_requests_table_empty():
    t = requests_to_table([], study="s", run_id="r", trial_id="t")
    assert t.num_rows == 0 and t.schema == REQUESTS_SCHEMA


def test_requests_table_is_fast_enough():
    n = 100_000
    records = [RequestRecord(index=i, scheduled_s=i * 0.01, sent_s=i * 0.01, first_token_s=i * 0.01 + 0.05,
                             end_s=i * 0.01 + 0.5, token_times_s=[i * 0.01 + 0.05 + k * 0.02 for k in range(20)])
               for i in range(n)]
    start = time.perf_counter()
    t = requests_to_table(records, study="s", run_id="r", trial_id="t")
    elapsed = time.perf_counter() - start
    assert t.num_rows == n
    assert elapsed < 10, elapsed
    itl = t.column("itl_ms")
    assert len(itl[n - 1].as_py()) == 19
    assert math.isclose(itl[n - 1].as_py()[0], 20.0, rel_tol=1e-4)
    assert t.column("tpot_ms")[0].as_py() == pytest.approx(records[0].tpot_s * 1000)


def test_started_at_epoch_and_timedelta_roundtrip():
    t = trial_row_to_table(base_row(started_at=T0.timestamp(), finished_at=T0 + timedelta(seconds=5),
                                    wall_time_s=5), trials_schema({}))
    row = t.to_pylist()[0]
    assert row["started_at"] == T0 and row["finished_at"] == T0 + timedelta(seconds=5)
