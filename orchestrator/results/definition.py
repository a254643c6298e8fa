"""The study definition stored beside its results (``<output>/<study>/study.json``),
so ``orchestrator pareto|show|report PATH`` know the objectives and SLOs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

DEFINITION_FILE = "study.json"


def _fs_and_path(uri: str):
    import pyarrow.fs as pafs

    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), str(Path(uri).resolve())


def write_study_definition(study) -> str:
    """Write (atomically) the study as JSON into its result directory; returns the path."""
    fs, base = _fs_and_path(study.output)
    study_dir = f"{base.rstrip('/')}/{study.name}"
    fs.create_dir(study_dir, recursive=True)
    # source_path: where the study file was, so that a relative model path in it still resolves.
    body = json.dumps({"study": study.model_dump(mode="json"), "fingerprint": study.fingerprint(),
                       "source_path": study.source_path}, indent=2)
    final = f"{study_dir}/{DEFINITION_FILE}"
    tmp = f"{study_dir}/.{DEFINITION_FILE}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(body.encode())
    fs.move(tmp, final)
    return final


def read_study_definition(path: str):
    """The Study stored at ``path`` (a study result dir, or its trials dir), or None."""
    from orchestrator.study import Study

    fs, base = _fs_and_path(path)
    base = base.rstrip("/")
    for candidate in (base, base.rsplit("/", 1)[0]):
        target = f"{candidate}/{DEFINITION_FILE}"
        try:
            with fs.open_input_stream(target) as f:
                data = json.loads(f.read())
        except (FileNotFoundError, OSError):
            continue
        source_path = data.get("source_path")
        base_dir = Path(source_path).parent if source_path else None
        study = Study.model_validate(data["study"], context={"base_dir": base_dir})
        return study.model_copy(update={"source_path": source_path}) if source_path else study
    return None


def study_dir_of(path: str) -> Optional[str]:
    fs, base = _fs_and_path(path)
    return base
