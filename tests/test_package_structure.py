"""The package's shape: packages by layer, no import cycle, a short top level, no oversized module.

Function-level imports hide dependencies from a reader and from import-time checks; a cycle
through them still ties two concepts together, and so does one through imports made for
annotations only (``if TYPE_CHECKING:``). The graph here is every ``import`` /
``from ... import`` statement anywhere in a module, between modules of ``orchestrator``.
Edges Python adds without an ``import`` line of the module's own are counted too: importing
a submodule runs its package's ``__init__`` first, so a module outside a package that imports
anything in it depends on what the ``__init__`` imports; a module inside the package that
imports from the package itself (``from orchestrator.search import feasibility``, ``from .
import x``) reads the namespace the ``__init__`` builds, and depends on what it imports too
(``from orchestrator.search.feasibility import check`` does not: the ``__init__`` already ran).
A ``"orchestrator.x:Name"`` string (the engine registry's lazy targets) is an import when it is
used.

The packages form layers (:data:`LAYERS`, docs/architecture.md): a module imports only from
its own package and from the layers below it.

A function-level import is there only to defer a heavy dependency (:data:`HEAVY_PACKAGES`:
optional, or slow to import where ``orchestrator validate`` and ``show`` do not need it), and
says so: one that imports no heavy package carries a ``# deferred:`` comment saying why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
MAX_LINES = 420  # "about 400": one concept per module
MAX_FUNCTION_LINES = 80  # a function (its nested functions included) in the packages held to it
FUNCTION_LIMITED = ("loadgen",)  # packages held to MAX_FUNCTION_LINES
MAX_TOP_LEVEL_MODULES = 10
# Bottom first. A module may import from its own package and from any lower layer; the
# top-level modules are the vocabulary every layer shares.
# Deferred at function level without further comment: optional, or slow to import (ray ~0.3 s,
# ray.tune ~0.7 s, torch seconds) where the CLI's light commands load the module.
HEAVY_PACKAGES = frozenset({"ray", "optuna", "vllm", "torch", "transformers", "tokenizers", "matplotlib"})
DEFERRED = "# deferred:"
# Being rewritten on another branch: their function-level imports are not checked yet. Remove each
# entry once it passes (test_unchecked_deferrals_are_still_needed says when).
LAYERS = (
    ("failures", "numbers", "redaction", "strict_model"),
    ("workload",),
    ("measure", "models"),
    ("hardware",),
    ("study",),
    ("results", "sim", "cluster", "loadgen"),
    ("engines",),
    ("trial",),
    ("search",),
    ("apps",),
    ("doc_tables",),
    ("commands",),
    ("cli",),
    ("__main__",),
)


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(p, package): p for p in package.rglob("*.py")}


_TARGET = re.compile(r"^(orchestrator(?:\.\w+)+):\w+$")


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The orchestrator module an imported name lives in (a package's submodule or the package)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _TARGET.match(node.value):
                targets = [_TARGET.match(node.value).group(1)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                if t.startswith("orchestrator"):
                    dep = _resolve(t, modules)
                    named = dep  # what the statement names: a module, or a package itself
                    while dep is not None and dep != "orchestrator":  # the module and the packages above it
                        # Its own package only where the statement imports from the package: the
                        # names its __init__ binds (everything the __init__ imports).
                        if dep != mod and (not mod.startswith(dep + ".") or dep == named):
                            graph[mod].add(dep)
                        dep = dep.rpartition(".")[0] or None
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_an_import_from_its_own_package_closes_a_cycle_through_the_init(tmp_path):
    """``search/__init__`` imports the driver, the driver a plan, the plan ``from orchestrator.search
    import feasibility``: a cycle through the ``__init__``. Naming the module itself is none."""
    search = tmp_path / "orchestrator" / "search"
    search.mkdir(parents=True)
    (search.parent / "__init__.py").write_text("")
    (search / "__init__.py").write_text("from orchestrator.search.driver import run\n")
    (search / "driver.py").write_text("from orchestrator.search.plan import plan\n")
    (search / "feasibility.py").write_text("")
    (search / "plan.py").write_text("from orchestrator.search import feasibility\n")
    assert cycles(import_graph(search.parent)) == [["orchestrator.search", "orchestrator.search.driver",
                                                    "orchestrator.search.plan"]]
    (search / "plan.py").write_text("from . import feasibility\n")
    assert len(cycles(import_graph(search.parent))) == 1
    (search / "plan.py").write_text("from orchestrator.search.feasibility import check\n")
    assert cycles(import_graph(search.parent)) == []
    (search / "__init__.py").write_text("")  # a light __init__: naming the package is no cycle
    (search / "plan.py").write_text("from orchestrator.search import feasibility\n")
    assert cycles(import_graph(search.parent)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_about_400_lines():
    big = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """Functions and methods over ``limit`` lines; a nested function counts in its parent's lines."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := child.end_lineno - child.lineno + 1) > limit:
                    found[prefix + child.name] = n
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_no_function_over_80_lines_in_the_packages_held_to_it():
    long = {f"{p.relative_to(PACKAGE.parent).as_posix()}:{name}": n
            for pkg in FUNCTION_LIMITED for p in sorted((PACKAGE / pkg).rglob("*.py"))
            for name, n in long_functions(p.read_text()).items()}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them by phase): {long}"


