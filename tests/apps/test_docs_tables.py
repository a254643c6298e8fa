"""The docs' generated tables equal what their datasets give, and a changed cell fails.

Every block between ``<!-- table: NAME (DATASETS) -->`` and ``<!-- /table -->`` in README.md
and docs/*.md is rebuilt from its dataset under results/examples
(:mod:`orchestrator.doc_tables.registry`) and compared with the text in the doc. The planted
changes are made on temporary copies of a doc, never on the doc itself.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from orchestrator.doc_tables.registry import (COMMAND, TABLES, check_text, doc_files, marked_tables, rewrite_text,
                                           table_diff)

BENCHMARKS = REPO / "docs" / "benchmarks.md"


def _marked() -> list[tuple[str, object]]:
    return [(str(f.relative_to(REPO)), m) for f in doc_files(REPO) for m in marked_tables(f.read_text())]


MARKED = _marked()


@pytest.mark.parametrize("path,marked", MARKED, ids=[f"{p}:{m.name}" for p, m in MARKED])
def test_marked_table_equals_its_dataset(path, marked):
    table = TABLES.get(marked.name)
    assert table is not None, f"{path}:{marked.line}: no registered table {marked.name!r} (known: {sorted(TABLES)})"
    assert marked.datasets == table.datasets, (f"{path}:{marked.line}: the marker names {marked.datasets}, "
                                               f"the table is built from {table.datasets}")
    expected = table.render(REPO)
    assert marked.body == expected, (
        f"{path}:{marked.line}: table {marked.name} differs from its dataset; `{COMMAND} --write` rewrites it\n"
        + table_diff(expected, marked.body, f"{path} {marked.name}"))


def test_every_registered_table_is_marked_exactly_once():
    names = [m.name for _, m in MARKED]
    assert sorted(names) == sorted(TABLES), f"marked: {sorted(names)}; registered: {sorted(TABLES)}"


def test_every_dataset_named_by_a_table_is_in_the_repository():
    for table in TABLES.values():
        for dataset in table.datasets:
            assert (REPO / dataset).is_dir(), f"{table.name}: no dataset at {dataset}"


# ---------------------------------------------------------------- a planted change fails
PLANTED_TABLE = "h200-capacity-study"
ORIGINAL_ROW = "| 0004 | 194 | 8192 | 0.95 | fp8 | false | false | 45.0 | 269 | 16.5 | 80 | 141 |"
PLANTED_ROW = "| 0004 | 194 | 8192 | 0.95 | fp8 | false | false | 46.0 | 269 | 16.5 | 80 | 141 |"


@pytest.fixture
def planted(tmp_path) -> Path:
    """A copy of docs/benchmarks.md with one capacity changed (45.0 -> 46.0) in the capacity study's table."""
    copy = tmp_path / "benchmarks.md"
    shutil.copyfile(BENCHMARKS, copy)
    text = copy.read_text()
    assert text.count(ORIGINAL_ROW) == 1, "the planted row is no longer in docs/benchmarks.md: update this test"
    copy.write_text(text.replace(ORIGINAL_ROW, PLANTED_ROW))
    return copy


def test_a_changed_cell_fails_with_a_readable_diff(planted):
    problems = check_text(planted.read_text(), "benchmarks.md", REPO, names=[PLANTED_TABLE])
    assert [p.name for p in problems] == [PLANTED_TABLE]
    diff = problems[0].diff
    assert f"-{PLANTED_ROW}" in diff and f"+{ORIGINAL_ROW}" in diff, diff
    assert "--write" in str(problems[0])  # it says how to fix it
    # The unchanged tables of the same copy still pass.
    others = [m.name for m in marked_tables(planted.read_text()) if m.name != PLANTED_TABLE]
    assert others and not check_text(planted.read_text(), "benchmarks.md", REPO, names=others)


def test_the_command_fails_on_a_changed_cell_and_write_restores_it(planted):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "orchestrator.doc_tables.registry", *args, "--doc", str(planted),
                               PLANTED_TABLE], cwd=REPO, capture_output=True, text=True, timeout=300)

    r = cli("--check")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"-{PLANTED_ROW}" in r.stderr and f"+{ORIGINAL_ROW}" in r.stderr, r.stderr
    r = cli("--write")
    assert r.returncode == 0, r.stdout + r.stderr
    assert planted.read_text() == BENCHMARKS.read_text()
    r = cli("--check")
    assert r.returncode == 0 and "every marked table equals its dataset" in r.stdout, r.stdout + r.stderr


def test_rewrite_replaces_only_the_marked_block(planted):
    text = planted.read_text()
    assert rewrite_text(text, REPO, names=[PLANTED_TABLE]) == BENCHMARKS.read_text()


def test_a_marker_that_names_another_dataset_fails(tmp_path):
    table = TABLES[PLANTED_TABLE]
    text = (f"<!-- table: {PLANTED_TABLE} (results/examples/llama3-8b-h200-reference) -->\n\n"
            f"{table.render(REPO)}\n\n<!-- /table -->\n")
    (problem,) = check_text(text, "doc.md", REPO)
    assert "results/examples/llama3-8b-h200-reference" in problem.message and table.datasets[0] in problem.message


def test_an_unknown_table_or_an_unclosed_marker_fails():
    (problem,) = check_text("<!-- table: no-such-table (results/examples/x) -->\n| a |\n<!-- /table -->\n")
    assert "no such table" in problem.message
    with pytest.raises(ValueError, match="without its"):
        marked_tables("<!-- table: h200-ingress (results/examples/h200-ingress) -->\n| a |\n")
