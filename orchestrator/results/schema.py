"""The Arrow schemas of the results dataset: one trials row per trial, one requests row per request.

Both tables carry ``schema_version``. The trials table puts configuration, metrics and
environment in one flat row so that ``pandas.read_parquet``, ``pyarrow.dataset``,
DuckDB and Polars read it with no project code:

* identity and outcome: study, fingerprint, run, trial, ``measurement`` (0, or k > 0 for
  a configuration measured again by racing, with a workload seed of its own), status,
  failure, times;
* where it ran: engine, engine mode, model, GPU type and count;
* feasibility: ``feasible`` (completed and every constraint met) and the largest
  constraint violation (:meth:`orchestrator.study.spec.Constraint.violation`);
* one column per search-space parameter, named as the parameter (null when the
  parameter was inactive in that trial), then the same parameters and the resolved
  engine arguments as JSON;
* every metric of :func:`orchestrator.measure.metrics.known_metric_names` as float64
  (``gpus`` is the exception: it is the int64 column of the "where it ran" group);
* ``<metric>_low`` / ``<metric>_high`` for every metric with an interval
  (:data:`orchestrator.measure.confidence.INTERVAL_METRICS`: latencies, throughputs, the capacity
  bracket and what is derived from them per GPU and per dollar) and ``confidence``, the
  level those intervals hold at; null where a metric has none, and in files written
  before they existed;
* ``harness_bound`` (bool) and ``harness_bound_reason``: whether the serving path or
  the client, not the engine, limited the measurement (:mod:`orchestrator.measure.harness`);
* ``start_compile_cached`` (bool): whether the engine's start loaded torch.compile's graphs from its cache;
* ``extra_json`` for anything else.

Rows are built through :func:`trial_row_to_table`, which rejects unknown keys and
coerces values to the column types, so that every file of one study has exactly
the same schema and the files concatenate.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from enum import Enum
from itertools import chain
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from orchestrator.failures import TrialStatus
from orchestrator.measure.confidence import interval_columns
from orchestrator.measure.metrics import known_metric_names
from orchestrator.measure.records import RequestRecord
from orchestrator.study.judge import judge_against

SCHEMA_VERSION = 1

# Keys of the Arrow schema metadata (bytes on disk).
META_SCHEMA_VERSION = "orchestrator.schema_version"
META_TABLE = "orchestrator.table"
META_PARAMS = "orchestrator.param_types"
META_PREDICTED = "orchestrator.predicted_metrics"

TIMESTAMP = pa.timestamp("us", tz="UTC")
PARAM_ARROW_TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "string": pa.string(),
}

# Columns a trial row must have (non-nullable in the schema).
REQUIRED_TRIAL_COLUMNS = ("schema_version", "study", "study_fingerprint", "run_id", "trial_id",
                          "trial_number", "status", "started_at")

_HEAD: tuple[tuple[str, pa.DataType], ...] = (
    ("schema_version", pa.int32()),
    ("study", pa.string()),
    ("study_fingerprint", pa.string()),
    ("run_id", pa.string()),
    ("trial_id", pa.string()),
    ("trial_number", pa.int64()),
    ("measurement", pa.int64()),  # of its configuration: 0 first, k > 0 measured again (racing)
    ("status", pa.string()),
    ("failure_kind", pa.string()),
    ("failure_message", pa.string()),
    ("started_at", TIMESTAMP),
    ("finished_at", TIMESTAMP),
    ("wall_time_s", pa.float64()),
    ("engine", pa.string()),
    ("engine_mode", pa.string()),
    ("ingress", pa.string()),  # vllm engine: engine (vLLM's own server) or serve_llm (ray.serve.llm's app)
    ("model", pa.string()),
    ("gpu", pa.string()),
    ("gpus", pa.int64()),
    ("fidelity", pa.string()),  # real: measured on the engine; sim: the simulator's numbers
    ("feasible", pa.bool_()),
    ("constraint_violation", pa.float64()),
)
_CONFIG: tuple[tuple[str, pa.DataType], ...] = (
    ("params_json", pa.string()),
    ("engine_args_json", pa.string()),
    ("vllm_command", pa.string()),
    ("workload_json", pa.string()),
    ("slo_json", pa.string()),
    ("versions_json", pa.string()),
    ("host", pa.string()),
    # Where the engine's start-to-start noise in the intervals comes from (a prior, the study's own, none).
    ("start_noise", pa.string()),
    # The bootstrap draws comparisons pair (orchestrator.results.paired): {"seed", "metrics": {name: [...]}}.
    ("draws_json", pa.string()),
)
# Judgements over the metrics (after the metric columns).
_JUDGEMENTS: tuple[tuple[str, pa.DataType], ...] = (
    ("harness_bound", pa.bool_()),
    ("harness_bound_reason", pa.string()),
    # False: the capacity is ill-conditioned (its binding SLO margin hardly grows with the rate near the
    # limit, compared with its noise): compare such a configuration by its margins at common rates.
    ("capacity_conditioned", pa.bool_()),
    ("capacity_binding", pa.string()),  # the SLO metric whose margin crosses zero first
)
# The engine's start (orchestrator.engines.vllm.start_log): True when torch.compile's graphs all came from
# the compile cache, False when one was compiled, null without torch.compile.
_START: tuple[tuple[str, pa.DataType], ...] = (("start_compile_cached", pa.bool_()),)
# The reference-agreement probe (orchestrator.trial.probe): what its reference is (dummy weights, real
# weights, an endpoint) and which trial's answers it was compared with (null: no baseline yet).
_PROBE: tuple[tuple[str, pa.DataType], ...] = (
    ("probe_reference", pa.string()),
    ("probe_baseline", pa.string()),
)
FIXED_TRIAL_COLUMNS: tuple[str, ...] = (tuple(n for n, _ in _HEAD + _CONFIG + _JUDGEMENTS + _START + _PROBE)
                                         + ("extra_json",))
# Partition keys of the dataset layout; no row column may use these names.
PARTITION_COLUMNS = ("date", "run")


def metric_columns() -> list[str]:
    """Metric columns of the trials table, in order (``gpus`` lives among the fixed columns)."""
    fixed = set(FIXED_TRIAL_COLUMNS)
    return [m for m in known_metric_names() if m not in fixed]


# Where each metric's true value lies (orchestrator.measure.confidence), after the metric columns.
INTERVAL_COLUMNS: tuple[str, ...] = tuple(interval_columns()) + ("confidence",)


def prediction_columns(metrics: Sequence[str]) -> list[str]:
    """``search.fidelity: sim``: the simulator's prediction, its stated error (where the measurement
    should fall) and its relative error, per metric."""
    return [c for m in metrics
            for c in (f"predicted_{m}", f"predicted_{m}_low", f"predicted_{m}_high", f"prediction_error_{m}")]


def trials_schema(param_types: Mapping[str, str], predicted: Sequence[str] = ()) -> pa.Schema:
    """The trials-table schema for a search space (``SearchSpace.column_types()``), with
    :func:`prediction_columns` for the ``predicted`` metrics."""
    reserved = set(FIXED_TRIAL_COLUMNS) | set(known_metric_names()) | set(PARTITION_COLUMNS) | set(INTERVAL_COLUMNS)
    clash = sorted(set(param_types) & reserved)
    if clash:
        raise ValueError(f"parameter names clash with trials-table columns: {', '.join(clash)}")
    bad = {k: v for k, v in param_types.items() if v not in PARAM_ARROW_TYPES}
    if bad:
        raise ValueError(f"unknown parameter column types {bad}; allowed: {', '.join(PARAM_ARROW_TYPES)}")
    fields = [pa.field(n, t, nullable=n not in REQUIRED_TRIAL_COLUMNS) for n, t in _HEAD]
    fields += [pa.field(name, PARAM_ARROW_TYPES[kind]) for name, kind in param_types.items()]
    fields += [pa.field(n, t) for n, t in _CONFIG]
    fields += [pa.field(m, pa.float64()) for m in metric_columns()]
    fields += [pa.field(c, pa.float64()) for c in INTERVAL_COLUMNS]
    fields += [pa.field(c, pa.float64()) for c in prediction_columns(predicted)]
    fields += [pa.field(n, t) for n, t in _JUDGEMENTS + _START + _PROBE]
    fields.append(pa.field("extra_json", pa.string()))
    meta = {META_SCHEMA_VERSION: str(SCHEMA_VERSION), META_TABLE: "trials",
            META_PARAMS: json.dumps(dict(param_types))}
    if predicted:
        meta[META_PREDICTED] = json.dumps(list(predicted))
    return pa.schema(fields, metadata=meta)


def param_types_of(schema: pa.Schema) -> dict[str, str]:
    """The ``param_types`` a trials schema was built from (from its metadata)."""
    raw = (schema.metadata or {}).get(META_PARAMS.encode())
    return json.loads(raw) if raw else {}


# ------------------------------------------------------------------ value coercion
def _is_missing(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def _to_int(name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    raise ValueError(f"column {name!r}: expected an integer, got {value!r}")


def _to_float(name: str, value: Any) -> Optional[float]:
    if isinstance(value, (bool, np.bool_, int, np.integer, float, np.floating)):
        f = float(value)
        return None if math.isnan(f) else f
    raise ValueError(f"column {name!r}: expected a number, got {value!r}")


def _to_bool(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"column {name!r}: expected a boolean, got {value!r}")


def _to_timestamp(name: str, value: Any) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"column {name!r}: not an ISO-8601 time: {value!r}") from None
    elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"column {name!r}: a time zone is required (use UTC), got naive {value!r}")
        return value.astimezone(timezone.utc)
    raise ValueError(f"column {name!r}: expected a timezone-aware datetime, got {value!r}")


def _to_str(name: str, value: Any, *, json_column: bool) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, str):
        return value
    if json_column:
        return json.dumps(value, sort_keys=True, default=str)
    raise ValueError(f"column {name!r}: expected a string, got {value!r}")


def _param_to_str(value: Any) -> str:
    return str(value.value) if isinstance(value, Enum) else str(value)


def _coerce(field: pa.Field, value: Any, *, is_param: bool) -> Any:
    if _is_missing(value):
        return None
    t = field.type
    if pa.types.is_timestamp(t):
        return _to_timestamp(field.name, value)
    if pa.types.is_boolean(t):
        return _to_bool(field.name, value)
    if pa.types.is_integer(t):
        return _to_int(field.name, value)
    if pa.types.is_floating(t):
        return _to_float(field.name, value)
    if pa.types.is_string(t):
        if is_param:
            return _param_to_str(value)
        return _to_str(field.name, value, json_column=field.name.endswith("_json"))
    raise TypeError(f"column {field.name!r}: unsupported type {t}")  # pragma: no cover


def trial_row_to_table(row: Mapping[str, Any], schema: pa.Schema) -> pa.Table:
    """One trials row as a one-row table of ``schema``.

    Unknown keys raise :class:`ValueError` naming them; missing optional keys become
    null; required keys (:data:`REQUIRED_TRIAL_COLUMNS`, but ``schema_version``,
    which defaults to :data:`SCHEMA_VERSION`) must be present. Numbers and booleans
    are coerced to the column type (an integral float to int, a bool to 0/1, ...),
    a string parameter column stores ``str(value)``, a ``*_json`` column serialises
    a non-string value as JSON, enums store their value, NaN becomes null, and
    times must be timezone-aware (stored as UTC microseconds).
    """
    names = set(schema.names)
    unknown = sorted(k for k in row if k not in names)
    if unknown:
        raise ValueError(f"unknown trials-table keys: {', '.join(unknown)}")
    row = dict(row)
    row.setdefault("schema_version", SCHEMA_VERSION)
    if row["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"schema_version {row['schema_version']!r} != {SCHEMA_VERSION} (this code's version)")
    missing = [k for k in REQUIRED_TRIAL_COLUMNS if k in names and _is_missing(row.get(k))]
    if missing:
        raise ValueError(f"missing required trials-table keys: {', '.join(missing)}")
    status = row["status"]
    status = status.value if isinstance(status, Enum) else status
    if status not in {s.value for s in TrialStatus}:
        raise ValueError(f"column 'status': {status!r} is not one of {', '.join(s.value for s in TrialStatus)}")
    params = set(param_types_of(schema))
    arrays = []
    for field in schema:
        value = _coerce(field, row.get(field.name), is_param=field.name in params)
        arrays.append(pa.array([value], type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def constraint_summary(status: Any, metrics: Mapping[str, Any],
                       constraints: Sequence[Any]) -> tuple[Optional[bool], Optional[float]]:
    """``(feasible, constraint_violation)`` for a trials row, as :mod:`orchestrator.study.judge` decides.

    ``feasible``: the trial completed and every constraint is met. The violation is the
    largest constraint margin (<= 0 when all are met, 0 without constraints); None when
    the trial did not complete.
    """
    verdict = judge_against((), constraints, metrics, status)
    return verdict.feasible, verdict.constraint_violation


# ------------------------------------------------------------------ requests
REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("study", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_id", pa.string(), nullable=False),
        pa.field("request_index", pa.int64(), nullable=False),
        pa.field("warmup", pa.bool_(), nullable=False),
        pa.field("level", pa.int64(), nullable=False),
        pa.field("window", pa.int64()),  # of its level (0: the first; null in files written before)
        pa.field("prefix_group", pa.int64()),
        pa.field("session", pa.int64()),  # multi-turn: the session and its turn (1-based); null otherwise
        pa.field("turn", pa.int64()),
        pa.field("expected_cached_tokens", pa.int64()),  # multi-turn: the previous turn's prompt tokens
        pa.field("scheduled_s", pa.float64()),
        pa.field("sent_s", pa.float64()),
        pa.field("first_token_s", pa.float64()),
        pa.field("end_s", pa.float64()),
        pa.field("ttft_ms", pa.float64()),
        pa.field("tpot_ms", pa.float64()),
        pa.field("e2el_ms", pa.float64()),
        pa.field("itl_ms", pa.list_(pa.float32())),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64(), nullable=False),
        pa.field("expected_prompt_tokens", pa.int64(), nullable=False),
        pa.field("expected_output_tokens", pa.int64(), nullable=False),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("error_kind", pa.string()),
        pa.field("error", pa.string()),
    ],
    metadata={META_SCHEMA_VERSION: str(SCHEMA_VERSION), META_TABLE: "requests"},
)


def _opt_floats(values: Iterable[Optional[float]]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _nullable(arr: np.ndarray, type_: pa.DataType) -> pa.Array:
    return pa.array(arr, type=type_, from_pandas=True)  # NaN -> null


def requests_to_table(records: Sequence[RequestRecord], *, study: str, run_id: str, trial_id: str) -> pa.Table:
    """Request records as a :data:`REQUESTS_SCHEMA` table (column-wise, no per-row dicts).

    ``ttft_ms``, ``tpot_ms``, ``e2el_ms``, ``itl_ms`` and ``output_tokens`` are the record's
    own ``ttft_s``, ``tpot_s``, ``latency_s``, ``itl_s`` and ``output_tokens`` (the one
    definition of each), in milliseconds; null where the property is None.
    """
    n = len(records)
    sent = _opt_floats(r.sent_s for r in records)
    first = _opt_floats(r.first_token_s for r in records)
    end = _opt_floats(r.end_s for r in records)
    success = np.fromiter((r.success for r in records), dtype=bool, count=n)
    completion = [r.completion_tokens for r in records]
    output_tokens = np.fromiter((r.output_tokens for r in records), dtype=np.int64, count=n)
    ttft_s = _opt_floats(r.ttft_s for r in records)
    tpot_s = _opt_floats(r.tpot_s for r in records)
    latency_s = _opt_floats(r.latency_s for r in records)

    itl_lengths = np.fromiter((max(len(r.token_times_s) - 1, 0) for r in records), dtype=np.int32, count=n)
    itl_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(itl_lengths, out=itl_offsets[1:])
    itl = np.fromiter(chain.from_iterable(r.itl_s for r in records), dtype=np.float64, count=int(itl_offsets[-1]))
    itl_list = pa.ListArray.from_arrays(pa.array(itl_offsets), pa.array((itl * 1000.0).astype(np.float32),
                                                                        type=pa.float32()))

    def opt_ints(values: Iterable[Optional[int]]) -> pa.Array:
        return pa.array(list(values), type=pa.int64())

    columns = {
        "schema_version": pa.array(np.full(n, SCHEMA_VERSION, dtype=np.int32)),
        "study": pa.array([study] * n, type=pa.string()),
        "run_id": pa.array([run_id] * n, type=pa.string()),
        "trial_id": pa.array([trial_id] * n, type=pa.string()),
        "request_index": pa.array(np.fromiter((r.index for r in records), dtype=np.int64, count=n)),
        "warmup": pa.array(np.fromiter((r.warmup for r in records), dtype=bool, count=n)),
        "level": pa.array(np.fromiter((r.level for r in records), dtype=np.int64, count=n)),
        "window": pa.array(np.fromiter((r.window for r in records), dtype=np.int64, count=n)),
        "prefix_group": opt_ints(r.prefix_group for r in records),
        "session": opt_ints(r.session for r in records),
        "turn": opt_ints(r.turn if r.session is not None else None for r in records),
        "expected_cached_tokens": opt_ints(r.expected_cached_tokens if r.session is not None else None
                                           for r in records),
        "scheduled_s": _nullable(_opt_floats(r.scheduled_s for r in records), pa.float64()),
        "sent_s": _nullable(sent, pa.float64()),
        "first_token_s": _nullable(first, pa.float64()),
        "end_s": _nullable(end, pa.float64()),
        "ttft_ms": _nullable(ttft_s * 1000.0, pa.float64()),
        "tpot_ms": _nullable(tpot_s * 1000.0, pa.float64()),
        "e2el_ms": _nullable(latency_s * 1000.0, pa.float64()),
        "itl_ms": itl_list,
        "prompt_tokens": opt_ints(r.prompt_tokens for r in records),
        "completion_tokens": pa.array(completion, type=pa.int64()),
        "output_tokens": pa.array(output_tokens),
        "expected_prompt_tokens": pa.array(np.fromiter((r.expected_prompt_tokens for r in records),
                                                       dtype=np.int64, count=n)),
        "expected_output_tokens": pa.array(np.fromiter((r.expected_output_tokens for r in records),
                                                       dtype=np.int64, count=n)),
        "success": pa.array(success),
        "error_kind": pa.array([None if r.error_kind is None else _to_str("error_kind", r.error_kind, json_column=False)
                                for r in records], type=pa.string()),
        "error": pa.array([r.error for r in records], type=pa.string()),
    }
    return pa.Table.from_arrays([columns[f.name] for f in REQUESTS_SCHEMA], schema=REQUESTS_SCHEMA)

