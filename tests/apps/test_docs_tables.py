"""The docs' generated blocks equal what their datasets give, and a changed cell or figure fails.

Every block between ``<!-- table: NAME (DATASETS) -->`` and ``<!-- /table -->``, and every text
between ``<!-- text: NAME (DATASETS) -->`` and ``<!-- /text -->``, in README.md and docs/*.md is
rebuilt from its dataset under results/examples (:mod:`orchestrator.doc_tables.registry`) and
compared with the doc. The planted changes are made on temporary copies of the docs, never on
the docs themselves.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from orchestrator.doc_tables import registry
from orchestrator.doc_tables.blocks import bullets, paragraph
from orchestrator.doc_tables.registry import (COMMAND, TABLES, check_text, doc_files, marked_tables, render,
                                              rewrite_text, table_diff)

BENCHMARKS = REPO / "docs" / "benchmarks.md"


def _marked() -> list[tuple[str, object]]:
    return [(str(f.relative_to(REPO)), m) for f in doc_files(REPO) for m in marked_tables(f.read_text())]


MARKED = _marked()


@pytest.mark.parametrize("path,marked", MARKED, ids=[f"{p}:{m.kind}:{m.name}" for p, m in MARKED])
def test_marked_block_equals_its_dataset(path, marked):
    block = TABLES.get(marked.name)
    assert block is not None, f"{path}:{marked.line}: no registered block {marked.name!r} (known: {sorted(TABLES)})"
    assert marked.kind == block.kind, (f"{path}:{marked.line}: the marker says {marked.kind}, "
                                       f"{marked.name} is a {block.kind}")
    assert marked.datasets == block.datasets, (f"{path}:{marked.line}: the marker names {marked.datasets}, "
                                               f"the {block.kind} is built from {block.datasets}")
    expected = render(marked.name, REPO)
    assert marked.body == expected, (
        f"{path}:{marked.line}: {marked.kind} {marked.name} differs from its dataset; `{COMMAND} --write` rewrites it\n"
        + table_diff(expected, marked.body, f"{path} {marked.name}"))


@pytest.mark.parametrize("name", sorted(n for n, b in TABLES.items() if b.kind == "text"))
def test_a_text_says_no_missing_value(name):
    """A figure a text could not compute (a column absent from its dataset) reads nan or None: never in a doc."""
    words = set(render(name, REPO).replace("(", " ").replace(")", " ").replace(",", " ").split())
    assert not words & {"nan", "NaN", "None", "inf%", "nan%"}, f"{name}: {render(name, REPO)}"


def test_every_registered_table_is_marked_exactly_once():
    names = [m.name for _, m in MARKED]
    assert sorted(names) == sorted(TABLES), f"marked: {sorted(names)}; registered: {sorted(TABLES)}"


def test_every_dataset_named_by_a_table_is_in_the_repository():
    """A dataset is a folder; a block whose source is the code names the module (a file)."""
    for table in TABLES.values():
        for dataset in table.datasets:
            path = REPO / dataset
            assert path.is_dir() or (path.is_file() and path.suffix == ".py"), f"{table.name}: no dataset at {dataset}"


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
    assert r.returncode == 0 and "every marked block equals its dataset" in r.stdout, r.stdout + r.stderr


def test_rewrite_replaces_only_the_marked_block(planted):
    text = planted.read_text()
    assert rewrite_text(text, REPO, names=[PLANTED_TABLE]) == BENCHMARKS.read_text()


def test_a_marker_that_names_another_dataset_fails(tmp_path):
    table = TABLES[PLANTED_TABLE]
    text = (f"<!-- table: {PLANTED_TABLE} (results/examples/llama3-8b-h200-reference) -->\n\n"
            f"{render(PLANTED_TABLE, REPO)}\n\n<!-- /table -->\n")
    (problem,) = check_text(text, "doc.md", REPO)
    assert "results/examples/llama3-8b-h200-reference" in problem.message and table.datasets[0] in problem.message


def test_an_unknown_table_or_an_unclosed_marker_fails():
    (problem,) = check_text("<!-- table: no-such-table (results/examples/x) -->\n| a |\n<!-- /table -->\n")
    assert "no such block" in problem.message
    with pytest.raises(ValueError, match="without its"):
        marked_tables("<!-- table: h200-ingress (results/examples/h200-ingress) -->\n| a |\n")


# ---------------------------------------------------------------- a planted prose figure fails
# The issue's own examples: a capacity in the interactive study's verdict, and the GPU the README names.
PROSE = [("docs/benchmarks.md", "h200-interactive-verdict", "16.7 [13.5, 19.2]", "26.7 [13.5, 49.2]"),
         ("README.md", "readme-engines", "on an H200", "on an H100"),
         # a setup paragraph's count, and a measured figure of the calibration history
         ("docs/benchmarks.md", "decisions-sim-setup", "20 seeds", "30 seeds"),
         ("docs/simulator.md", "sim-refit-steps", "median ITL is 7.7–7.9 ms", "median ITL is 7.1–7.9 ms"),
         # the CPU probe's figures beside its table (benchmarks/trained_probe.py's dataset)
         ("docs/trained-models.md", "trained-probe-cpu-findings", "(8.0545 both)", "(8.0554 both)"),
         ("docs/trained-models.md", "trained-probe-cpu-guardrail", "flips 20% of", "flips 10% of")]


@pytest.fixture
def docs_copy(tmp_path) -> Path:
    """README.md and docs/*.md copied under a temporary root, as they are in the repository."""
    (tmp_path / "docs").mkdir()
    for f in doc_files(REPO):
        shutil.copyfile(f, tmp_path / f.relative_to(REPO))
    return tmp_path


@pytest.mark.parametrize("doc,name,original,planted", PROSE, ids=[p[1] for p in PROSE])
def test_a_changed_prose_figure_fails_the_check_and_names_its_block(docs_copy, capsys, doc, name, original, planted):
    copy = docs_copy / doc
    text = copy.read_text()
    (block,) = [m for m in marked_tables(text) if m.name == name]
    assert block.kind == "text" and block.body.count(original) == 1, f"{original!r} is no longer in {doc}'s {name}"
    copy.write_text(text[:block.start] + text[block.start:block.end].replace(original, planted) + text[block.end:])
    docs = [a for f in doc_files(docs_copy) for a in ("--doc", str(f))]

    assert registry.main(["--check", *docs]) == 1  # every doc of the copy, every block, datasets from the repository
    err = capsys.readouterr().err
    assert f"text {name}: differs from its dataset" in err, err
    lines = err.splitlines()  # the diff: the doc's line (-) and the dataset's (+)
    assert any(x.startswith("-") and planted in x for x in lines), err
    assert any(x.startswith("+") and original in x for x in lines), err
    named = [line for line in err.splitlines() if ": differs from its dataset" in line]
    assert len(named) == 1 and named[0].startswith(str(copy)), named  # only the changed block, in its file

    assert registry.main(["--write", *docs, name]) == 0
    assert copy.read_text() == (REPO / doc).read_text()


def test_a_marker_of_the_other_kind_fails():
    name = "h200-interactive-verdict"
    block = TABLES[name]
    text = f"<!-- table: {name} ({', '.join(block.datasets)}) -->\n\n{render(name, REPO)}\n\n<!-- /table -->\n"
    (problem,) = check_text(text, "doc.md", REPO)
    assert f"{name} is a text" in problem.message, problem.message


def test_generated_prose_never_opens_a_line_with_a_block_marker():
    """Wrapped at the docs' width, a ">= 70" or "- 3" at a line's start would become a quote or a list item."""
    words = " ".join(["word"] * 23)  # 23 x 5 - 1 = 114 characters: the wrap falls inside what follows
    for sentence in (f"{words} >= 70 GiB", f"{words} # 3 of them", f"{words} - 3 more", f"{words} 12. then"):
        for out in (paragraph(sentence), bullets([sentence])):
            later = out.splitlines()[1:]
            assert later and not any(line.lstrip().startswith((">", "#", "- ", "12.")) for line in later), out


# ---------------------------------------------------------------- tables from the code and the shipped files
# A cell each of the tables generated from a code catalog, the shipped traces and the cold H200 runs.
CELLS = [("docs/metrics.md", "gpu-prices", "| 7.90 |", "| 6.90 |"),
         ("docs/planning.md", "planning-fleet-example", "ceil(600 / 110) = 6 replicas, 12 GPUs",
          "ceil(600 / 110) = 5 replicas, 10 GPUs"),
         ("docs/workloads.md", "shipped-traces", "| `rag` | 120 |", "| `rag` | 121 |"),
         ("docs/simulator.md", "sim-constants", "| `GEMM_HALF_ROWS` | 12 | 56 |", "| `GEMM_HALF_ROWS` | 12 | 65 |"),
         ("docs/simulator.md", "sim-cold-runs", "/ 6,482 |", "/ 6,842 |"),
         ("docs/simulator.md", "sim-cold-memory", "| 14.96 GiB |", "| 15.96 GiB |")]


@pytest.mark.parametrize("doc,name,original,planted", CELLS, ids=[c[1] for c in CELLS])
def test_a_changed_cell_of_a_catalog_or_cold_run_table_fails(doc, name, original, planted):
    text = (REPO / doc).read_text()
    (block,) = [m for m in marked_tables(text) if m.name == name]
    assert block.body.count(original) >= 1, f"{original!r} is no longer in {doc}'s {name}"
    changed = text[:block.start] + text[block.start:block.end].replace(original, planted, 1) + text[block.end:]
    (problem,) = check_text(changed, doc, REPO, names=[name])
    lines = problem.diff.splitlines()  # the doc's line (-) and the source's (+)
    assert problem.name == name and "differs from its dataset" in problem.message
    assert any(x.startswith("-") and planted in x for x in lines), problem.diff
    assert any(x.startswith("+") and original in x for x in lines), problem.diff
