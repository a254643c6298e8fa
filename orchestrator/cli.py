"""Command line: ``orchestrator <command> ...``.

Thin: each command lives in a module of ``orchestrator/commands/`` with a
``register(subparsers)`` function; this module only collects them, and loads only the
module of the command it is given.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Optional, Sequence

# Each command and the module that adds it (``register(subparsers)``): a command imports only its own
# module, so ``orchestrator run`` does not load the simulator's HTTP server or the report's plots.
COMMANDS = {
    "run": "orchestrator.commands.run",
    "validate": "orchestrator.commands.run",
    "show": "orchestrator.commands.inspect",
    "pareto": "orchestrator.commands.inspect",
    "make-model": "orchestrator.commands.model",
    "recommend": "orchestrator.commands.recommend",
    "plan": "orchestrator.commands.plan",
    "report": "orchestrator.commands.report",
    "nightly": "orchestrator.commands.nightly",
    "export-bench": "orchestrator.commands.bench",
    "import-bench": "orchestrator.commands.bench",
    "export-workload": "orchestrator.commands.bench",
    "make-traces": "orchestrator.commands.bench",
    "serve-sim": "orchestrator.commands.serve_sim",
}


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: with only its command's module when ``argv`` names one, with every
    command otherwise (``--help``, a usage error: the list shows them all)."""
    p = argparse.ArgumentParser(prog="orchestrator",
                                description="Find the best vLLM serving configuration with Ray Tune + Optuna.")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    sub = p.add_subparsers(dest="command", required=True)
    named = next((a for a in argv or () if not a.startswith("-")), None)
    modules = [COMMANDS[named]] if named in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
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
