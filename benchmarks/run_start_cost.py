"""CPU one ``orchestrator run`` costs on a local Ray: the process and everything it starts.

The quickstart study in virtual time (``engine.mode: virtual``: the engine costs almost nothing,
so what is left is the run's own cost: its imports, the Ray it starts, Tune, the trial actors,
the results sink), run ``--repeats`` times as a user runs it, alternating two variants:

* ``now``: as shipped;
* ``before``: Tune's own per-trial loggers on (CSV, JSON and TensorBoard, whose import loads
  torch) and Ray's idle workers started ahead for the first driver, both put back through the
  environment variables the product sets only where a user has not
  (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=0``, ``RAY_prestart_worker_first_driver=1``).

The timer covers one ``python -m orchestrator run`` from its start to its exit; the CPU is that of
every process it started (the driver, Ray's daemons and workers), read from a cpuacct cgroup made
for the run (Linux, root). Without one the machine's CPU counters are read instead, which also
count whatever else runs: run it on an idle machine. A third figure is the command line alone:
``build_parser`` for ``run`` only against every command (the lazy command modules), in-process.

Stores every run's wall and CPU seconds (``runs.parquet``) and the run record (``run.json``:
command, date, cores, load average before and after, how CPU was counted) in
results/examples/run-start-cost; the docs' table and text are computed from them
(``orchestrator/doc_tables/start_cost.py``).

    python benchmarks/run_start_cost.py [--repeats 5] [--trials 6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dataset import EXAMPLES, RunRecord, write  # noqa: E402

from orchestrator.doc_tables import start_cost as tables  # noqa: E402

BEFORE = {"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "0", "RAY_prestart_worker_first_driver": "1"}
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")


def machine_cpu_s() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def timed_run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of ``argv`` and every process it starts."""
    group = CGROUP_ROOT / f"run-start-cost-{os.getpid()}"
    use_cgroup = os.access(CGROUP_ROOT, os.W_OK)
    if use_cgroup:
        group.mkdir(exist_ok=True)
    before, t0 = machine_cpu_s(), time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=(lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
                            if use_cgroup else None)
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    if not use_cgroup:
        return wall, machine_cpu_s() - before
    time.sleep(1.0)  # Ray's daemons exit after the driver
    cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    for pid in (group / "cgroup.procs").read_text().split():  # a straggler would hold the group
        try:
            os.kill(int(pid), 9)
        except OSError:
            pass
    time.sleep(0.5)
    group.rmdir()
    return wall, cpu


def parser_cost(repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of ``build_parser(['run', ...])`` and ``build_parser()`` in fresh interpreters."""
    code = ("import time, sys; t = time.process_time(); from orchestrator.cli import build_parser; "
            "build_parser({}); print(time.process_time() - t)")
    one, every = [], []
    for _ in range(repeats):
        for out, arg in ((one, "['run', 's.yaml']"), (every, "None")):
            r = subprocess.run([sys.executable, "-c", code.format(arg)], cwd=REPO, capture_output=True, text=True,
                               check=True)
            out.append(float(r.stdout.strip()))
    return one, every


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--out", type=Path, default=EXAMPLES / "run-start-cost")
    args = ap.parse_args()
    if args.repeats < 2 or args.trials < 1:
        ap.error("--repeats must be >= 2 (the interval needs a spread) and --trials >= 1")
    import pandas as pd

    record = RunRecord.from_argv()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        doc = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
        doc["engine"] = {**doc["engine"], "mode": "virtual"}
        study = Path(tmp) / "quickstart-virtual.yaml"
        study.write_text(yaml.safe_dump(doc))
        base_env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
        for key in BEFORE:
            base_env.pop(key, None)
        for i in range(args.repeats):
            for name, extra in ((tables.NOW, {}), (tables.BEFORE, BEFORE)):
                out = Path(tmp) / f"{name}-{i}"
                argv = [sys.executable, "-m", "orchestrator", "run", str(study), "--output", str(out),
                        "--trials", str(args.trials), "--quiet"]
                wall, cpu = timed_run(argv, {**base_env, **extra})
                rows.append({"variant": name, "repeat": i, "wall_s": wall, "cpu_s": cpu})
                print(f"  {name:6s} run {i + 1}: {wall:.1f} s wall, {cpu:.1f} CPU-s", flush=True)
    one, every = parser_cost(args.repeats)
    rows += [{"variant": name, "repeat": i, "wall_s": float("nan"), "cpu_s": cpu}
             for name, values in ((tables.PARSER_RUN, one), (tables.PARSER_EVERY, every)) for i, cpu in enumerate(values)]
    frame = pd.DataFrame(rows)
    counted = "cgroup" if os.access(CGROUP_ROOT, os.W_OK) else "machine"
    run = record.finish(trials=args.trials, repeats=args.repeats, cpu_counted=counted)
    print(f"wrote {write(args.out, {tables.RUNS_FILE: frame}, run)}")
    print(tables.start_cost_table(args.out) + "\n\n" + tables.start_cost_findings(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
