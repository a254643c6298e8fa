"""Where a study keeps its local state: the Optuna journal, Tune's experiment, generated models.

A local path even when results go to object storage (``s3://...``): journals need a file
system with locks. Used by the driver and by engines that write next to the state (a
generated model directory), so it lives below both.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "ORCHESTRATOR_STATE_DIR"  # where remote-output studies keep local state


def local_state_dir(study) -> Path:
    """The study's state folder: ``<output>/<study name>``, or ``$ORCHESTRATOR_STATE_DIR/<study name>``
    (default ``~/.cache/orchestrator``) when the output is remote."""
    if "://" in study.output and not study.output.startswith("file://"):
        base = Path(os.environ.get(STATE_DIR_ENV, Path.home() / ".cache" / "orchestrator"))
    else:
        base = Path(study.output.removeprefix("file://"))
    return (base / study.name).resolve()
