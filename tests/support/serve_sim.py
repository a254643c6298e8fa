"""``orchestrator serve-sim`` as users run it: a subprocess on a free port, stopped with Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def start_serve_sim(*args: str, cwd: Path = REPO) -> tuple[subprocess.Popen, str]:
    """``orchestrator serve-sim ARGS --port 0`` running; returns it and its printed base URL (``.../v1``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve-sim", *args, "--port", "0"], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    _, stderr = proc.communicate(timeout=120)  # a guard against a hang, not a speed check
    return proc.returncode, stderr
