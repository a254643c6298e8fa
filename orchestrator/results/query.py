"""Read the results dataset into pandas.

The files need no project code (``pandas.read_parquet("<output>/<study>/trials")``
works); these helpers add what people keep rewriting: find the table under any of
``<output>``, ``<output>/<study>`` or the table directory itself, filter while
reading (partition pruning on ``date`` and ``run``), return partition columns as
plain strings, order trials by start time, and drop a stale copy of a rewritten
trial. ``path`` may be a local path or a pyarrow filesystem URI (``s3://``,
``gs://``, ``file://``). The questions asked of the frames (best trials, history,
importance) are in :mod:`orchestrator.results.analysis`.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime
from enum import Enum
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.results.schema import REQUESTS_SCHEMA, REQUIRED_TRIAL_COLUMNS, TIMESTAMP, trials_schema

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
        try:
            fs, inner = pafs.FileSystem.from_uri(text)
        except (OSError, pa.ArrowException) as e:  # s3:// without a bucket, an unknown scheme
            raise ResultsPathError(f"{text}: not a location pyarrow can open ({' '.join(str(e).split())})") from None
        return fs, inner.rstrip("/") or "/"
    return pafs.LocalFileSystem(), Path(text).expanduser().resolve().as_posix()


@dataclass(frozen=True)
class DataFile:
    """One data file of a table: ``<table>/date=<date>/run=<run>/<trial_id>.parquet``."""

    path: str
    date: str
    run: str
    trial_id: str


class ResultsPathError(Exception):
    """A results location that cannot be used: a file where a folder belongs (or the reverse), a
    read-only folder to write in. ``str(e)`` is one line naming the path and what to do."""


def cannot_write(where: str, error: BaseException, option: str) -> ResultsPathError:
    """The one line for a folder that could not be written (read-only, a file in the way, no bucket)."""
    why = " ".join(str(error).split()) or type(error).__name__
    read_only = getattr(error, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM)
    return ResultsPathError(f"{where}: cannot write there ({why}); "
                            + ("the folder is read-only: " if read_only else "") + f"name another with {option}")


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
        rel = info.path[len(table_dir):].strip("/").split("/")
        if any(part.startswith((".", "_")) for part in rel):
            continue
        laid_out = len(rel) == 3 and rel[0].startswith("date=") and rel[1].startswith("run=") \
            and info.base_name.endswith(".parquet")
        if info.type == pafs.FileType.File and not laid_out:  # a partition folder that is a file, a stray copy
            _warn_once(info.path, "skipped %s: not in the table's layout (date=<day>/run=<run id>/<trial>.parquet)",
                       info.path)
            continue
        if not laid_out:
            continue
        if info.type != pafs.FileType.File:
            _warn_once(info.path, "skipped %s: a folder where a data file belongs", info.path)
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
    if info.type != pafs.FileType.Directory:
        raise ResultsPathError(f"{base}: a file, not a results folder; name the study's folder (<output>/<study>)")
    if name == table:
        return [base]
    inside = fs.get_file_info(f"{base}/{table}")
    if inside.type not in (pafs.FileType.Directory, pafs.FileType.NotFound):
        raise ResultsPathError(f"{inside.path}: a file where the {table} folder belongs; move it away (the data "
                               f"files of the {table} table live in that folder)")
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


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _skip_unreadable(path: str, error: BaseException) -> None:
    """One warning line per unreadable file and process (a truncated copy, an emptied file)."""
    reason = " ".join(str(error).split()) or type(error).__name__
    _warn_once(path, "skipped %s: not a readable Parquet file (%s)", path, reason)


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def column_conflict(schema: pa.Schema, want: dict[str, pa.DataType]) -> Optional[tuple[str, pa.DataType, pa.DataType]]:
    """The first column of ``schema`` that cannot be read as the type ``want`` gives it (a string
    where a number belongs): ``(name, its type, the type wanted)``; None when every column merges."""
    for f in schema:
        target = want.get(f.name)
        if target is None or _plain(f.type).equals(_plain(target)):
            continue
        try:
            pa.unify_schemas([pa.schema([pa.field(f.name, _plain(target))]), pa.schema([f.with_type(_plain(f.type))])],
                             promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return f.name, f.type, target
    return None


def _wanted_types(schemas: list[pa.Schema], expected: Optional[pa.Schema]) -> dict[str, pa.DataType]:
    """Each column's type: the table's own where its schema fixes it, else the one most files have
    (an all-null column does not vote; ties go to the earlier file)."""
    counts: dict[str, Counter] = {}
    types: dict[tuple[str, str], pa.DataType] = {}
    for s in schemas:
        for f in s:
            t = _plain(f.type)
            counts.setdefault(f.name, Counter())[str(t)] += 0 if pa.types.is_null(t) else 1
            types.setdefault((f.name, str(t)), t)
    want = {name: types[(name, c.most_common(1)[0][0])] for name, c in counts.items()}
    if expected is not None:
        want.update({f.name: f.type for f in expected if f.name in want})
    return want


def _read_files(fs: pafs.FileSystem, table_dir: str, files: list[DataFile],
                filter_expr: Optional[ds.Expression], expected: Optional[pa.Schema] = None,
                required: Sequence[str] = ()) -> Optional[pa.Table]:
    """The files as one table; a file that cannot be read, or whose column cannot be merged with
    the others (a string where a number belongs), is skipped with a warning naming it (never
    changed: it may be the only copy of a measurement). ``expected``: the table's own column
    types; ``required``: its columns that are always there (null where a file lacks them)."""
    paths, schemas = [], []
    for f in files:
        try:
            with fs.open_input_file(f.path) as fh:
                schemas.append(pq.read_schema(fh))
        except (OSError, pa.ArrowException) as e:  # ArrowInvalid: truncated, empty, not Parquet
            _skip_unreadable(f.path, e)
            continue
        paths.append(f.path)
    if not paths:
        return None
    want = _wanted_types(schemas, expected)
    kept = []
    for path, schema in zip(paths, schemas):
        clash = column_conflict(schema, want)
        if clash is None:
            kept.append((path, schema))
        else:
            _warn_once(path, "skipped %s: column %r is %s where %s belongs (a damaged or hand-edited file; "
                       "left as it is)", path, clash[0], clash[1], clash[2])
    if not kept:
        return None
    paths = [p for p, _ in kept]
    # Files of one study share a schema by construction; unify anyway, so that a
    # changed search space or a newer schema version never drops a column silently.
    unified = None
    distinct = {s for _, s in kept}
    present = {n for s in distinct for n in s.names}
    missing = [expected.field(n).with_nullable(True) for n in required if expected is not None and n not in present]
    if len(distinct) > 1 or missing:
        try:
            unified = pa.unify_schemas(list(distinct), promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # promotions that do not chain: every file cast to one type
            unified = pa.schema([pa.field(n, want[n]) for n in dict.fromkeys(n for s in distinct for n in s.names)])
        for f in missing:
            unified = unified.append(f)
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


_REQUEST_KEYS = ("study", "run_id", "trial_id", "request_index", "warmup", "level")
NO_STATUS = "no status"  # how commands count a row whose status is missing


def _warn_without_status(df: pd.DataFrame) -> None:
    """Rows without a status (a damaged or hand-edited file) are kept and named, never dropped silently."""
    lost = df[df["status"].isna()]
    if len(lost):
        ids = ", ".join(str(t) for t in lost["trial_id"].fillna("?").head(5)) + (" ..." if len(lost) > 5 else "")
        _warn_once("status:" + ids, "%d trial(s) without a status (a damaged or hand-edited file): %s; counted "
                   "as '%s', never as completed", len(lost), ids, NO_STATUS)


def study_dirs(path: Union[str, os.PathLike]) -> list[Path]:
    """A local study result folder (it holds ``trials``), or the study folders inside a folder of several."""
    path = Path(path)
    if (path / "trials").is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if (p / "trials").is_dir())


def load_trials(path: Union[str, os.PathLike], study: Optional[str] = None, since: Optional[DateLike] = None,
                status: Union[str, Sequence[str], None] = None, run: Union[str, Sequence[str], None] = None,
                *, filesystem: Optional[pafs.FileSystem] = None) -> pd.DataFrame:
    """The trials table as a DataFrame, one row per trial, ordered by ``started_at``.

    ``path``: ``<output>`` (every study in it unless ``study`` is given),
    ``<output>/<study>`` or the ``trials`` directory. ``since``: a date, datetime or
    ISO string (naive means UTC); keeps trials started at or after it. ``status``
    and ``run``: one value or a list. ``date`` and ``run`` come back as plain
    string columns. A trial present twice (a crashed rewrite) appears once. A file that is
    not readable Parquet (truncated, empty), or whose column cannot be merged with the
    others' (a string where a number belongs), is skipped with a logged warning naming it;
    a row without a status is kept, with a warning naming it.
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
        tables.append(_read_files(fs, d, files, expr, expected=trials_schema({}), required=REQUIRED_TRIAL_COLUMNS))
    table = _concat(tables)
    if table is None:
        return empty_frame(trials_schema({}))
    df = table.to_pandas()
    df["run_id"] = df["run_id"].fillna(df["run"])  # a damaged row: its partition names the run
    _warn_without_status(df)
    df = df.sort_values(["started_at", "trial_number"], kind="stable")
    # A row without ids (a damaged file) is no copy of another.
    df = df[~(df.duplicated(["study", "run_id", "trial_id"], keep="last") & df["trial_id"].notna())]
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
        tables.append(_read_files(fs, d, files, expr, expected=REQUESTS_SCHEMA, required=_REQUEST_KEYS))
    table = _concat(tables)
    if table is None:
        return empty_frame(REQUESTS_SCHEMA)
    df = table.to_pandas()
    df = df.sort_values([c for c in ("run_id", "trial_id", "level", "window", "request_index") if c in df.columns],
                        kind="stable")
    return df.reset_index(drop=True)

