"""Where the suite's CPU goes: ``SUITE_CPU_PROFILE=DIR ./dev test`` (a pytest plugin conftest loads then).

The suite is CPU-bound on two cores, and most of its CPU is spent outside the test processes:
the Ray clusters, Serve replicas, vLLM engines and ``orchestrator run`` processes a test starts.
Those are not the test process's children by the time they exit (Ray's daemons and workers
are reaped by others), so ``os.times()`` misses them. A control group does not: each xdist
worker moves itself into a cpuacct group of its own before any test runs, every process it
starts inherits it, and a test's CPU is the group's usage across the test (a process that
outlives its test is counted in the next). Needs a writable cgroup v1 ``cpuacct`` hierarchy
(root); without one the plugin says so and measures nothing.

Each worker appends one JSON line per test to ``DIR/<worker>.jsonl`` (``cpu_s``, ``own_s``,
``wall_s``, ``started``); the controller prints the modules by CPU seconds at the end of the run.
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path
from typing import Optional

import pytest

ENV = "SUITE_CPU_PROFILE"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _own_s() -> float:
    """The worker process's own CPU seconds (test code, in-process study drivers, load generators):
    the part of ``cpu_s`` that is neither Ray's nor an engine's nor a subprocess's."""
    t = os.times()
    return t.user + t.system


class CpuProfile:
    def __init__(self, out: Path):
        self.out = out
        self.group: Optional[Path] = None

    def pytest_configure(self, config):
        self.out.mkdir(parents=True, exist_ok=True)
        if not os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("numprocesses"):
            return  # the controller runs no test
        group = CPUACCT / f"suite-{os.getppid()}" / _worker()
        try:
            group.mkdir(parents=True, exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group = group
        except OSError as e:
            config.issue_config_time_warning(
                pytest.PytestConfigWarning(f"{ENV}: no writable cpuacct cgroup ({e}); nothing is measured"), 2)

    def _usage_s(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.group is None:
            yield
            return
        cpu0, own0, wall0, started = self._usage_s(), _own_s(), time.monotonic(), time.time()
        yield
        # started (Unix seconds): which tests ran beside one that was slow or failed
        record = {"id": item.nodeid, "cpu_s": round(self._usage_s() - cpu0, 3), "own_s": round(_own_s() - own0, 3),
                  "wall_s": round(time.monotonic() - wall0, 3), "worker": _worker(), "started": round(started, 1)}
        with open(self.out / f"{_worker()}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def pytest_unconfigure(self, config):
        """Leave the group and remove it, and the run's folder once the last worker has left."""
        if self.group is None:
            return
        try:
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
            self.group.parent.rmdir()
        except OSError:
            pass  # a process this worker started still runs in it, or another worker is still in its own

    def pytest_terminal_summary(self, terminalreporter):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return
        per_module = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for path in self.out.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                r = json.loads(line)
                m = per_module[r["id"].split("::")[0]]
                m[0] += r["cpu_s"]
                m[1] += r["wall_s"]
                m[2] += 1
        if not per_module:
            return
        total = sum(m[0] for m in per_module.values())
        terminalreporter.write_sep("=", f"CPU seconds by module ({ENV}: {self.out}), {total:.0f} in all")
        for name, (cpu, wall, n) in sorted(per_module.items(), key=lambda kv: -kv[1][0])[:30]:
            terminalreporter.write_line(f"{cpu:8.1f} CPU s {wall:8.1f} s {n:4d} tests  {name}")


def register(config) -> None:
    """Load the plugin when ``SUITE_CPU_PROFILE`` names a folder (its ``pytest_configure`` runs then:
    the hook is historic)."""
    out = os.environ.get(ENV)
    if out:
        config.pluginmanager.register(CpuProfile(Path(out)), "suite_cpu_profile")
