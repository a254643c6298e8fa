"""How the ``engine`` ingress starts ``vllm serve``: through a launcher that becomes the server (the
same pid) and that the kernel kills when the replica that started it dies, with no Python code run
between fork and exec in the replica (that ran grpc's fork handlers, and a server aborted there)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from orchestrator.engines.vllm_process import launched

# A stand-in replica: starts the command as the replica does, prints its pid, then waits to be killed.
REPLICA = """\
import subprocess, sys
from orchestrator.engines.vllm_process import launched
proc = subprocess.Popen(launched(sys.argv[1:]), start_new_session=True)
print(proc.pid, flush=True)
proc.wait()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_launched_server_is_the_same_process_and_dies_with_its_replica():
    sleep = shutil.which("sleep")
    replica = subprocess.Popen([sys.executable, "-c", REPLICA, sleep, "300"], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        server = psutil.Process(int(replica.stdout.readline()))
        # exec, not a child: the pid the replica holds is the server's (what it stops and reports).
        for _ in range(200):
            if server.cmdline()[:1] == [sleep]:
                break
            psutil.wait_procs([server], timeout=0.05)
        assert server.cmdline() == [sleep, "300"]
        assert server.ppid() == replica.pid and os.getpgid(server.pid) == server.pid  # a group of its own

        replica.send_signal(signal.SIGKILL)  # as Ray kills an actor: no cleanup code runs
        gone, alive = psutil.wait_procs([server], timeout=30)
        assert server in gone and not alive, "the server outlived its replica"
    finally:
        replica.kill()
        replica.wait()


def test_the_launcher_runs_the_command_it_was_given():
    out = subprocess.run(launched([sys.executable, "-c", "import sys; print(sys.argv[1:])", "a", "b c"]),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['a', 'b c']"
