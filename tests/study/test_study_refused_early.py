"""Study files refused before any validation walks them (too large, too nested, an alias bomb), and
values validate refuses because `run` would look them up and fail (a catalog GPU, the pre-flight of an
external endpoint): each refused in one line, by key."""

from __future__ import annotations

import pytest

from orchestrator.study.load import load_study
from orchestrator.study.spec import StudyFileError


def _alias_bomb(levels: int = 8, width: int = 9) -> str:
    names = [f"l{i}" for i in range(levels + 1)]
    lines = [f"{names[0]}: &{names[0]} [" + ", ".join(["x"] * width) + "]"]
    for prev, name in zip(names, names[1:]):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\nname: bomb\n"


@pytest.mark.parametrize("kind, text, said", [
    # A few hundred bytes that expand to 9^8 items: refused before anything walks them.
    ("alias bomb", _alias_bomb(), "too large to read: more than 100,000 values"),
    ("deep nesting", "name: " + "[" * 5000 + "]" * 5000 + "\n", "too deeply nested"),
    ("deep block nesting", "".join(f"{' ' * i}k{i}:\n" for i in range(200)) + " " * 200 + "x: 1\n",
     "too deeply nested"),
    ("a 50 MB scalar", "name: " + "x" * (50 << 20) + "\n", "more than a study file may be"),
])
def test_study_files_too_large_or_too_nested_are_refused_in_one_line(tmp_path, kind, text, said):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    with pytest.raises(StudyFileError) as e:
        load_study(path)
    assert said in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)[:300]


def test_the_simulator_on_cpu_is_refused_by_validate_not_by_run(study_doc):
    """`hardware.gpu: CPU` means vLLM's CPU build; the simulator models a GPU from its catalog, and run looked
    the name up there (a KeyError traceback). validate names the key and the allowed values."""
    from orchestrator.study.spec import parse_study

    with pytest.raises(StudyFileError) as e:
        parse_study({**study_doc, "engine": {"kind": "sim"}, "hardware": {"gpu": "CPU"}})
    text = str(e.value)
    assert "hardware.gpu: the simulated engine models a GPU" in text and "H100-80GB" in text


def test_preflight_on_an_external_endpoint_is_refused_by_validate(study_doc):
    """The pre-flight plans the memory of engines the orchestrator starts; on an external endpoint it had no
    resolved arguments and every trial became an internal-error row. validate refuses it, by key."""
    from orchestrator.study.spec import parse_study

    external = {"kind": "external", "base_url": "http://127.0.0.1:8000/v1"}
    with pytest.raises(StudyFileError) as e:
        parse_study({**study_doc, "engine": external, "search": {"preflight": True}})
    assert "search.preflight: an external endpoint is already running" in str(e.value)
    assert parse_study({**study_doc, "engine": external, "search": {"preflight": False}}).search.preflight is False
