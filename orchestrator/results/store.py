"""Write trials into the results dataset, one Parquet file per trial and table.

Layout (hive partitions ``date`` = the trial's UTC start date, ``run`` = its run id)::

    <output>/<study>/trials/date=YYYY-MM-DD/run=<run_id>/<trial_id>.parquet     one row
    <output>/<study>/requests/date=YYYY-MM-DD/run=<run_id>/<trial_id>.parquet   one row per request

Rules:

* A trial is written requests first, trials row last: the trials file is the
  commit mark, and :meth:`ResultsStore.trial_ids` (what resume skips) lists only
  those files.
* Each file appears whole or not at all. On a local filesystem the bytes go to a
  temporary file in ``<output>/<study>/.tmp/`` (beside, not inside, the table
  directories: no reader of ``trials/`` or ``requests/`` ever lists it, Polars'
  directory scan included, which does not skip hidden names), are fsynced, then
  renamed over the final name (same filesystem, so the rename is atomic). On
  object stores (S3, GCS), where rename is a copy, the final key is written
  directly: a PUT is atomic there. A temporary file left by a killed writer is
  removed by a later store once it is an hour old; hidden names (``.`` or ``_``)
  inside the table directories are skipped by every reader here, too.
* A trial is identified by ``(run_id, trial_id)``. Writing it again replaces its
  files, also when its start date (hence its partition) changed; the old copies
  are removed after the new ones are in place, and readers that see both keep
  the newest date.
* Any write failure (disk full, permissions, network) raises
  :class:`ResultsWriteError` and leaves no visible partial file.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.results.levels import LEVELS_SCHEMA, load_levels
from orchestrator.results.query import (DataFile, _skip_unreadable, column_conflict, empty_frame, list_data_files,
                                        load_requests, load_trials, resolve_location)
from orchestrator.results.schema import REQUESTS_SCHEMA, trial_row_to_table, trials_schema

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
COMPRESSION = "zstd"


class ResultsWriteError(Exception):
    """A results file could not be written; nothing partial is visible. ``path``: the target."""

    def __init__(self, path: str, cause: BaseException):
        self.path = path
        self.cause = cause
        super().__init__(f"could not write results file {path}: {cause}")


def _check_name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(f"{what} {value!r} cannot name a file or partition; "
                         "use letters, digits, '_', '.', '-' (not first), at most 200 characters")
    return value


def _covers(have: pa.Schema, want: pa.Schema) -> bool:
    """``have`` holds every column of ``want`` with the same type."""
    return all(n in have.names and have.field(n).type.equals(want.field(n).type) for n in want.names)


def _serialize(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=COMPRESSION)
    return sink.getvalue()


class ResultsStore:
    """The results dataset of one study under ``output`` (a local path or a filesystem URI).

    ``filesystem`` overrides the one derived from ``output`` (``output`` is then a
    path inside it). Rename-then-publish is used when the filesystem is a
    :class:`pyarrow.fs.LocalFileSystem`; any other is treated as an object store.
    """

    def __init__(self, output: Union[str, os.PathLike], study_name: str, *,
                 filesystem: Optional[pafs.FileSystem] = None):
        self.study_name = _check_name("study name", study_name)
        self.output = os.fspath(output)
        self._custom_fs = filesystem is not None
        self.filesystem, base = resolve_location(output, filesystem)
        self.root = f"{base.rstrip('/')}/{study_name}"
        self.trials_dir = f"{self.root}/trials"
        self.requests_dir = f"{self.root}/requests"
        self.levels_dir = f"{self.root}/levels"  # capacity-search load levels (orchestrator.results.levels)
        self.predictions_dir = f"{self.root}/predictions"  # search.fidelity sim: the simulator's scores
        self.staging_dir = f"{self.root}/.tmp"
        self._local = isinstance(self.filesystem, pafs.LocalFileSystem)
        self._checked_schema: Optional[pa.Schema] = None

    @property
    def study_path(self) -> str:
        """The study directory as a local path or URI (what ``load_trials`` and pandas accept)."""
        if "://" in self.output and not self._custom_fs:
            return f"{self.output.rstrip('/')}/{self.study_name}"
        return self.root

    def __repr__(self) -> str:
        return f"ResultsStore({self.root!r}, filesystem={self.filesystem.type_name})"

    # ------------------------------------------------------------------ writing
    def put_file(self, relative: str, data: bytes) -> str:
        """Write ``<study>/<relative>`` whole or not at all (as the tables are); returns its path."""
        path = f"{self.root}/{relative}"
        self._put(path, pa.py_buffer(data))
        return path

    def get_file(self, relative: str) -> Optional[bytes]:
        """The bytes of ``<study>/<relative>``, or None where there is no such file."""
        path = f"{self.root}/{relative}"
        if self.filesystem.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.filesystem.open_input_stream(path) as f:
            return f.read()

    def write_trial(self, row: Mapping[str, Any], requests: Optional[pa.Table] = None, *,
                    param_types: Mapping[str, str], levels: Optional[pa.Table] = None,
                    predicted: Sequence[str] = ()) -> str:
        """Write (or replace) one trial; returns the trials file path.

        ``row`` is validated by :func:`~orchestrator.results.schema.trial_row_to_table`
        (``ValueError`` on unknown keys or bad values, before anything is written);
        ``requests`` must have :data:`REQUESTS_SCHEMA` and this trial's ids, ``levels``
        (capacity search) :data:`~orchestrator.results.levels.LEVELS_SCHEMA` and this trial's ids;
        ``predicted`` names the metrics with prediction columns (``search.fidelity: sim``).
        """
        schema = trials_schema(param_types, predicted)
        if self._checked_schema is None and self._local:
            self._sweep_stale_temps()
        schema = self._check_same_schema(schema)
        table = trial_row_to_table(row, schema)
        study = table.column("study")[0].as_py()
        if study != self.study_name:
            raise ValueError(f"row is for study {study!r}, this store holds {self.study_name!r}")
        run_id = _check_name("run_id", table.column("run_id")[0].as_py())
        trial_id = _check_name("trial_id", table.column("trial_id")[0].as_py())
        started: datetime = table.column("started_at")[0].as_py()
        date = started.date().isoformat()
        trial_path = f"{self.trials_dir}/date={date}/run={run_id}/{trial_id}.parquet"
        request_path = f"{self.requests_dir}/date={date}/run={run_id}/{trial_id}.parquet"
        level_path = f"{self.levels_dir}/date={date}/run={run_id}/{trial_id}.parquet"

        if requests is not None:
            requests = self._check_requests(requests, run_id, trial_id)
        if levels is not None:
            levels = self._check_levels(levels, run_id, trial_id)
        written: list[str] = []
        try:
            for path, part in ((request_path, requests), (level_path, levels)):
                if part is not None:
                    self._put(path, _serialize(part))
                    written.append(path)
            self._put(trial_path, _serialize(table))
        except ResultsWriteError:
            for path in written:
                self._delete(path)  # no requests or levels without their trial
            raise
        # The new copy is in place: drop what an earlier write of this trial left elsewhere.
        stale = [f.path for f in self._copies(self.trials_dir, run_id, trial_id) if f.path != trial_path]
        stale += [f.path for f in self._copies(self.requests_dir, run_id, trial_id)
                  if f.path != request_path or requests is None]
        stale += [f.path for f in self._copies(self.levels_dir, run_id, trial_id)
                  if f.path != level_path or levels is None]
        for path in stale:
            self._delete(path)
        return trial_path

    def _check_same_schema(self, schema: pa.Schema) -> pa.Schema:
        """Every trials file of a study has one schema. Returns the schema to write with.

        A newer tool (more metric columns) or a space that gained or lost parameters
        evolves the study: the union of both schemas, existing files rewritten to it
        (atomically, once). Columns whose type changed cannot be reconciled.
        """
        if self._checked_schema is not None and _covers(self._checked_schema, schema):
            return self._checked_schema
        try:
            existing = list_data_files(self.filesystem, self.trials_dir)
        except (OSError, pa.ArrowException):
            existing = []  # unreadable listing: nothing to compare with
        theirs = schema
        fixed = {f.name: f.type for f in trials_schema({})}
        for data_file in reversed(existing):  # the newest file that reads (a damaged one is skipped)
            try:
                with self.filesystem.open_input_file(data_file.path) as f:
                    found = pq.read_schema(f)
            except (OSError, pa.ArrowException):
                continue
            if column_conflict(found, fixed) is None:  # else a hand edit (a string metric), not the study's schema
                theirs = found
                break
        if theirs.equals(schema):
            self._checked_schema = schema
            return schema
        clashes = [n for n in set(schema.names) & set(theirs.names)
                   if not schema.field(n).type.equals(theirs.field(n).type)]
        if clashes:
            raise ValueError(
                f"study {self.study_name!r} at {self.root} already holds trials whose columns "
                f"{sorted(clashes)} have another type: the search space changed a parameter's type; "
                "use a new study name or output directory")
        union = pa.schema(list(schema) + [f for f in theirs if f.name not in schema.names])
        for data_file in existing:
            self._migrate(data_file.path, union)
        self._checked_schema = union
        return union

    def _migrate(self, path: str, schema: pa.Schema) -> None:
        """Rewrite one trials file to ``schema`` (new columns null), atomically. A file that cannot
        be read is left as it is (readers skip it with a warning): never rewritten, never removed."""
        try:
            with self.filesystem.open_input_file(path) as f:
                table = pq.read_table(f)
        except (OSError, pa.ArrowException) as e:
            _skip_unreadable(path, e)
            return
        if table.schema.equals(schema):
            return
        clash = column_conflict(table.schema, {f.name: f.type for f in schema})
        if clash is not None:  # damaged: readers skip it with a warning; never rewritten
            log.warning("left %s as it is: its column %r is %s where %s belongs", path, *clash)
            return
        columns = [table.column(fld.name) if fld.name in table.schema.names
                   else pa.nulls(table.num_rows, type=fld.type) for fld in schema]
        self._put(path, _serialize(pa.Table.from_arrays(columns, schema=schema)))

    def _check_requests(self, requests: pa.Table, run_id: str, trial_id: str) -> pa.Table:
        if not isinstance(requests, pa.Table):
            raise TypeError(f"requests must be a pyarrow.Table (see requests_to_table), got {type(requests).__name__}")
        if set(requests.schema.names) != set(REQUESTS_SCHEMA.names):
            missing = [n for n in REQUESTS_SCHEMA.names if n not in requests.schema.names]
            extra = [n for n in requests.schema.names if n not in REQUESTS_SCHEMA.names]
            raise ValueError(f"requests table does not match REQUESTS_SCHEMA (missing: {missing}, unknown: {extra})")
        try:
            requests = requests.select(REQUESTS_SCHEMA.names).cast(REQUESTS_SCHEMA)
        except (ValueError, TypeError, pa.ArrowNotImplementedError) as e:  # ArrowInvalid is a ValueError
            raise ValueError(f"requests table cannot be cast to REQUESTS_SCHEMA: {e}") from None
        for column, expected in (("study", self.study_name), ("run_id", run_id), ("trial_id", trial_id)):
            values = requests.column(column)
            if len(values) and not pc.all(pc.equal(values, expected)).as_py():
                raise ValueError(f"requests table: column {column!r} must be {expected!r} in every row")
        return requests

    def _check_levels(self, levels: pa.Table, run_id: str, trial_id: str) -> pa.Table:
        if not isinstance(levels, pa.Table) or set(levels.schema.names) != set(LEVELS_SCHEMA.names):
            raise ValueError("levels must be a pyarrow.Table with LEVELS_SCHEMA's columns (see levels_to_table)")
        levels = levels.select(LEVELS_SCHEMA.names).cast(LEVELS_SCHEMA)
        for column, expected in (("study", self.study_name), ("run_id", run_id), ("trial_id", trial_id)):
            values = levels.column(column)
            if len(values) and not pc.all(pc.equal(values, expected)).as_py():
                raise ValueError(f"levels table: column {column!r} must be {expected!r} in every row")
        return levels

    def write_predictions(self, run_id: str, table: pa.Table) -> str:
        """Replace the run's simulator scores (``search.fidelity: sim``): kept apart from the trials,
        so that nothing predicted is taken for a measurement."""
        path = f"{self.predictions_dir}/{_check_name('run_id', run_id)}.parquet"
        self._put(path, _serialize(table))
        return path

    def _put(self, path: str, data: pa.Buffer) -> None:
        fs = self.filesystem
        parent, name = path.rsplit("/", 1)
        try:
            fs.create_dir(parent, recursive=True)
            if not self._local:
                # Object store: a PUT is atomic; the buffer is written in one call so the
                # upload happens at close().
                out = fs.open_output_stream(path)
                out.write(data)
                out.close()
                return
            fs.create_dir(self.staging_dir, recursive=True)
            table = path[len(self.root) + 1:].split("/", 1)[0]  # "trials" or "requests"
            tmp = f"{self.staging_dir}/{uuid.uuid4().hex}.{table}.{name}.tmp"
            try:
                with fs.open_output_stream(tmp) as out:
                    out.write(data)
                _fsync(tmp)
                fs.move(tmp, path)
            except BaseException:
                self._delete(tmp)
                raise
            _fsync(parent)
        except (OSError, pa.ArrowException) as e:
            raise ResultsWriteError(path, e) from e

    def _sweep_stale_temps(self, max_age_s: float = 3600.0) -> None:
        """Remove temporary files that killed writers left (none is written for an hour)."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.staging_dir, allow_not_found=True))
        except (OSError, pa.ArrowException):
            return
        now = datetime.now(timezone.utc)
        for info in infos:
            if info.type == pafs.FileType.File and info.mtime is not None and \
                    (now - info.mtime.astimezone(timezone.utc)).total_seconds() > max_age_s:
                self._delete(info.path)

    def _delete(self, path: str) -> None:
        try:
            self.filesystem.delete_file(path)
        except (OSError, pa.ArrowException):
            pass  # gone already, or cleanup impossible: a temp is never read

    def _copies(self, table_dir: str, run_id: str, trial_id: str) -> list[DataFile]:
        """Every file of (run, trial) under a table, across date partitions."""
        try:
            days = self.filesystem.get_file_info(pafs.FileSelector(table_dir, allow_not_found=True))
        except (OSError, pa.ArrowException):
            return []
        candidates = [f"{d.path}/run={run_id}/{trial_id}.parquet" for d in days
                      if d.type == pafs.FileType.Directory and d.base_name.startswith("date=")]
        found = self.filesystem.get_file_info(candidates) if candidates else []
        return [DataFile(i.path, i.path.rsplit("/", 3)[-3][len("date="):], run_id, trial_id)
                for i in found if i.type == pafs.FileType.File]

    # ------------------------------------------------------------------ reading
    def trial_ids(self, run_id: Optional[str] = None) -> set[str]:
        """Ids of the trials written so far (from file names; no file is opened)."""
        return {f.trial_id for f in list_data_files(self.filesystem, self.trials_dir)
                if run_id is None or f.run == run_id}

    def read_trials(self, *, run_id: Union[str, Sequence[str], None] = None,
                    status: Union[str, Sequence[str], None] = None, since: Any = None) -> pd.DataFrame:
        """The study's trials (see :func:`~orchestrator.results.query.load_trials`)."""
        if not self._exists(self.trials_dir):
            return empty_frame(trials_schema({}))
        return load_trials(self.trials_dir, since=since, status=status, run=run_id, filesystem=self.filesystem)

    def read_requests(self, trial_ids: Optional[Iterable[str]] = None, *,
                      run_id: Union[str, Sequence[str], None] = None) -> pd.DataFrame:
        """Every request row (warm-up included) of the given trials, or of all."""
        if not self._exists(self.requests_dir):
            return empty_frame(REQUESTS_SCHEMA)
        return load_requests(self.requests_dir, trial_ids=trial_ids, include_warmup=True, run=run_id,
                             filesystem=self.filesystem)

    def read_levels(self, trial_ids: Optional[Iterable[str]] = None) -> pd.DataFrame:
        """Every capacity-search level row of the given trials, or of all."""
        return load_levels(self.levels_dir, trial_ids, filesystem=self.filesystem)

    def _exists(self, path: str) -> bool:
        return self.filesystem.get_file_info(path).type != pafs.FileType.NotFound


def _fsync(path: str) -> None:
    """Flush a local file or directory to disk (directories: best effort, not on Windows)."""
    is_dir = os.path.isdir(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if is_dir:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not is_dir:
            raise
    finally:
        os.close(fd)

