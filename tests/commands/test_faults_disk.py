"""A results disk that fills up mid-study, and a Parquet write killed with SIGKILL.

Full disk: the study's output (Parquet, Optuna journal, Tune state) is on a small tmpfs;
once the first trials are recorded the test fills it. The study must stop with one
clear message and exit code 1 (no traceback), leave only whole Parquet files, and finish
after space is freed and the same command runs again. Needs root to mount the tmpfs (CI
runs as root); elsewhere it fails saying so.

Killed writer: a process writing trials in a loop is SIGKILLed at random moments; every
file a reader sees is whole, and the next writer carries on.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq
import pytest
import yaml

from orchestrator.results import load_requests, load_trials
from support.studies import sim_doc

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True, text=True)
    # A real full disk needs a small filesystem: a 3 MiB tmpfs (root, as on CI machines).
    assert r.returncode == 0, f"cannot mount a tmpfs for the full-disk test (needs root): {r.stderr.strip()}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(path) -> None:
    """Write until the filesystem says ENOSPC (unbuffered: the error comes from our own write)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 16, 512, 1):  # then the last partial blocks
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_full_disk_stops_the_study_cleanly_and_it_resumes(tmp_path, small_disk, repo, unit_ray):
    import ray

    doc = sim_doc(
        name="fulldisk", seed=2,
        workload={"arrival": {"kind": "poisson", "rate": 20}, "num_requests": 150, "output_len": 64,
                  "input_len": {"kind": "uniform", "min": 100, "max": 1000}},
        space={"max_num_seqs": [8, 16, 32, 64, 128, 256], "max_num_batched_tokens": [2048, 8192]},
        objectives=["maximize goodput"], constraints=["ttft_p99_ms <= 1000"], search={"sampler": "grid"},
        budget={"trials": 10, "max_concurrent_trials": 1}, output=str(small_disk / "results"))
    path = tmp_path / "fulldisk.yaml"
    path.write_text(yaml.safe_dump(doc))
    trials_dir = small_disk / "results" / "fulldisk" / "trials"
    # Both runs join the Ray unit's cluster (as on a cluster) instead of starting one each.
    cmd = [sys.executable, "-m", "orchestrator", "run", str(path), "--address", ray.get_runtime_context().gcs_address]
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(trials_dir.rglob("*.parquet"))) < 2:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    fill(small_disk / "filler")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert "Traceback" not in out + err
    assert "study fulldisk stopped:" in err and "No space left on device" in err, err[-3000:]
    assert "run the same command again to resume" in err

    recorded = load_trials(small_disk / "results" / "fulldisk")  # every visible file is whole
    for f in trials_dir.rglob("*.parquet"):
        pq.read_table(f)
    assert 2 <= len(recorded) < 10

    os.remove(small_disk / "filler")
    again = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resuming run" in again.stdout
    trials = load_trials(small_disk / "results" / "fulldisk")
    assert len(trials) == 10 and trials["trial_id"].is_unique
    assert len(set(zip(trials["max_num_seqs"], trials["max_num_batched_tokens"]))) == 10  # none twice
    assert set(recorded["trial_id"]) <= set(trials["trial_id"])  # nothing recorded before was lost
    assert set(load_requests(small_disk / "results" / "fulldisk")["trial_id"]) == set(trials["trial_id"])


WRITER = textwrap.dedent("""
    import sys, datetime
    from orchestrator.measure.records import RequestRecord
    from orchestrator.results.schema import requests_to_table
    from orchestrator.results.store import ResultsStore
    store = ResultsStore(sys.argv[1], "killme")
    n = int(sys.argv[2])
    # 20k requests: a few hundred kB per requests file, so a kill often lands inside a write.
    records = [RequestRecord(index=i, scheduled_s=i * 0.01, sent_s=i * 0.01, first_token_s=i * 0.01 + 0.05,
                             end_s=i * 0.01 + 0.5, token_times_s=[i * 0.01 + 0.05], finished_s=i * 0.01 + 0.5,
                             prompt_tokens=100, completion_tokens=10) for i in range(20000)]
    while True:
        tid = f"r-{n:05d}"
        req = requests_to_table(records, study="killme", run_id="r", trial_id=tid)
        row = {"study": "killme", "study_fingerprint": "f", "run_id": "r", "trial_id": tid, "trial_number": n,
               "status": "completed",
               "started_at": datetime.datetime.now(datetime.timezone.utc), "max_num_seqs": n}
        store.write_trial(row, req, param_types={"max_num_seqs": "int"})
        print(n, flush=True)
        n += 1
""")


def test_parquet_writes_killed_with_sigkill_leave_only_whole_files(tmp_path, repo):
    out = tmp_path / "results"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(7)
    n = 0
    for _ in range(6):
        p = subprocess.Popen([sys.executable, str(script), str(out), str(n)], cwd=repo, stdout=subprocess.PIPE,
                             text=True)
        first = p.stdout.readline()  # it is writing now
        assert first.strip(), "the writer did not start"
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        written = [int(x) for x in [first, *p.stdout.read().split()] if str(x).strip()]
        n = max(written) + 1
    trials = load_trials(out / "killme")  # raises on any torn file
    requests = load_requests(out / "killme", include_warmup=True)
    for f in (out / "killme").rglob("*.parquet"):
        pq.read_table(f)
    assert trials["trial_id"].is_unique and len(trials) >= 6
    # Request files are whole; one without its trial row can only be the write the last kill cut.
    per_trial = requests.groupby("trial_id").size()
    assert (per_trial == 20000).all()
    assert set(per_trial.index) - set(trials["trial_id"]) <= {f"r-{n:05d}"}  # at most the one cut between files
    shutil.rmtree(out)
