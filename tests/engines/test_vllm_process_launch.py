"""How the ``engine`` ingress starts ``vllm serve``: in a process group of its own, led by an anchor (the
replica's child) whose child, the supervisor, ends the whole group (the API server, and the engine core
and workers it starts) when the replica that started it dies, when the anchor is killed (a Ray worker
SIGKILLs its children when it exits), when it is told to stop, or when the server exits, with no
Python code run between fork and exec in the replica (that ran grpc's fork handlers, and a server
aborted there).

The stand-in server starts a child that ignores SIGTERM, as vLLM's engine core did when a stopped
study left it holding the GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from orchestrator.engines.vllm.process import launched

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc are Linux's")

# A stand-in replica: starts the command as the replica does, prints the anchor's pid, then waits to be killed.
REPLICA = """\
import subprocess, sys
from orchestrator.engines.vllm.process import launched
proc = subprocess.Popen(launched(sys.argv[1:]), start_new_session=True)
print(proc.pid, flush=True)
print(proc.wait(), flush=True)  # the supervisor's exit code
"""

# A stand-in server: starts an "engine core" that ignores SIGTERM, prints both pids, then serves until
# told to exit (a file appearing) with the code it is given.
SERVER = """\
import os, signal, subprocess, sys, time
core = subprocess.Popen([sys.executable, "-c",
                         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print(os.getpid(), core.pid, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
sys.exit(int(sys.argv[2]))
"""


def _start(tmp_path, code: int = 0):
    """(replica, anchor, supervisor, server, engine core)."""
    replica = subprocess.Popen([sys.executable, "-c", REPLICA, sys.executable, "-c", SERVER,
                                str(tmp_path / "exit"), str(code)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    anchor = psutil.Process(int(replica.stdout.readline()))
    server_pid, core_pid = (int(x) for x in replica.stdout.readline().split())
    server = psutil.Process(server_pid)
    return replica, anchor, psutil.Process(server.ppid()), server, psutil.Process(core_pid)


def _end(replica, *procs) -> None:
    replica.kill()
    replica.wait()
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _gone(*procs, timeout: float = 30.0) -> bool:
    _, alive = psutil.wait_procs(list(procs), timeout=timeout)
    return not alive


def test_a_killed_replica_takes_the_server_and_its_engine_core_with_it(tmp_path):
    replica, anchor, supervisor, server, core = _start(tmp_path)
    try:
        # One group, led by the anchor: what the replica's teardown stops with one killpg.
        assert os.getpgid(anchor.pid) == anchor.pid == os.getpgid(supervisor.pid) == os.getpgid(server.pid) \
            == os.getpgid(core.pid)
        assert anchor.ppid() == replica.pid and supervisor.ppid() == anchor.pid and server.ppid() == supervisor.pid
        t0 = time.monotonic()
        replica.send_signal(signal.SIGKILL)  # as Ray kills an actor: no cleanup code runs
        assert _gone(anchor, supervisor, server, core), "the server or its engine core outlived the replica"
        assert time.monotonic() - t0 < 30
    finally:
        _end(replica, server, core)


def test_the_anchor_killed_as_ray_kills_an_exiting_worker_s_children_still_ends_the_group(tmp_path, monkeypatch):
    """A Ray worker that exits (an actor deleted while it starts, or killed after Serve's graceful shutdown
    timeout) SIGKILLs its own children: the anchor, not the supervisor, which then ends the group."""
    monkeypatch.setenv("VLLM_SUPERVISOR_GRACE_S", "1")
    replica, anchor, supervisor, server, core = _start(tmp_path)
    try:
        anchor.send_signal(signal.SIGKILL)
        assert _gone(supervisor, server, core, timeout=20), "the engine core outlived its killed anchor"
    finally:
        _end(replica, server, core)


def test_a_signal_to_the_group_ends_every_process_of_it(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SUPERVISOR_GRACE_S", "1")
    replica, anchor, supervisor, server, core = _start(tmp_path)
    try:
        os.killpg(anchor.pid, signal.SIGTERM)  # the replica's teardown; the core ignores it
        assert _gone(anchor, supervisor, server, core, timeout=20)
        assert replica.stdout.readline().strip() == str(128 + signal.SIGTERM)  # the anchor's exit code
        assert replica.wait(timeout=10) == 0
    finally:
        _end(replica, server, core)


def test_a_server_that_exits_takes_its_engine_core_along_and_its_code_is_the_supervisors(tmp_path):
    replica, anchor, supervisor, server, core = _start(tmp_path, code=3)
    try:
        (tmp_path / "exit").write_text("")
        assert replica.stdout.readline().strip() == "3"  # what the replica's poll() reports
        assert _gone(anchor, supervisor, server, core, timeout=10)
    finally:
        _end(replica, server, core)


def test_the_launcher_runs_the_command_it_was_given():
    out = subprocess.run(launched([sys.executable, "-c", "import sys; print(sys.argv[1:])", "a", "b c"]),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['a', 'b c']"
