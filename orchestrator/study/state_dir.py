"""Where a study keeps its local state: the Optuna journal, Tune's experiment, generated models.

A local path even when results go to object storage (``s3://...``): journals need a file
system with locks. Used by the driver and by engines that write next to the state (a
generated model directory), so it lives below both.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

STATE_DIR_ENV = "ORCHESTRATOR_STATE_DIR"  # where remote-output studies keep local state


def local_state_dir(study) -> Path:
    """The study's state folder: ``<output>/<study name>``, or ``$ORCHESTRATOR_STATE_DIR/<study name>``
    (default ``~/.cache/orchestrator``) when the output is remote."""
    if "://" in study.output and not study.output.startswith("file://"):
        base = Path(os.environ.get(STATE_DIR_ENV, Path.home() / ".cache" / "orchestrator"))
    else:
        base = Path(study.output.removeprefix("file://"))
    return (base / study.name).resolve()


def output_problem(output: str, study_name: str) -> Optional[str]:
    """Why ``output`` cannot hold the study's results, as far as can be known before writing
    (None: it can): empty, a URI without a bucket, a path through a file, or a folder to create
    it in that cannot be written."""
    text = output.strip()
    if not text:
        return "empty; name a folder (e.g. results) or an s3:// / gs:// URI"
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme != "file":
            return None if rest.split("/", 1)[0] else f"no bucket in {output!r}; e.g. {scheme}://my-bucket/results"
        text = rest
    target = Path(text).expanduser().absolute() / study_name
    probe = target
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a folder; name a folder"
    if not os.access(probe, os.W_OK | os.X_OK):  # a read-only mount (EROFS), or not this user's
        return f"{probe}: the folder is read-only (or not this user's); name another (or --output DIR)"
    return None
