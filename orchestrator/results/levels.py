"""The ``levels`` table: one row per load level of a capacity search (a latency-throughput curve).

``<output>/<study>/levels/date=YYYY-MM-DD/run=<run_id>/<trial_id>.parquet``, beside
``trials/`` and ``requests/``, written by the same :class:`~orchestrator.results.store.ResultsStore`
call as its trial (atomic, replaced with it). The schema is fixed (no per-study
columns), so every file of every study concatenates:

* identity: ``schema_version``, ``study``, ``run_id``, ``trial_id``, ``level`` (0, 1, ...
  in the order measured; ``requests.level`` points here);
* the search: ``rate`` (the requested rate of the level: the rate its requests were sent
  at, which ``achieved_rate`` measures), ``planned_requests`` (of its first window),
  ``saturated``, ``saturated_at_s`` (seconds into the level), ``stopped_early`` (the
  level was cut short), ``slo_met`` (by the measured values), ``slo_decided`` (that
  verdict holds at ``confidence``: every SLO metric's interval lies on one side of its
  limit; an undecided level is measured again, up to ``capacity.repeats`` times, with
  fresh arrivals and prompts), ``windows`` (how many times it was measured; its metrics
  pool them), ``slo_violation`` (largest relative SLO excess, <= 0 when met),
  ``slo_failures`` (what failed, as text); null in files written before they existed;
* ``<metric>_low`` / ``<metric>_high`` of the level's SLO metrics
  (:mod:`orchestrator.measure.confidence`), null for the others;
* every load metric of :class:`orchestrator.measure.metrics.LoadMetrics` as float64;
* the engine's own numbers over the level (``engine_*``,
  :data:`orchestrator.measure.metrics.ENGINE_WINDOW_METRIC_NAMES`, float64, null where the
  engine exports none) and the level's ``harness_bound`` / ``harness_bound_reason``
  (:mod:`orchestrator.measure.harness`). Files written before these columns existed read
  them as null;
* the warm-up before the level (``warmup_s_used``, ``warmup_requests_used``,
  ``warmup_converged``, float64, :mod:`orchestrator.measure.warmup`): level 0's, the only one
  warmed up (the engine stays warm); 0, 0 and null on later levels; null in files
  written before these columns existed.

Sort by ``rate`` for the curve: ``load_levels(path).sort_values("rate")``.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs

from orchestrator.measure.confidence import INTERVAL_METRICS, interval_columns
from orchestrator.measure.metrics import ENGINE_WINDOW_METRIC_NAMES, LOAD_METRIC_NAMES, WARMUP_METRIC_NAMES
from orchestrator.results.query import ResultsPathError, _read_files, empty_frame, list_data_files, resolve_location
from orchestrator.results.schema import META_SCHEMA_VERSION, META_TABLE, SCHEMA_VERSION

__all__ = ["LEVELS_SCHEMA", "levels_to_table", "load_levels"]

_SEARCH_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("rate", pa.float64()),
    ("planned_requests", pa.int64()),
    ("saturated", pa.bool_()),
    ("saturated_at_s", pa.float64()),
    ("stopped_early", pa.bool_()),
    ("slo_met", pa.bool_()),
    ("slo_decided", pa.bool_()),
    ("windows", pa.int64()),
    ("confidence", pa.float64()),
    ("slo_violation", pa.float64()),
    ("slo_failures", pa.string()),
    # The point of the study's rate grid (every trial replays the same requests there: paired levels), and
    # whether the level contradicts another (met above a level that missed, or missed below one that met).
    ("grid_index", pa.int64()),
    ("contradicts", pa.bool_()),
)

_JUDGEMENT_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("harness_bound", pa.bool_()),
    ("harness_bound_reason", pa.string()),
)

LEVEL_INTERVAL_COLUMNS = tuple(interval_columns(m for m in INTERVAL_METRICS if m in LOAD_METRIC_NAMES))

LEVELS_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("study", pa.string(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_id", pa.string(), nullable=False),
        pa.field("level", pa.int64(), nullable=False),
    ]
    + [pa.field(n, t) for n, t in _SEARCH_COLUMNS]
    + [pa.field(m, pa.float64()) for m in LOAD_METRIC_NAMES + ENGINE_WINDOW_METRIC_NAMES + WARMUP_METRIC_NAMES]
    + [pa.field(n, t) for n, t in _JUDGEMENT_COLUMNS]
    + [pa.field(c, pa.float64()) for c in LEVEL_INTERVAL_COLUMNS],
    metadata={META_SCHEMA_VERSION: str(SCHEMA_VERSION), META_TABLE: "levels"},
)
_ROW_KEYS = (set(LEVEL_INTERVAL_COLUMNS) | {n for n, _ in _SEARCH_COLUMNS} | set(LOAD_METRIC_NAMES) | set(ENGINE_WINDOW_METRIC_NAMES)
             | set(WARMUP_METRIC_NAMES) | {n for n, _ in _JUDGEMENT_COLUMNS} | {"level"})


def levels_to_table(rows: Sequence[Mapping[str, Any]], *, study: str, run_id: str, trial_id: str) -> pa.Table:
    """Level rows (``LevelResult.row()``) as a :data:`LEVELS_SCHEMA` table; unknown keys raise ValueError."""
    for row in rows:
        unknown = sorted(set(row) - _ROW_KEYS)
        if unknown:
            raise ValueError(f"unknown levels-table keys: {', '.join(unknown)}")
    n = len(rows)
    columns: dict[str, pa.Array] = {
        "schema_version": pa.array([SCHEMA_VERSION] * n, type=pa.int32()),
        "study": pa.array([study] * n, type=pa.string()),
        "run_id": pa.array([run_id] * n, type=pa.string()),
        "trial_id": pa.array([trial_id] * n, type=pa.string()),
    }
    for f in LEVELS_SCHEMA:
        if f.name in columns:
            continue
        values = [row.get(f.name) for row in rows]
        if pa.types.is_floating(f.type):
            values = [None if v is None else float(v) for v in values]
        elif pa.types.is_integer(f.type):
            values = [None if v is None else int(v) for v in values]
        columns[f.name] = pa.array(values, type=f.type)
    return pa.Table.from_pydict(columns, schema=LEVELS_SCHEMA)


def load_levels(path: Union[str, os.PathLike], trial_ids: Optional[Iterable[str]] = None, *,
                filesystem: Optional[pafs.FileSystem] = None) -> pd.DataFrame:
    """Every level row under ``path`` (``<output>/<study>`` or its ``levels`` directory), by trial and level.

    A file that cannot be read, or whose column cannot be merged, is skipped with a warning naming
    it (as :func:`orchestrator.results.query.load_trials` does); every column of
    :data:`LEVELS_SCHEMA` is there (null where a file lacks it)."""
    fs, base = resolve_location(path, filesystem)
    table_dir = base if base.rstrip("/").endswith("/levels") else f"{base.rstrip('/')}/levels"
    if fs.get_file_info(table_dir).type == pafs.FileType.File:
        raise ResultsPathError(f"{table_dir}: a file where the levels folder belongs; move it away (the data "
                               "files of the levels table live in that folder)")
    files = list_data_files(fs, table_dir)
    if trial_ids is not None:
        wanted = set(trial_ids)
        files = [f for f in files if f.trial_id in wanted]
    table = _read_files(fs, table_dir, files, None, expected=LEVELS_SCHEMA, required=LEVELS_SCHEMA.names) \
        if files else None
    if table is None:
        return empty_frame(LEVELS_SCHEMA)
    return table.to_pandas().sort_values(["trial_id", "level"], kind="stable").reset_index(drop=True)


# Marks of a level that is not the engine's own speed (a queue, aborts, the client), shared by the
# simulator's fit and the measured replay.
QUEUED_TTFT_RATIO = 3.0  # TTFT p50 above this many times the configuration's lowest: queue-dominated


def is_set(value) -> bool:
    """A boolean column's value; missing (None / NaN) is False."""
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and bool(value)


def level_mark(lv, low_ttft_ms: float) -> tuple[Optional[str], str]:
    """The point's mark from the real level's own columns (module docstring); ``low_ttft_ms``:
    the lowest TTFT p50 among the configuration's levels that ran to the end."""
    if is_set(lv.get("stopped_early")):
        return "aborted", f"stopped early, {int(lv.get('failed_aborted') or 0)} requests aborted"
    if is_set(lv.get("saturated")):
        return "overloaded", "saturation detector fired"
    ratio = float(lv["ttft_p50_ms"]) / low_ttft_ms
    if ratio > QUEUED_TTFT_RATIO:
        return "overloaded", f"TTFT p50 {ratio:.1f}x the configuration's lowest ({low_ttft_ms:.0f} ms): queued"
    if is_set(lv.get("harness_bound")):
        return "harness-bound", str(lv.get("harness_bound_reason") or "harness_bound")
    return None, ""
