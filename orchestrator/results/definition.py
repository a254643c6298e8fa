"""The study definition stored beside its results (``<output>/<study>/study.json``),
so ``orchestrator pareto|show|report PATH`` know the objectives and SLOs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import ValidationError

from orchestrator.redaction import redact
from orchestrator.results.query import ResultsPathError, cannot_write, resolve_location
from orchestrator.study.spec import Study

DEFINITION_FILE = "study.json"


class StudyDefinitionError(Exception):
    """A ``study.json`` that exists but cannot be read (truncated, garbled, not a study); ``path`` names it."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = " ".join(reason.split())  # one line
        super().__init__(f"{path}: unreadable study definition ({self.reason}); restore it from a copy or move "
                         "it away (the next run writes a new one); nothing was changed")


def _fs_and_path(uri: str):
    return resolve_location(uri)


def write_study_definition(study) -> str:
    """Write (atomically) the study as JSON into its result directory; returns the path.

    Raises :class:`StudyDefinitionError`, and writes nothing, where a ``study.json`` is there
    that cannot be read: a file this call did not write is never overwritten blindly;
    :class:`~orchestrator.results.query.ResultsPathError` where the folder cannot be written or a
    file stands where a table's folder belongs.
    """
    fs, base = _fs_and_path(study.output)
    study_dir = f"{base.rstrip('/')}/{study.name}"
    read_study_definition(study_dir, parent=False)  # raises on an unreadable one
    try:
        for name in ("trials", "requests", "levels", "predictions", "_nightly"):  # before any trial is measured
            if fs.get_file_info(f"{study_dir}/{name}").type == pafs.FileType.File:
                raise ResultsPathError(f"{study_dir}/{name}: a file where the {name} folder belongs; move it away "
                                       "and run the same command again")
        _write(fs, study_dir, study)
    except (OSError, pa.ArrowException) as e:  # a read-only folder, a file in the way
        raise cannot_write(study_dir, e, "--output DIR (or output: in the study file)") from None
    return f"{study_dir}/{DEFINITION_FILE}"


def _write(fs, study_dir: str, study) -> None:
    fs.create_dir(study_dir, recursive=True)
    # source_path: where the study file was, so that a relative model path in it still resolves.
    # Secrets (by key name) are "***" here: the file is a record, the running study keeps the values.
    body = json.dumps({"study": redact(study.model_dump(mode="json")), "fingerprint": study.fingerprint(),
                       "source_path": study.source_path}, indent=2)
    final = f"{study_dir}/{DEFINITION_FILE}"
    tmp = f"{study_dir}/.{DEFINITION_FILE}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(body.encode())
    fs.move(tmp, final)


def read_study_definition(path: str, *, parent: bool = True):
    """The Study stored at ``path`` (a study result dir, or its trials dir), or None where there is none.

    Raises :class:`StudyDefinitionError` where the file is there but cannot be read.
    ``parent=False``: look in ``path`` only.
    """
    fs, base = _fs_and_path(path)
    base = base.rstrip("/")
    for candidate in (base, base.rsplit("/", 1)[0]) if parent else (base,):
        target = f"{candidate}/{DEFINITION_FILE}"
        try:
            kind = fs.get_file_info(target).type
        except (OSError, ValueError):  # ArrowInvalid: not a path there (s3:// without a bucket)
            continue
        if kind == pafs.FileType.Directory:
            raise StudyDefinitionError(target, "a folder where the file belongs")
        try:
            with fs.open_input_stream(target) as f:
                raw = f.read()
        except (FileNotFoundError, OSError):
            continue
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("study"), dict):
                raise StudyDefinitionError(target, "no 'study' object in it")
            source_path = data.get("source_path")
            base_dir = Path(source_path).parent if isinstance(source_path, str) else None
            # stored: the model was found when the study was run; it need not be there to read results
            study = Study.model_validate(data["study"], context={"base_dir": base_dir, "stored": True})
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError and ValidationError are ValueErrors
            if isinstance(e, ValidationError):
                first = e.errors(include_url=False)[0]
                reason = f"{'.'.join(map(str, first['loc'])) or 'study'}: {first['msg']}"
            else:
                reason = f"not JSON: {e}"
            raise StudyDefinitionError(target, reason) from None
        return study.model_copy(update={"source_path": source_path}) if isinstance(source_path, str) else study
    return None


def study_dir_of(path: str) -> Optional[str]:
    fs, base = _fs_and_path(path)
    return base
