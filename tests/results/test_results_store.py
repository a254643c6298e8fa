"""ResultsStore: layout, round trips through plain readers, idempotent rewrites, atomic writes."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from orchestrator.measure.records import RequestRecord
from orchestrator.results import (REQUESTS_SCHEMA, ResultsStore, ResultsWriteError, load_requests, load_trials,
                                  requests_to_table, trials_schema)

T0 = datetime(2026, 3, 1, 23, 58, tzinfo=timezone.utc)
PARAM_TYPES = {"max_num_seqs": "int", "gpu_memory_utilization": "float", "enable_chunked_prefill": "bool",
               "kv_cache_dtype": "string", "max_num_batched_tokens": "int"}


def make_row(i: int, *, run_id: str = "run1", study: str = "s", started_at: datetime | None = None, **kw) -> dict:
    chunked = i % 2 == 0
    row = dict(
        study=study, study_fingerprint="fp", run_id=run_id, trial_id=f"t{i:03d}", trial_number=i,
        status="completed", started_at=started_at or T0 + timedelta(minutes=i),
        finished_at=(started_at or T0 + timedelta(minutes=i)) + timedelta(seconds=30), wall_time_s=30.0,
        engine="sim", engine_mode="virtual", model="tiny-llama", gpu="H100-SXM", gpus=1, feasible=True,
        max_num_seqs=2 ** (4 + i % 4), gpu_memory_utilization=0.8 + 0.05 * (i % 3),
        enable_chunked_prefill=chunked, kv_cache_dtype=["auto", "fp8"][i % 2],
        # conditional: only exists when chunked prefill is on
        max_num_batched_tokens=2048 if chunked else None,
        params_json={"max_num_seqs": 2 ** (4 + i % 4)}, output_throughput=100.0 + i, ttft_p99_ms=50.0 + i,
    )
    row.update(kw)
    return row


def make_requests(trial_id: str, *, run_id: str = "run1", study: str = "s", n: int = 3) -> pa.Table:
    records = [RequestRecord(index=k, scheduled_s=k * 0.1, sent_s=k * 0.1, first_token_s=k * 0.1 + 0.05,
                             end_s=k * 0.1 + 0.2, token_times_s=[k * 0.1 + 0.05, k * 0.1 + 0.1, k * 0.1 + 0.2],
                             warmup=(k == 0))
               for k in range(n)]
    return requests_to_table(records, study=study, run_id=run_id, trial_id=trial_id)


def visible_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_layout_and_roundtrip_with_plain_readers(tmp_path):
    store = ResultsStore(str(tmp_path), "s")
    for i in range(4):
        store.write_trial(make_row(i), make_requests(f"t{i:03d}"), param_types=PARAM_TYPES)
    # t000 starts 23:58 on 1 March, t002.. after midnight: two date partitions.
    assert visible_files(tmp_path) == [
        "s/requests/date=2026-03-01/run=run1/t000.parquet",
        "s/requests/date=2026-03-01/run=run1/t001.parquet",
        "s/requests/date=2026-03-02/run=run1/t002.parquet",
        "s/requests/date=2026-03-02/run=run1/t003.parquet",
        "s/trials/date=2026-03-01/run=run1/t000.parquet",
        "s/trials/date=2026-03-01/run=run1/t001.parquet",
        "s/trials/date=2026-03-02/run=run1/t002.parquet",
        "s/trials/date=2026-03-02/run=run1/t003.parquet",
    ]

    # pandas, no project code
    df = pd.read_parquet(tmp_path / "s" / "trials").sort_values("trial_number").reset_index(drop=True)
    assert list(df["trial_id"]) == ["t000", "t001", "t002", "t003"]
    assert list(df["date"].astype(str)) == ["2026-03-01", "2026-03-01", "2026-03-02", "2026-03-02"]
    assert set(df["run"].astype(str)) == {"run1"}
    assert list(df["max_num_seqs"]) == [16, 32, 64, 128]
    assert list(df["enable_chunked_prefill"]) == [True, False, True, False]
    assert list(df["kv_cache_dtype"]) == ["auto", "fp8", "auto", "fp8"]
    assert df["max_num_batched_tokens"].isna().tolist() == [False, True, False, True]  # inactive -> null
    assert df.loc[0, "gpu_memory_utilization"] == pytest.approx(0.8)
    assert df.loc[0, "started_at"] == pd.Timestamp(T0)
    assert df["ttft_p50_ms"].isna().all()  # a metric never given is null

    # pyarrow.dataset with hive partitioning
    table = ds.dataset(str(tmp_path / "s" / "trials"), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 4
    expected = trials_schema(PARAM_TYPES)
    for f in expected:
        assert table.schema.field(f.name).type == f.type, f.name
    assert table.schema.field("max_num_batched_tokens").type == pa.int64()

    reqs = pd.read_parquet(tmp_path / "s" / "requests")
    assert len(reqs) == 12 and set(reqs["trial_id"]) == {"t000", "t001", "t002", "t003"}


def test_every_file_of_a_study_has_one_schema(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_trial(make_row(0), None, param_types=PARAM_TYPES)
    # a failed trial: almost everything null, including every parameter but one
    store.write_trial(dict(study="s", study_fingerprint="fp", run_id="run1", trial_id="bad", trial_number=1,
                           status="infeasible", failure_kind="weights_oom", started_at=T0, max_num_seqs=8),
                      None, param_types=PARAM_TYPES)
    store.write_trial(make_row(1, run_id="run2"), None, param_types=PARAM_TYPES)
    schemas = [pq.read_schema(p) for p in (tmp_path / "s" / "trials").rglob("*.parquet")]
    assert len(schemas) == 3
    assert all(s.equals(schemas[0], check_metadata=True) for s in schemas)
    tables = [pq.read_table(p, partitioning=None) for p in (tmp_path / "s" / "trials").rglob("*.parquet")]
    assert pa.concat_tables(tables).num_rows == 3
    df = pd.read_parquet(tmp_path / "s" / "trials")
    assert sorted(df["status"]) == ["completed", "completed", "infeasible"]


def test_trial_ids_from_file_names(tmp_path):
    store = ResultsStore(tmp_path, "s")
    assert store.trial_ids() == set()
    store.write_trial(make_row(0), None, param_types=PARAM_TYPES)
    store.write_trial(make_row(1), None, param_types=PARAM_TYPES)
    store.write_trial(make_row(2, run_id="run2"), None, param_types=PARAM_TYPES)
    assert store.trial_ids() == {"t000", "t001", "t002"}
    assert store.trial_ids(run_id="run1") == {"t000", "t001"}
    assert store.trial_ids(run_id="nope") == set()


def test_rewrite_is_idempotent(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_trial(make_row(0), make_requests("t000", n=5), param_types=PARAM_TYPES)
    store.write_trial(make_row(0, output_throughput=999.0), make_requests("t000", n=2), param_types=PARAM_TYPES)
    df = pd.read_parquet(tmp_path / "s" / "trials")
    assert len(df) == 1 and df.loc[0, "output_throughput"] == 999.0
    assert len(pd.read_parquet(tmp_path / "s" / "requests")) == 2
    assert len(visible_files(tmp_path)) == 2


def test_rewrite_in_another_date_partition_replaces_the_old_copy(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_trial(make_row(0), make_requests("t000"), param_types=PARAM_TYPES)
    later = T0 + timedelta(days=1)
    store.write_trial(make_row(0, started_at=later), None, param_types=PARAM_TYPES)
    assert visible_files(tmp_path) == ["s/trials/date=2026-03-02/run=run1/t000.parquet"]  # stale requests gone too
    assert store.trial_ids() == {"t000"}
    assert len(store.read_trials()) == 1


def test_readers_keep_the_newest_copy_of_a_duplicated_trial(tmp_path):
    """A crash between writing a rewrite and deleting the old copy must not duplicate the trial."""
    store = ResultsStore(tmp_path, "s")
    store.write_trial(make_row(0), None, param_types=PARAM_TYPES)
    old = tmp_path / "s/trials/date=2026-03-01/run=run1/t000.parquet"
    saved = old.read_bytes()
    store.write_trial(make_row(0, started_at=T0 + timedelta(days=1), output_throughput=1.0), None,
                      param_types=PARAM_TYPES)
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_bytes(saved)  # the stale copy is back, as if the delete never happened
    df = store.read_trials()
    assert len(df) == 1 and df.loc[0, "output_throughput"] == 1.0
    assert len(load_trials(tmp_path)) == 1


def test_same_trial_id_in_two_runs_are_two_trials(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_trial(make_row(0, run_id="a"), None, param_types=PARAM_TYPES)
    store.write_trial(make_row(0, run_id="b"), None, param_types=PARAM_TYPES)
    assert len(store.read_trials()) == 2
    assert len(store.read_trials(run_id="b")) == 1


def test_validation_happens_before_any_write(tmp_path):
    store = ResultsStore(tmp_path, "s")
    with pytest.raises(ValueError, match="unknown trials-table keys: nope"):
        store.write_trial(make_row(0, nope=1), make_requests("t000"), param_types=PARAM_TYPES)
    with pytest.raises(ValueError, match="study 'other'"):
        store.write_trial(make_row(0, study="other"), None, param_types=PARAM_TYPES)
    with pytest.raises(ValueError, match="trial_id"):
        store.write_trial(make_row(0), make_requests("t999"), param_types=PARAM_TYPES)
    with pytest.raises(ValueError, match="cannot name a file"):
        store.write_trial(make_row(0, run_id="a/b"), None, param_types=PARAM_TYPES)
    with pytest.raises(ValueError, match=r"REQUESTS_SCHEMA \(missing: \['itl_ms'\]"):
        store.write_trial(make_row(0), make_requests("t000").drop_columns(["itl_ms"]), param_types=PARAM_TYPES)
    nulls = make_requests("t000").set_column(4, "request_index", pa.array([None, 1, 2], pa.int64()))
    with pytest.raises(ValueError, match="cannot be cast"):
        store.write_trial(make_row(0), nulls, param_types=PARAM_TYPES)
    assert visible_files(tmp_path) == []


class FailingFS(pafs.LocalFileSystem):
    """A local filesystem whose writes fail like a full disk (after some bytes reach the file)."""

    def __init__(self, fail_on: str = "trials", where: str = "write"):
        super().__init__()
        self.fail_on = fail_on
        self.where = where

    def open_output_stream(self, path, *args, **kwargs):
        stream = super().open_output_stream(path, *args, **kwargs)
        # final paths contain /trials/, staged ones .trials. (the store names its temps so)
        if self.where == "write" and (f"/{self.fail_on}/" in path or f".{self.fail_on}." in path):
            return _FullDisk(stream)
        return stream

    def move(self, src, dest):
        if self.where == "move" and f"/{self.fail_on}/" in dest:
            raise OSError(28, "No space left on device")
        return super().move(src, dest)


class _FullDisk:
    def __init__(self, stream):
        self._stream = stream

    def write(self, data):
        self._stream.write(memoryview(data)[:100])  # a partial file on disk
        raise OSError(28, "No space left on device")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stream.close()


@pytest.mark.parametrize("fail_on", ["trials", "requests"])
@pytest.mark.parametrize("where", ["write", "move"])
def test_write_error_leaves_no_visible_file(tmp_path, fail_on, where):
    store = ResultsStore(str(tmp_path), "s", filesystem=FailingFS(fail_on, where))
    with pytest.raises(ResultsWriteError, match="No space left on device") as err:
        store.write_trial(make_row(0), make_requests("t000"), param_types=PARAM_TYPES)
    assert err.value.path.endswith(f"/{fail_on}/date=2026-03-01/run=run1/t000.parquet")
    assert isinstance(err.value.__cause__, OSError)
    # nothing at all: no partial file, no temp file, no orphan requests file
    assert visible_files(tmp_path) == []
    assert store.trial_ids() == set()


def test_failed_rewrite_keeps_the_previous_trial(tmp_path):
    ResultsStore(tmp_path, "s").write_trial(make_row(0), None, param_types=PARAM_TYPES)
    failing = ResultsStore(str(tmp_path), "s", filesystem=FailingFS("trials", "write"))
    with pytest.raises(ResultsWriteError):
        failing.write_trial(make_row(0, output_throughput=5.0), None, param_types=PARAM_TYPES)
    df = pd.read_parquet(tmp_path / "s" / "trials")
    assert len(df) == 1 and df.loc[0, "output_throughput"] == 100.0


def test_temp_files_left_by_a_kill_are_ignored(tmp_path):
    store = ResultsStore(tmp_path, "s")
    store.write_trial(make_row(0), make_requests("t000"), param_types=PARAM_TYPES)
    for table in ("trials", "requests"):
        d = tmp_path / "s" / table / "date=2026-03-01" / "run=run1"
        (d / ".t001.parquet.0123abcd.tmp").write_bytes(b"PAR1 half a file")  # killed mid-write
        (d / ".t002.parquet.0123abcd.tmp").write_bytes((d / "t000.parquet").read_bytes())  # killed before rename
    assert store.trial_ids() == {"t000"}
    assert len(pd.read_parquet(tmp_path / "s" / "trials")) == 1
    assert ds.dataset(str(tmp_path / "s" / "trials"), format="parquet", partitioning="hive").count_rows() == 1
    assert len(load_trials(tmp_path)) == 1
    assert len(store.read_requests()) == 3
    assert len(load_requests(tmp_path, include_warmup=True)) == 3


def test_object_store_path_writes_final_keys(tmp_path):
    """A non-local filesystem (an in-memory one standing in for S3) gets the final key directly."""
    fs = pafs._MockFileSystem()
    store = ResultsStore("bucket/out", "s", filesystem=fs)
    store.write_trial(make_row(0), make_requests("t000"), param_types=PARAM_TYPES)
    store.write_trial(make_row(1), None, param_types=PARAM_TYPES)
    infos = fs.get_file_info(pafs.FileSelector("bucket/out", recursive=True))
    files = sorted(i.path for i in infos if i.type == pafs.FileType.File)
    assert files == ["bucket/out/s/requests/date=2026-03-01/run=run1/t000.parquet",
                     "bucket/out/s/trials/date=2026-03-01/run=run1/t000.parquet",
                     "bucket/out/s/trials/date=2026-03-01/run=run1/t001.parquet"]
    assert store.trial_ids() == {"t000", "t001"}
    df = store.read_trials()
    assert list(df["trial_id"]) == ["t000", "t001"]
    assert len(store.read_requests(["t000"])) == 3
    assert len(load_trials("bucket/out", filesystem=fs)) == 2


def test_file_uri_output(tmp_path):
    uri = "file://" + tmp_path.as_posix()
    store = ResultsStore(uri, "s")
    store.write_trial(make_row(0), make_requests("t000"), param_types=PARAM_TYPES)
    assert (tmp_path / "s/trials/date=2026-03-01/run=run1/t000.parquet").is_file()
    assert len(load_trials(uri)) == 1
    assert store.study_path == uri + "/s"
    assert len(load_trials(store.study_path)) == 1
    assert ResultsStore(tmp_path, "s").study_path == (tmp_path / "s").resolve().as_posix()
    assert len(load_requests(uri + "/s", include_warmup=True)) == 3


def test_read_back_through_the_store(tmp_path):
    store = ResultsStore(tmp_path, "s")
    assert store.read_trials().empty and store.read_requests().empty
    for i in range(3):
        store.write_trial(make_row(i, status="completed" if i else "failed"), make_requests(f"t{i:03d}"),
                          param_types=PARAM_TYPES)
    assert list(store.read_trials()["trial_id"]) == ["t000", "t001", "t002"]
    assert list(store.read_trials(status="completed")["trial_id"]) == ["t001", "t002"]
    reqs = store.read_requests(["t001"])
    assert len(reqs) == 3 and set(reqs["trial_id"]) == {"t001"}  # warm-up included: raw rows
    assert reqs["warmup"].sum() == 1
    assert list(reqs.columns[:len(REQUESTS_SCHEMA)]) == REQUESTS_SCHEMA.names


def test_local_writes_are_renamed_from_a_staging_dir(tmp_path):
    seen = []
    real_move = pafs.LocalFileSystem.move

    class Spy(pafs.LocalFileSystem):
        def move(self, src, dest):
            seen.append((src, dest))
            assert os.path.getsize(src) > 0 and not os.path.exists(dest)
            return real_move(self, src, dest)

    ResultsStore(tmp_path, "s", filesystem=Spy()).write_trial(make_row(0), make_requests("t000"),
                                                              param_types=PARAM_TYPES)
    assert [os.path.relpath(d, tmp_path) for _, d in seen] == [
        "s/requests/date=2026-03-01/run=run1/t000.parquet", "s/trials/date=2026-03-01/run=run1/t000.parquet"]
    # staged outside the table directories, so no reader of trials/ or requests/ can list them
    assert all(os.path.dirname(src) == (tmp_path / "s" / ".tmp").as_posix() for src, _ in seen)
    assert not any((tmp_path / "s" / ".tmp").iterdir())


def test_stale_staging_files_are_swept(tmp_path):
    staging = tmp_path / "s" / ".tmp"
    staging.mkdir(parents=True)
    old, fresh = staging / "dead.t000.parquet.tmp", staging / "busy.t001.parquet.tmp"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    ResultsStore(tmp_path, "s").write_trial(make_row(0), None, param_types=PARAM_TYPES)
    assert not old.exists() and fresh.exists()  # a concurrent writer's temp is left alone
    assert len(load_trials(tmp_path)) == 1


def test_a_grown_schema_evolves_the_study(tmp_path):
    """A new parameter (or a newer tool's new metric) adds a column: old files are rewritten."""
    ResultsStore(tmp_path, "s").write_trial(make_row(0), None, param_types=PARAM_TYPES)
    grown = dict(PARAM_TYPES, block_size="int")
    ResultsStore(tmp_path, "s").write_trial(make_row(1, block_size=16), None, param_types=grown)
    df = pd.read_parquet(tmp_path / "s" / "trials").sort_values("trial_id")  # no project code
    assert list(df["trial_id"]) == ["t000", "t001"]
    assert pd.isna(df["block_size"].iloc[0]) and df["block_size"].iloc[1] == 16
    # The old space again: written with the union, nothing dropped.
    ResultsStore(tmp_path, "s").write_trial(make_row(2), None, param_types=PARAM_TYPES)
    assert len(pd.read_parquet(tmp_path / "s" / "trials")) == 3


def test_a_retyped_parameter_is_refused(tmp_path):
    ResultsStore(tmp_path, "s").write_trial(make_row(0), None, param_types=PARAM_TYPES)
    retyped = dict(PARAM_TYPES, max_num_seqs="float")
    with pytest.raises(ValueError, match=r"columns \['max_num_seqs'\] have another type"):
        ResultsStore(tmp_path, "s").write_trial(make_row(1), None, param_types=retyped)
    assert ResultsStore(tmp_path, "s").trial_ids() == {"t000"}


def test_requests_columns_in_another_order_are_accepted(tmp_path):
    store = ResultsStore(tmp_path, "s")
    reqs = make_requests("t000")
    store.write_trial(make_row(0), reqs.select(list(reversed(reqs.schema.names))), param_types=PARAM_TYPES)
    assert pq.read_schema(next((tmp_path / "s" / "requests").rglob("*.parquet"))).names == REQUESTS_SCHEMA.names
