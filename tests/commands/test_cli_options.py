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
