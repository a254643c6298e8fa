"""Command-line options: one spelling for the same thing across commands."""

from __future__ import annotations

import argparse
import subprocess
import sys

from conftest import REPO
from orchestrator.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    return dict(sub.choices)


def test_output_option_is_output_everywhere_with_out_as_alias():
    commands = _subcommands()
    with_output = set()
    for name, p in commands.items():
        for action in p._actions:  # noqa: SLF001
            if {"--out", "--output"} & set(action.option_strings):
                assert "--output" in action.option_strings and "--out" in action.option_strings, (name, action)
                assert action.dest == "output", name
                with_output.add(name)
    assert with_output == {"run", "nightly", "report", "export-bench"}
    for argv in (["run", "s.yaml"], ["nightly", "s.yaml"], ["report", "results/s"],
                 ["export-bench", "results/s", "--trial", "t"]):
        for spelling in ("--output", "--out"):
            args = build_parser().parse_args([*argv, spelling, "D"])
            assert args.output == "D", (argv, spelling)


def test_help_of_report_shows_output():
    r = subprocess.run([sys.executable, "-m", "orchestrator", "report", "--help"], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "--output DIR, --out DIR" in r.stdout


def test_each_command_loads_only_its_own_module_and_parses_as_with_all():
    """``orchestrator CMD`` builds its parser from CMD's module alone (COMMANDS): every command the
    full parser knows is in the map, and parses the same arguments the same way from its module."""
    import importlib

    from orchestrator.cli import COMMANDS

    full = _subcommands()
    assert set(full) == set(COMMANDS)
    for name, module in COMMANDS.items():
        one = argparse.ArgumentParser()
        importlib.import_module(module).register(one.add_subparsers(dest="command"))
        (sub,) = [a for a in one._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
        assert name in sub.choices, (name, module)
    for argv in (["run", "s.yaml", "--trials", "3"], ["show", "results/s"], ["make-model", "tiny-llama", "D"],
                 ["-v", "pareto", "results/s"]):
        assert vars(build_parser(argv).parse_args(argv)) == \
            {k: v for k, v in vars(build_parser().parse_args(argv)).items()}, argv
    # what a run does not need: the simulator's standalone server (FastAPI) and the report
    r = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import build_parser; "
                        "build_parser(['run', 's.yaml']); print(sorted(m for m in sys.modules if m in "
                        "('orchestrator.commands.serve_sim', 'orchestrator.commands.report', 'fastapi')))"],
                       cwd=REPO, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout
