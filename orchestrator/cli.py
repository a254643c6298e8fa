"""Command line: ``orchestrator <command> ...``.

Thin: each command lives in ``orchestrator/commands/<name>.py`` with a
``register(subparsers)`` function; this module only collects them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Optional, Sequence

# One module per command group; each adds its sub-commands.
COMMAND_MODULES = (
    "orchestrator.commands.run",
    "orchestrator.commands.inspect",
    "orchestrator.commands.model",
    "orchestrator.commands.recommend",
    "orchestrator.commands.plan",
    "orchestrator.commands.report",
    "orchestrator.commands.nightly",
    "orchestrator.commands.bench",
    "orchestrator.commands.serve_sim",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orchestrator",
                                description="Find the best vLLM serving configuration with Ray Tune + Optuna.")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # deferred: keeps `import orchestrator.cli` light (these load pandas, pyarrow); the commands load them anyway
    from orchestrator.results.definition import StudyDefinitionError
    from orchestrator.results.query import ResultsPathError
    from orchestrator.search.resume import DamagedState

    try:
        return args.func(args)
    except (StudyDefinitionError, ResultsPathError, DamagedState) as e:  # a study.json, a results or state folder
        print(e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
