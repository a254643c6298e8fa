"""``orchestrator ARGS`` as the tests run it.

:func:`orchestrator` runs a command that reads or checks (``validate``, ``show``, ``pareto``,
``report``, ``recommend``, ...) in this process, through the console script's own entry point
(:func:`orchestrator.cli.main`): the same parser, commands and exit codes, what the commands
print and the warnings they log, without a new interpreter that imports pandas, pyarrow and
Ray again for each call (about a second of CPU each, on the suite's two cores). An exception
that escapes ``main`` is what a user would see as a traceback: it is written to ``stderr``
with exit code 1, as the interpreter does. The commands that start Ray or a server
(:data:`OWN_PROCESS`) run as a process of their own, as a user runs them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Mapping, Optional

from conftest import REPO

OWN_PROCESS = ("run", "nightly", "serve-sim", "make-model")  # Ray, a server, torch training


def orchestrator(*args: str, cwd: Optional[Path] = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``orchestrator ARGS`` from ``cwd`` (default: the checkout): in this process, or in one of its
    own for the commands of :data:`OWN_PROCESS`."""
    if args and args[0] in OWN_PROCESS:
        return orchestrator_process(*args, cwd=cwd, timeout=timeout)
    from orchestrator.cli import main
    from orchestrator.results import query

    query._warned.clear()  # a command is a process of its own: it warns about each file once
    out, err = io.StringIO(), io.StringIO()
    # What main's logging.basicConfig would print to stderr; under pytest the root logger has
    # handlers already, so basicConfig adds none.
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG if "-v" in args or "--verbose" in args else logging.WARNING)
    root = logging.getLogger()
    saved_level, saved_cwd = root.level, os.getcwd()
    root.addHandler(handler)
    root.setLevel(min(saved_level or logging.WARNING, handler.level))
    try:
        os.chdir(cwd or REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(args))
            except SystemExit as e:  # argparse's usage errors, --help
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001 - the traceback the interpreter would print
                traceback.print_exc(file=sys.stderr)
                rc = 1
    finally:
        os.chdir(saved_cwd)
        root.removeHandler(handler)
        root.setLevel(saved_level)
    return subprocess.CompletedProcess(["orchestrator", *args], rc, out.getvalue(), err.getvalue())


def orchestrator_process(*args: str, cwd: Optional[Path] = None, timeout: float = 600,
                         env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """``python -m orchestrator ARGS`` as a process of its own, this checkout's package first on
    the path (so it runs from any working directory)."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)