def test_the_function_length_check_counts_nested_functions_in_their_parent():
    inner = "    def inner():\n" + "        x = 1\n" * 3
    source = "def outer():\n" + inner + "    return inner\nclass C:\n    def m(self):\n" + "        y = 2\n" * 4
    assert long_functions(source, limit=4) == {"outer": 6, "C.m": 5}
    assert long_functions(source, limit=6) == {}


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at import time (including inside top-level if/try blocks)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))
    visit(tree.body)
    return names


def test_every_from_import_names_something_the_module_defines():
    """``from orchestrator.x import name`` anywhere (function bodies, tests, benchmarks) must find
    ``name`` in x: a function-level import of a moved name fails only on the path that runs it."""
    modules = _modules()
    defined = {m: _top_level_names(ast.parse(p.read_text())) for m, p in modules.items()}
    missing = []
    users = dict(modules)
    for extra in ("tests", "benchmarks"):
        users.update({str(p.relative_to(PACKAGE.parent)): p for p in (PACKAGE.parent / extra).rglob("*.py")})
    for mod, path in users.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestrator"):
                if node.module not in modules:
                    missing.append(f"{mod}: no module {node.module}")
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if alias.name != "*" and alias.name not in defined[node.module] and sub not in modules:
                        missing.append(f"{mod}: {node.module} has no {alias.name}")
    assert not missing, "\n".join(sorted(set(missing)))


def _layer_of(module: str) -> int:
    top = module.split(".")[1] if module != "orchestrator" else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: its package {top!r} is in no layer of LAYERS (add it, and to docs/architecture.md)")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that reach up (or across, between packages of one layer)."""
    bad = []
    for mod, deps in graph.items():
        if mod == "orchestrator":
            continue
        for dep in deps:
            if dep == "orchestrator" or dep.split(".")[1] == mod.split(".")[1]:
                continue
            if _layer_of(dep) >= _layer_of(mod):
                bad.append(f"{mod} -> {dep}")
    return sorted(bad)


def test_packages_import_only_from_lower_layers():
    bad = layer_violations(import_graph())
    assert not bad, "imports against the layers (LAYERS, docs/architecture.md):\n" + "\n".join(bad)


def test_the_layer_check_finds_an_upward_import():
    graph = {"orchestrator.measure.metrics": {"orchestrator.study.judge"}, "orchestrator.study.judge": set()}
    assert layer_violations(graph) == ["orchestrator.measure.metrics -> orchestrator.study.judge"]
    assert layer_violations({"orchestrator.study.judge": {"orchestrator.measure.metrics"}}) == []


def test_a_short_top_level():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_tests_mirror_the_packages():
    """A folder of tests is named after the package it tests (``tests/<package>/``); helpers shared
    by several test modules live in ``tests/support`` (or conftest.py), data in ``tests/data``."""
    tests = PACKAGE.parent / "tests"
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders - packages <= {"support", "data"}, sorted(folders - packages - {"support", "data"})


def unexplained_deferrals(source: str) -> list[int]:
    """Lines of function-level imports that import no heavy package and carry no ``# deferred:``
    comment: on the statement, on the line above it, or above the run of imports it closes."""
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [n for body in fn.body for n in ast.walk(body) if isinstance(n, (ast.Import, ast.ImportFrom))]
    explained: set[int] = set()  # end lines of imports a comment covers
    bad = []
    for node in sorted(set(found), key=lambda n: n.lineno):
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        if (DEFERRED in "\n".join(lines[node.lineno - 1:node.end_lineno]) or above.startswith(DEFERRED)
                or node.lineno - 1 in explained):
            explained.add(node.end_lineno)
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or "."]
        if getattr(node, "level", 0) or not all(n.split(".")[0] in HEAVY_PACKAGES for n in names):
            bad.append(node.lineno)
    return bad


def _deferral_problems() -> dict[str, list[int]]:
    problems = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        bad = unexplained_deferrals(path.read_text())
        if bad:
            problems[path.relative_to(PACKAGE.parent).as_posix()] = bad
    return problems


def test_function_level_imports_defer_a_heavy_dependency_and_say_why():
    bad = [f"{p}:{n}" for p, lines in _deferral_problems().items() for n in lines]
    assert not bad, ("function-level imports that import no heavy package (HEAVY_PACKAGES) and give no "
                     "reason: move them to the top of the module, or add a '# deferred: why' comment\n"
                     + "\n".join(bad))


def test_the_deferral_check_finds_an_unexplained_import():
    source = (
        "import json\n"                                      # 1: top level
        "def f():\n"
        "    import yaml\n"                                  # 3: no reason
        "    import ray\n"                                   # 4: heavy
        "    from optuna.trial import TrialState\n"          # 5: heavy
        "    from orchestrator.search import run_study\n"    # 6: not heavy, not covered by the two above
        "def g():\n"
        "    # deferred: pulls optuna\n"
        "    from orchestrator.search.grid_sampler import GridSampler\n"  # 9: explained
        "    from orchestrator.search import samplers\n"     # 10: same run, same comment
        "\n"
        "    from orchestrator.results import load_trials\n"  # 12: a new run
        "    import os  # deferred: a reason on the line\n"  # 13: explained
        "    class C:\n"
        "        def m(self):\n"
        "            from . import x\n"                      # 16: relative, no reason
    )
    assert unexplained_deferrals(source) == [3, 6, 12, 16]
