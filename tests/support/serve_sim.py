"""``orchestrator serve-sim`` as users run it: a subprocess on a free port, stopped with Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from support.scheduling import full_weight


def start_serve_sim(*args: str, cwd: Path = REPO) -> tuple[subprocess.Popen, str]:
    """``orchestrator serve-sim ARGS --port 0`` running; returns it and its printed base URL (``.../v1``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # It stands for a server on a machine of its own and answers in real time: a session of its own
    # (where the kernel shares CPU time between sessions first, a new one weighs as a nice-0 process),
    # at nice 0, not at the priority of a worker that stepped back (support.scheduling).
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve-sim", *args, "--port", "0"], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    full_weight(proc.pid)
    seen = []
    for line in proc.stdout:  # ready once it prints where it listens
        seen.append(line)
        found = re.search(r"OpenAI base URL: (\S+)", line)
        if found:
            return proc, found.group(1)
    proc.wait()
    raise AssertionError(f"serve-sim exited {proc.returncode} before listening:\n{''.join(seen)}{proc.stderr.read()}")


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    """Ctrl-C, as a user stops it; its exit status and stderr."""
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=120)  # a guard against a hang, not a speed check
    except subprocess.TimeoutExpired:
        proc.kill()  # a failed stop leaves nothing behind
        proc.communicate()
        raise
    return proc.returncode, stderr


# The OpenAI door of one `serve-sim` a module, for the modules that talk to it (imported there as fixtures).
@pytest.fixture(scope="module")
def base_url():
    """A `serve-sim` of tiny-llama on an H100 (8 sequences), its `/v1` URL."""
    proc, url = start_serve_sim("--model", "tiny-llama", "--gpu", "H100-80GB", "--max-num-seqs", "8")
    try:
        yield url
    finally:
        if proc.poll() is None:
            stop(proc)


@pytest.fixture(scope="module")
def client(base_url):
    """The official OpenAI client on that server, no retries."""
    import openai

    return openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
