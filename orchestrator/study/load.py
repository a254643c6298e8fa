"""Reading a study from its file: parsed, validated, and the files it names checked."""

from __future__ import annotations

from pathlib import Path

from orchestrator.study.errors import StudyFileError
from orchestrator.study.file import read_study_document
from orchestrator.study.spec import Study, parse_study
from orchestrator.study.workload_check import workload_file_problems

__all__ = ["load_study"]


def load_study(path: str | Path) -> Study:
    """Read, validate and check the files named by the study file at ``path``; :class:`StudyFileError` if not."""
    source = str(Path(path))
    study = parse_study(read_study_document(path), source, source_path=path)
    problems = workload_file_problems(study)
    if problems:
        raise StudyFileError(source, problems)
    return study
