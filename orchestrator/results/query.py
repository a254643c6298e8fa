"""Read the results dataset into pandas, and pick the best trials.

The files need no project code (``pandas.read_parquet("<output>/<study>/trials")``
works); these helpers add what people keep rewriting: find the table under any of
``<output>``, ``<output>/<study>`` or the table directory itself, filter while
reading (partition pruning on ``date`` and ``run``), return partition columns as
plain strings, order trials by start time, and drop a stale copy of a rewritten
trial. ``path`` may be a local path or a pyarrow filesystem URI (``s3://``,
``gs://``, ``file://``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import date, datetime
from enum import Enum
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.results.pareto import ConstraintLike, _candidates, normalize_objectives, to_losses
from orchestrator.results.schema import REQUESTS_SCHEMA, TIMESTAMP, trials_schema

log = logging.getLogger(__name__)

TABLES = ("trials", "requests")
PARTITIONING = ds.partitioning(pa.schema([("date", pa.string()), ("run", pa.string())]), flavor="hive")

DateLike = Union[str, date, datetime, pd.Timestamp]


def resolve_location(path: Union[str, os.PathLike], filesystem: Optional[pafs.FileSystem] = None
                     ) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path inside it)`` for a local path or a URI (``s3://``, ``gs://``, ``file://``)."""
    text = os.fspath(path)
    if filesystem is not None:
        return filesystem, text.rstrip("/") or "/"
    if "://" in text:
        fs, inner = pafs.FileSystem.from_uri(text)
        return fs, inner.rstrip("/") or "/"
    return pafs.LocalFileSystem(), Path(text).expanduser().resolve().as_posix()


@dataclass(frozen=True)
class DataFile:
    """One data file of a table: ``<table>/date=<date>/run=<run>/<trial_id>.parquet``."""

    path: str
    date: str
    run: str
    trial_id: str


def _is_dir(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.Directory


def list_data_files(fs: pafs.FileSystem, table_dir: str) -> list[DataFile]:
    """Visible data files under a table directory (names starting with ``.`` or ``_`` skipped).

    Where one (run, trial) appears under two dates (a rewrite that crashed before
    removing the old copy) only the latest date is listed.
    """
    infos = fs.get_file_info(pafs.FileSelector(table_dir, recursive=True, allow_not_found=True))
    latest: dict[tuple[str, str], DataFile] = {}
    for info in infos:
        if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
            continue
        rel = info.path[len(table_dir):].strip("/").split("/")
        if any(part.startswith((".", "_")) for part in rel):
            continue
        if len(rel) != 3 or not rel[0].startswith("date=") or not rel[1].startswith("run="):
            continue
        f = DataFile(info.path, rel[0][len("date="):], rel[1][len("run="):], rel[2][: -len(".parquet")])
        key = (f.run, f.trial_id)
        if key not in latest or f.date > latest[key].date:
            latest[key] = f
    return sorted(latest.values(), key=lambda f: (f.date, f.run, f.trial_id))


def _table_dirs(fs: pafs.FileSystem, base: str, table: str, study: Optional[str]) -> list[str]:
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no results at {base!r}")
    name = base.rstrip("/").rsplit("/", 1)[-1]
    if name == table:
        return [base]
    if name in TABLES:  # the other table's directory: use its sibling
        sibling = base.rstrip("/").rsplit("/", 1)[0] + "/" + table
        return [sibling] if _is_dir(fs, sibling) else []
    if _is_dir(fs, f"{base}/{table}"):  # a study directory
        return [f"{base}/{table}"]
    if study is not None:  # the output directory, one study
        d = f"{base}/{study}/{table}"
        return [d] if _is_dir(fs, d) else []
    # The output directory: every study in it.
    children = fs.get_file_info(pafs.FileSelector(base, recursive=False))
    return sorted(f"{c.path}/{table}" for c in children
                  if c.type == pafs.FileType.Directory and not c.base_name.startswith((".", "_"))
                  and _is_dir(fs, f"{c.path}/{table}"))


_warned: set[str] = set()


def _skip_unreadable(path: str, error: BaseException) -> None:
    """One warning line per unreadable file and process (a truncated copy, an emptied file)."""
    if path not in _warned:
        _warned.add(path)
        reason = " ".join(str(error).split()) or type(error).__name__
        log.warning("skipped %s: not a readable Parquet file (%s)", path, reason)


def _read_files(fs: pafs.FileSystem, table_dir: str, files: list[DataFile],
                filter_expr: Optional[ds.Expression]) -> Optional[pa.Table]:
    """The files as one table; a file that cannot be read is skipped with a warning naming it
    (never changed: it may be the only copy of a measurement)."""
    paths, schemas = [], set()
    for f in files:
        try:
            with fs.open_input_file(f.path) as fh:
                schemas.add(pq.read_schema(fh))
        except (OSError, pa.ArrowException) as e:  # ArrowInvalid: truncated, empty, not Parquet
            _skip_unreadable(f.path, e)
            continue
        paths.append(f.path)
    if not paths:
        return None
    # Files of one study share a schema by construction; unify anyway, so that a
    # changed search space or a newer schema version never drops a column silently.
    unified = None
    if len(schemas) > 1:
        unified = pa.unify_schemas(list(schemas), promote_options="permissive")
        unified = unified.append(pa.field("date", pa.string())).append(pa.field("run", pa.string()))

    def read(selected: list[str]) -> pa.Table:
        return ds.dataset(selected, schema=unified, filesystem=fs, format="parquet", partitioning=PARTITIONING,
                          partition_base_dir=table_dir).to_table(filter=filter_expr)

    try:
        return read(paths)
    except (OSError, pa.ArrowException):  # a footer that reads but a damaged page: find the file(s)
        tables = []
        for path in paths:
            try:
                tables.append(read([path]))
            except (OSError, pa.ArrowException) as e:
                _skip_unreadable(path, e)
        return _concat(tables)


def _as_list(value: Union[str, Enum, Iterable, None]) -> Optional[list[str]]:
    if value is None:
        return None
    if isinstance(value, (str, Enum)):
        value = [value]
    return [v.value if isinstance(v, Enum) else str(v) for v in value]


def _utc(value: DateLike) -> pd.Timestamp:
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def empty_frame(schema: pa.Schema) -> pd.DataFrame:
    """An empty DataFrame with the columns (and partition columns) of a table schema."""
    schema = schema.append(pa.field("date", pa.string())).append(pa.field("run", pa.string()))
    return schema.empty_table().to_pandas()


def _and(a: Optional[ds.Expression], b: ds.Expression) -> ds.Expression:
    return b if a is None else a & b


def _concat(tables: list[pa.Table]) -> Optional[pa.Table]:
    tables = [t for t in tables if t is not None]
    if not tables:
        return None
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


def load_trials(path: Union[str, os.PathLike], study: Optional[str] = None, since: Optional[DateLike] = None,
                status: Union[str, Sequence[str], None] = None, run: Union[str, Sequence[str], None] = None,
                *, filesystem: Optional[pafs.FileSystem] = None) -> pd.DataFrame:
    """The trials table as a DataFrame, one row per trial, ordered by ``started_at``.

    ``path``: ``<output>`` (every study in it unless ``study`` is given),
    ``<output>/<study>`` or the ``trials`` directory. ``since``: a date, datetime or
    ISO string (naive means UTC); keeps trials started at or after it. ``status``
    and ``run``: one value or a list. ``date`` and ``run`` come back as plain
    string columns. A trial present twice (a crashed rewrite) appears once. A file that is
    not readable Parquet (truncated, empty) is skipped with a logged warning naming it.
    """
    fs, base = resolve_location(path, filesystem)
    expr: Optional[ds.Expression] = None
    if study is not None:
        expr = _and(expr, ds.field("study") == study)
    statuses = _as_list(status)
    if statuses is not None:
        expr = _and(expr, ds.field("status").isin(statuses))
    runs = _as_list(run)
    if runs is not None:
        expr = _and(expr, ds.field("run").isin(runs))
    if since is not None:
        t = _utc(since)
        expr = _and(expr, ds.field("date") >= t.date().isoformat())
        expr = _and(expr, ds.field("started_at") >= pa.scalar(t.to_pydatetime(), TIMESTAMP))
    tables = []
    for d in _table_dirs(fs, base, "trials", study):
        files = [f for f in list_data_files(fs, d) if runs is None or f.run in runs]
        tables.append(_read_files(fs, d, files, expr))
    table = _concat(tables)
    if table is None:
        return empty_frame(trials_schema({}))
    df = table.to_pandas()
    df = df.sort_values(["started_at", "trial_number"], kind="stable")
    df = df.drop_duplicates(["study", "run_id", "trial_id"], keep="last")
    return df.reset_index(drop=True)


def load_requests(path: Union[str, os.PathLike], study: Optional[str] = None,
                  trial_ids: Optional[Iterable[str]] = None, include_warmup: bool = False,
                  *, run: Union[str, Sequence[str], None] = None,
                  filesystem: Optional[pafs.FileSystem] = None) -> pd.DataFrame:
    """The per-request table as a DataFrame, ordered by run, trial and request index.

    ``path`` as for :func:`load_trials` (a ``trials`` directory means its sibling
    ``requests``). ``trial_ids`` selects files by name, so only those trials are
    read. Warm-up requests are dropped unless ``include_warmup``.
    """
    fs, base = resolve_location(path, filesystem)
    wanted = None if trial_ids is None else set(_as_list(trial_ids) or [])
    runs = _as_list(run)
    expr: Optional[ds.Expression] = None
    if study is not None:
        expr = _and(expr, ds.field("study") == study)
    if not include_warmup:
        expr = _and(expr, ds.field("warmup") == False)  # noqa: E712 (an Arrow expression)
    tables = []
    for d in _table_dirs(fs, base, "requests", study):
        files = [f for f in list_data_files(fs, d)
                 if (wanted is None or f.trial_id in wanted) and (runs is None or f.run in runs)]
        tables.append(_read_files(fs, d, files, expr))
    table = _concat(tables)
    if table is None:
        return empty_frame(REQUESTS_SCHEMA)
    df = table.to_pandas()
    df = df.sort_values(["run_id", "trial_id", "request_index"], kind="stable")
    return df.reset_index(drop=True)


def best_under_slos(df: pd.DataFrame, objective: str, direction: str,
                    constraints: Sequence[ConstraintLike] = ()) -> pd.DataFrame:
    """Completed rows that meet every constraint, best ``objective`` first.

    Rows with a missing objective value are dropped; ``.iloc[0]`` is the best trial
    (an empty frame when none qualifies). Ties keep their order in ``df``.
    """
    objs = normalize_objectives([(objective, direction)])
    cand, values = _candidates(df, objs, constraints)
    losses = to_losses(values, [direction])[:, 0]
    return cand.iloc[np.argsort(losses, kind="stable")]


# ------------------------------------------------------------------ questions users ask
# Pure functions over a trials DataFrame (what load_trials returns); see docs/querying.md.

def config_key(df: pd.DataFrame) -> pd.Series:
    """One string per row naming its configuration: the searched parameters as sorted JSON.

    Floats are written with 12 significant digits, so a configuration re-measured on
    another night (same parameters, maybe another trial id) has the same key.
    """
    import json

    def canonical(text: object) -> Optional[str]:
        if not isinstance(text, str):
            return None
        params = json.loads(text)
        return json.dumps({k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in params.items()},
                          sort_keys=True)

    if "params_json" not in df.columns:
        raise KeyError("no column 'params_json' in the trials frame")
    return df["params_json"].map(canonical).rename("config")


def best_per_gpu(df: pd.DataFrame, objective: str = "output_throughput_per_gpu", direction: Optional[str] = None,
                 constraints: Sequence[ConstraintLike] = ()) -> pd.DataFrame:
    """The best completed trial per GPU type that meets every constraint, one row per ``gpu``.

    ``direction`` defaults to the metric's natural one (higher is better for
    throughputs). GPU types where no trial qualifies are absent. The index is the GPU type.
    """
    (name, resolved), = normalize_objectives([objective if direction is None else (objective, direction)])
    if "gpu" not in df.columns:
        raise KeyError("no column 'gpu' in the trials frame")
    best = []
    for _, group in df.groupby("gpu", sort=True):
        ranked = best_under_slos(group, name, resolved, constraints)
        if len(ranked):
            best.append(ranked.iloc[0])
    if not best:
        return df.iloc[0:0].set_index("gpu")
    return pd.DataFrame(best).set_index("gpu")


def config_history(df: pd.DataFrame, config: Union[str, dict], metrics: Sequence[str] = (
        "output_throughput_per_gpu", "ttft_p99_ms", "tpot_p99_ms")) -> pd.DataFrame:
    """Every measurement of one configuration across runs (nights), oldest first.

    ``config``: a trial id (its configuration is looked up) or a dict of the searched
    parameters. Returns ``date``, ``run_id``, ``trial_id``, ``status`` and ``metrics``.
    """
    import json

    keys = config_key(df)
    if isinstance(config, str):
        match = df.index[df["trial_id"] == config]
        if len(match) == 0:
            raise KeyError(f"no trial {config!r} in the frame")
        wanted = keys.loc[match[0]]
    else:
        wanted = config_key(pd.DataFrame({"params_json": [json.dumps(config)]})).iloc[0]
    rows = df[keys == wanted]
    cols = [c for c in ("date", "run_id", "trial_id", "status") if c in df.columns]
    cols += [m for m in metrics if m in df.columns and m not in cols]
    return rows.sort_values("started_at", kind="stable")[cols].reset_index(drop=True)


def capacity_by_night(df: pd.DataFrame, metric: str = "output_throughput_per_gpu",
                      constraints: Sequence[ConstraintLike] = (), by: str = "date") -> pd.DataFrame:
    """A configuration-by-night table of ``metric`` for configurations measured on two or more nights.

    Rows: configurations (their parameters as JSON, see :func:`config_key`); columns:
    the values of ``by`` (``date`` or ``run``), oldest first; a cell is the best value
    that night among completed trials meeting ``constraints`` (NaN where none did).
    """
    from orchestrator.results.pareto import feasible_mask

    if by not in df.columns:
        raise KeyError(f"no column {by!r} in the trials frame")
    ok = df[feasible_mask(df, constraints)].copy()
    ok["config"] = config_key(ok)
    ok[metric] = pd.to_numeric(ok[metric], errors="coerce")
    (_, direction), = normalize_objectives([metric])
    agg = "max" if direction == "maximize" else "min"
    table = ok.pivot_table(index="config", columns=by, values=metric, aggfunc=agg)
    table = table[sorted(table.columns)]
    return table[table.notna().sum(axis=1) >= 2]


def param_importance(df: pd.DataFrame, objective: str, direction: Optional[str] = None, *,
                     params: Optional[Sequence[str]] = None, constraints: Sequence[ConstraintLike] = (),
                     space=None, evaluator=None) -> pd.Series:
    """Which parameter matters most for ``objective``: Optuna's importance, largest first (sums to 1).

    An Optuna study is rebuilt from the completed rows (meeting ``constraints``), with
    the objective as a loss (smaller is better), and handed to
    :func:`optuna.importance.get_param_importances`. The default evaluator is Optuna's
    PED-ANOVA (numpy only): how much each parameter matters for reaching the best
    ``target_quantile`` of trials, a quantile chosen so that about five trials are in it
    (between 10% and 50%). ``evaluator=optuna.importance.FanovaImportanceEvaluator()``
    works too where scikit-learn is installed. Parameter distributions come from
    ``space`` (a :class:`~orchestrator.space.SearchSpace`, e.g. ``study.space``) or,
    without it, from the values seen. Fixed parameters and parameters with one value
    are left out. Raises ``ValueError`` with fewer than two usable trials.
    """
    import json

    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    (name, resolved), = normalize_objectives([objective if direction is None else (objective, direction)])
    cand, values = _candidates(df, [(name, resolved)], constraints)
    trial_params = [json.loads(p) for p in cand["params_json"]]
    names = list(params) if params is not None else sorted({k for p in trial_params for k in p})

    def distribution(param: str):
        seen = [p[param] for p in trial_params if param in p]
        if space is not None:
            spec = space.params.get(param)
            kind = getattr(spec, "type", None)
            if kind == "int":
                return IntDistribution(spec.low, spec.high, log=spec.log, step=spec.step)
            if kind == "float":
                return FloatDistribution(spec.low, spec.high, log=spec.log, step=spec.step)
            if kind == "categorical":
                return CategoricalDistribution(spec.choices)
            return None  # fixed or unknown: nothing to attribute
        distinct = sorted(set(seen), key=repr)
        if len(distinct) < 2:
            return None
        if all(isinstance(v, int) and not isinstance(v, bool) for v in seen):
            return IntDistribution(min(seen), max(seen))
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
            return FloatDistribution(float(min(seen)), float(max(seen)))
        return CategoricalDistribution(distinct)

    dists = {n: d for n in names if (d := distribution(n)) is not None}
    if len(cand) < 2 or not dists:
        raise ValueError(f"parameter importance needs at least two completed trials with a varied parameter "
                         f"(got {len(cand)} trial(s), parameters: {sorted(dists) or 'none'})")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rebuilt = optuna.create_study(direction="minimize")
    for p, loss in zip(trial_params, to_losses(values, [resolved])[:, 0]):
        present = {k: v for k, v in p.items() if k in dists}
        rebuilt.add_trial(optuna.trial.create_trial(
            params=present, distributions={k: dists[k] for k in present}, value=float(loss)))
    if evaluator is None:
        quantile = min(0.5, max(0.1, 5 / len(cand)))
        evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    scores = optuna.importance.get_param_importances(rebuilt, evaluator=evaluator)
    return pd.Series(scores, name=f"importance for {resolved} {name}", dtype=float).sort_values(ascending=False)
