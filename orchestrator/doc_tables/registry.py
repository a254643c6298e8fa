"""The docs' generated blocks: each one registered with its dataset, checked against it.

A generated block sits between two markers in ``README.md`` or ``docs/*.md``: a table ::

    <!-- table: h200-capacity-study (results/examples/llama3-8b-h200) -->

    | trial | ... |

    <!-- /table -->

or a text, sentences whose figures (and the claims made of them) come from the dataset ::

    <!-- text: h200-interactive-verdict (results/examples/llama3-8b-h200-interactive) -->

    **Verdict, as measured: ...**

    <!-- /text -->

The name is a key of :data:`TABLES` (every block, of both kinds; the marker's kind must be the
registered one), the parenthesis the dataset(s) it is built from (the registry's, relative to the
repository root: a marker that names another dataset is an error, so the marker never misleads a
reader). ::

    python -m orchestrator.doc_tables.registry --check    # exit 1 and a diff when a block differs
    python -m orchestrator.doc_tables.registry --write    # rewrite every marked block in place
    python -m orchestrator.doc_tables.registry --write h200-capacity-study   # only this one

``tests/apps/test_docs_tables.py`` runs the check, so a block that drifts from its data (or data
that changes under its block) fails the test suite. Figures whose numbers are not in the
repository (a benchmark that prints and stores nothing) carry no marker.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from orchestrator.doc_tables import decisions as decision_tables
from orchestrator.doc_tables import fidelity_predictions
from orchestrator.doc_tables import h200
from orchestrator.doc_tables import kv as kv_tables
from orchestrator.doc_tables import sim_error
from orchestrator.doc_tables import sim_history
from orchestrator.doc_tables import start_phases
from orchestrator.doc_tables import trained as trained_tables
from orchestrator.doc_tables import window_noise
from orchestrator.doc_tables.blocks import KINDS, DocBlock
from orchestrator.doc_tables.blocks import text as text_block
from orchestrator.doc_tables.stored_benchmarks import BLOCKS as STORED_BENCHMARKS  # --- stored benchmarks
from orchestrator.doc_tables.texts.catalog import TEXTS
from orchestrator.results import repeatability

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m orchestrator.doc_tables.registry"


DocTable = DocBlock  # a block of kind "table" (the default)


_EX = "results/examples/"
TABLES: dict[str, DocBlock] = {t.name: t for t in (
    # docs/benchmarks.md
    DocTable("h200-ingress", (_EX + "h200-ingress",), h200.ingress_table),
    DocTable("h200-reference-levels", (_EX + "llama3-8b-h200-reference",), h200.capacity_levels_table),
    DocTable("h200-capacity-study", (_EX + "llama3-8b-h200",), h200.capacity_trials_table),
    DocTable("h200-fidelity-trials", (_EX + "llama3-8b-h200-fidelity",), h200.fidelity_trials_table),
    DocTable("h200-fidelity-vs-plain", (_EX + "llama3-8b-h200-fidelity", _EX + "llama3-8b-h200"),
             h200.fidelity_vs_plain_table),
    DocTable("h200-fidelity-levels-trials", (_EX + "llama3-8b-h200-fidelity-levels",), h200.fidelity_trials_table),
    DocTable("h200-fidelity-calibration", (_EX + "llama3-8b-h200-fidelity-levels", _EX + "llama3-8b-h200-fidelity"),
             h200.calibration_table),
    DocTable("h200-kv-fp8", (_EX + "llama3-8b-h200-kv-fp8",), h200.kv_dtype_table),
    DocTable("h200-interactive", (_EX + "llama3-8b-h200-interactive",), h200.interactive_table),
    DocTable("h200-multiturn", (_EX + "multiturn-h200-fixed",), h200.multiturn_table),
    DocTable("h200-multiturn-turns", (_EX + "multiturn-h200-fixed",), h200.multiturn_turns_table),
    DocTable("repeatability-capacity", (_EX + "repeatability-sim", _EX + "repeatability-cpu-vllm",
                                        _EX + "repeatability-h200", _EX + "repeatability-h100"),
             repeatability.repeatability_table),
    DocTable("window-noise", (_EX + "repeatability-h200", _EX + "repeatability-h100", _EX + "repeatability-cpu-vllm",
                              _EX + "repeatability-sim"), window_noise.docs_window_noise_table),
    DocTable("repeatability-fixed-rate", (_EX + "repeatability-sim", _EX + "repeatability-cpu-vllm",
                                          _EX + "repeatability-h100"), repeatability.fixed_rate_table),
    # docs/benchmarks.md: decisions
    DocTable("decisions-sim", (_EX + "decisions-sim",), decision_tables.decisions_table),
    DocTable("decisions-sim-intervals", (_EX + "decisions-sim",), decision_tables.interval_coverage_table),
    DocTable("starts", (_EX + "starts-h100", _EX + "starts-cpu-vllm"), decision_tables.starts_table),
    DocTable("starts-paired-h100", (_EX + "starts-h100",),
             functools.partial(decision_tables.paired_starts_table, better="tuned", baseline="defaults")),
    DocTable("starts-h100-one-machine", (_EX + "starts-h100-one-machine",), decision_tables.starts_table),
    DocTable("starts-paired-h100-one-machine", (_EX + "starts-h100-one-machine",),
             functools.partial(decision_tables.paired_starts_table, better="tuned", baseline="defaults")),
    # docs/benchmarks.md: where engine starts went
    DocTable("start-phases-h100", (_EX + "starts-h100",), start_phases.server_log_phases_table),
    DocTable("start-wall-h100", (_EX + "starts-h100-one-machine",), start_phases.server_up_table),
    DocTable("start-cache-cpu", (_EX + "start-cache-cpu-vllm",), start_phases.start_cache_table),
    DocTable("start-cache-h100", (_EX + "start-cache-h100",), start_phases.start_cache_table),
    DocTable("start-cache-h100-measured", (_EX + "start-cache-h100",), start_phases.start_cache_measured_table),
    # docs/benchmarks.md: learned weights
    DocTable("trained-quantization-h100", (_EX + "trained-base-quant-h100",), trained_tables.quantization_table),
    DocTable("trained-speculation-h100", (_EX + "trained-base-spec-h100",), trained_tables.speculation_table),
    # docs/simulator.md: the datasets replayed by the simulator with its current constants (and the
    # ingress runs against the earlier fits' simulators)
    DocTable("sim-vs-h200-ingress-cold-fit", (_EX + "h200-ingress",), sim_history.cold_fit_table),
    DocTable("sim-vs-h200-ingress-warm-refit", (_EX + "h200-ingress",), sim_history.warm_refit_table),
    DocTable("sim-vs-h200-ingress", (_EX + "h200-ingress",), h200.sim_ingress_table),
    DocTable("sim-vs-h200-capacity", (_EX + "llama3-8b-h200-reference", _EX + "llama3-8b-h200"),
             h200.sim_capacity_table),
    DocTable("kv-predicted-vs-logged", kv_tables.KV_DATASETS, kv_tables.kv_prediction_table),
    # docs/simulator.md: the simulator's out-of-sample error (benchmarks/sim_error.py's dataset)
    DocTable("fidelity-h100-predictions", (_EX + "fidelity-h100",), fidelity_predictions.predictions_table),
    DocTable("sim-error-by-gpu", (_EX + "sim-error",), sim_error.by_gpu_table),
    DocTable("sim-error-by-dataset", (_EX + "sim-error",), sim_error.by_dataset_table),
    DocTable("sim-error-fits", (_EX + "sim-error",), sim_error.fits_table),
    DocTable("sim-error-margins", (_EX + "sim-error",), sim_error.margins_table),
    text_block("sim-error-verdict", (_EX + "sim-error",), sim_error.verdict_text),
    text_block("sim-error-ranking", (_EX + "sim-error",), sim_error.ranking_text),
    # --- simulator benchmarks that store their datasets (docs/benchmarks.md; orchestrator/doc_tables/stored_benchmarks.py)
    *STORED_BENCHMARKS,
    # the prose beside them (orchestrator/doc_tables/texts/)
    *TEXTS,
)}

# --- the cold H200 runs, the simulator's constants, the shipped traces, prices and the fleet example
# A block whose source is the code itself (a catalog of constants, the sizing rule) names the module
# in its marker, relative to the repository root, where a dataset's block names the dataset.
from orchestrator.apps import plan as _plan  # noqa: E402
from orchestrator.doc_tables import catalogs  # noqa: E402
from orchestrator.doc_tables import cold_runs as cold_run_tables  # noqa: E402
from orchestrator.hardware import pricing as _pricing  # noqa: E402
from orchestrator.sim import cost as _cost  # noqa: E402


def _module(module) -> str:
    return Path(module.__file__).resolve().relative_to(ROOT).as_posix()


_COLD = _EX + "h200-cold-runs"
TABLES.update({t.name: t for t in (
    # docs/simulator.md: calibration against the cold runs, and the constants fit by fit
    text_block("sim-cold-runs-setup", (_COLD,), cold_run_tables.calibration_setup),
    DocTable("sim-cold-runs", (_COLD,), cold_run_tables.cold_runs_table),
    DocTable("sim-cold-memory", (_COLD,), cold_run_tables.memory_table),
    text_block("sim-cold-runs-findings", (_COLD, _EX + "h200-ingress"), cold_run_tables.cold_findings),
    DocTable("sim-constants", (_module(_cost),), lambda _source: sim_history.constants_table(_cost)),
    # docs/workloads.md, docs/metrics.md, docs/planning.md
    DocTable("shipped-traces", ("search_spaces/traces",), catalogs.traces_table),
    DocTable("gpu-prices", (_module(_pricing),), catalogs.price_table),
    text_block("planning-fleet-example-setup", (_module(_plan),), catalogs.fleet_example_setup),
    DocTable("planning-fleet-example", (_module(_plan),), catalogs.fleet_example_table),
)})

# --- docs/trained-models.md: the tiny trained model probed on CPU vLLM (benchmarks/trained_probe.py's dataset)
from orchestrator.doc_tables import trained_cpu  # noqa: E402

_PROBE_CPU = _EX + "trained-probe-cpu-vllm"
TABLES.update({t.name: t for t in (
    text_block("trained-probe-cpu-setup", (_PROBE_CPU,), trained_cpu.probe_setup),
    DocTable("trained-probe-cpu", (_PROBE_CPU,), trained_cpu.probe_table),
    text_block("trained-probe-cpu-findings", (_PROBE_CPU,), trained_cpu.probe_findings),
    text_block("trained-probe-cpu-guardrail", (_PROBE_CPU,), trained_cpu.probe_guardrail),
    text_block("trained-tiny-training", (_PROBE_CPU,), trained_cpu.training_measured),
)})


# --- benchmarks that time things: each stores its runs under results/examples (docs/benchmarks.md)
from orchestrator.doc_tables import loadgen_fidelity as _loadgen  # noqa: E402
from orchestrator.doc_tables import overhead as _overhead  # noqa: E402
from orchestrator.doc_tables import scaling as _scaling  # noqa: E402
from orchestrator.doc_tables import start_cost as _start_cost  # noqa: E402

_OVERHEAD = _EX + "orchestration-overhead"
_START_COST = _EX + "run-start-cost"
_SCALING = _EX + "parallel-scaling"
_LOADGEN = _EX + "loadgen-fidelity"
TABLES.update({t.name: t for t in (
    text_block("orchestration-overhead-setup", (_OVERHEAD,), _overhead.overhead_setup),
    DocTable("orchestration-overhead", (_OVERHEAD,), _overhead.overhead_table),
    text_block("orchestration-overhead-findings", (_OVERHEAD,), _overhead.overhead_findings),
    text_block("run-start-cost-setup", (_START_COST,), _start_cost.start_cost_setup),
    DocTable("run-start-cost", (_START_COST,), _start_cost.start_cost_table),
    text_block("run-start-cost-findings", (_START_COST,), _start_cost.start_cost_findings),
    text_block("parallel-scaling-setup", (_SCALING,), _scaling.scaling_setup),
    DocTable("parallel-scaling", (_SCALING,), _scaling.scaling_table),
    text_block("parallel-scaling-findings", (_SCALING,), _scaling.scaling_findings),
    text_block("loadgen-fidelity-setup", (_LOADGEN,), _loadgen.setup_text),
    DocTable("loadgen-fidelity-cpu", (_LOADGEN,), _loadgen.cpu_table),
    text_block("loadgen-fidelity-definitions", (_LOADGEN,), _loadgen.definitions_text),
    DocTable("loadgen-fidelity-sim", (_LOADGEN,), _loadgen.sim_table),
    DocTable("loadgen-fidelity-ladder", (_LOADGEN,), _loadgen.ladder_table),
    DocTable("loadgen-fidelity-truth", (_LOADGEN,), _loadgen.truth_table),
    text_block("loadgen-fidelity-findings", (_LOADGEN,), _loadgen.findings),
)})


def render(name: str, root: Path = ROOT) -> str:
    """The markdown of block ``name``, built from its datasets under ``root``."""
    return _render(name, str(Path(root).resolve()))


@functools.lru_cache(maxsize=None)
def _render(name: str, root: str) -> str:
    block = TABLES[name]
    return block.build(*(Path(root) / d for d in block.datasets)).strip("\n")


# ---------------------------------------------------------------- markers
_KIND = "|".join(KINDS)
_BLOCK = re.compile(rf"^<!-- (?P<kind>{_KIND}): (?P<name>[\w.-]+) \((?P<datasets>[^)]*)\)[^\n]*?-->\n"
                    r"(?P<body>.*?)"
                    r"^<!-- /(?P=kind) -->$", re.MULTILINE | re.DOTALL)
_START = re.compile(rf"^<!-- (?:{_KIND}):", re.MULTILINE)


@dataclass(frozen=True)
class Marked:
    """A marked block in a markdown file: what the markers say and the text between them."""

    kind: str
    name: str
    datasets: tuple[str, ...]
    body: str  # stripped
    start: int  # span of the body in the file's text
    end: int
    line: int  # of the opening marker, from 1


def marked_tables(text: str) -> list[Marked]:
    """Every marked block of ``text``; an opening marker without its closing one raises ValueError."""
    found = []
    for m in _BLOCK.finditer(text):
        datasets = tuple(d.strip() for d in m.group("datasets").split(",") if d.strip())
        found.append(Marked(m.group("kind"), m.group("name"), datasets, m.group("body").strip("\n"), m.start("body"),
                            m.end("body"), text.count("\n", 0, m.start()) + 1))
    if len(found) != len(_START.findall(text)):
        raise ValueError("an opening '<!-- KIND: NAME (DATASETS) -->' without its '<!-- /KIND -->' "
                         f"(found {len(_START.findall(text))} openings, {len(found)} complete blocks)")
    return found


def doc_files(root: Path = ROOT) -> list[Path]:
    """The files that may hold marked blocks: ``README.md`` and ``docs/*.md``."""
    return [Path(root) / "README.md", *sorted((Path(root) / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Problem:
    """A marked block that is not what its dataset gives: ``diff`` (unified) or ``message``."""

    path: str
    name: str
    line: int
    message: str
    diff: str = ""
    kind: str = "table"

    def __str__(self) -> str:
        head = f"{self.path}:{self.line}: {self.kind} {self.name}: {self.message}"
        return head + (f"\n{self.diff}" if self.diff else "")


def table_diff(expected: str, actual: str, label: str) -> str:
    """A unified diff from the text in the doc to the regenerated text."""
    return "\n".join(difflib.unified_diff(actual.splitlines(), expected.splitlines(), f"{label} (in the doc)",
                                          f"{label} (from its dataset)", lineterm=""))


def check_text(text: str, path: str = "<text>", root: Path = ROOT,
               names: Optional[Sequence[str]] = None) -> list[Problem]:
    """The marked blocks of one file's text that differ from their datasets (an empty list: all equal)."""
    problems = []
    for m in marked_tables(text):
        if names and m.name not in names:
            continue
        block = TABLES.get(m.name)
        if block is None:
            problems.append(Problem(path, m.name, m.line, f"no such block (known: {', '.join(sorted(TABLES))})",
                                    kind=m.kind))
            continue
        if m.kind != block.kind:
            problems.append(Problem(path, m.name, m.line, f"the marker says {m.kind}; {m.name} is a {block.kind} "
                                    f"(<!-- {block.kind}: {m.name} ... -->)", kind=m.kind))
            continue
        if m.datasets != block.datasets:
            problems.append(Problem(path, m.name, m.line, f"the marker names {', '.join(m.datasets) or 'no dataset'}; "
                                    f"the {block.kind} is built from {', '.join(block.datasets)}", kind=m.kind))
            continue
        expected = render(m.name, root)
        if m.body != expected:
            problems.append(Problem(path, m.name, m.line, f"differs from its dataset (`{COMMAND} --write` rewrites it)",
                                    table_diff(expected, m.body, f"{path}:{m.line} {m.name}"), kind=m.kind))
    return problems


def rewrite_text(text: str, root: Path = ROOT, names: Optional[Sequence[str]] = None) -> str:
    """``text`` with every marked block (or those of ``names``) replaced by what its dataset gives."""
    out, last = [], 0
    for m in marked_tables(text):
        if m.name not in TABLES or TABLES[m.name].kind != m.kind or (names and m.name not in names):
            continue
        out += [text[last:m.start], "\n", render(m.name, root), "\n\n"]
        last = m.end
    return "".join(out) + text[last:]


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 and print a diff when a marked block differs")
    mode.add_argument("--write", action="store_true", help="rewrite the marked blocks in place")
    mode.add_argument("--list", action="store_true", help="list the registered blocks and where they are marked")
    p.add_argument("names", nargs="*", help="only these blocks (default: all)")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository (datasets are relative to it)")
    p.add_argument("--doc", type=Path, action="append", dest="docs",
                   help="this markdown file (repeatable; default: README.md and docs/*.md)")
    a = p.parse_args(argv)
    unknown = sorted(set(a.names) - set(TABLES))
    if unknown:
        p.error(f"no such block: {', '.join(unknown)} (known: {', '.join(sorted(TABLES))})")
    files = a.docs or doc_files(a.root)
    if a.list:
        where = {m.name: f"{_display(f, a.root)}:{m.line}" for f in files for m in marked_tables(f.read_text())}
        for t in TABLES.values():
            print(f"{t.kind} {t.name}: {', '.join(t.datasets)} -> {where.get(t.name, 'not marked in any doc')}")
        return 0
    problems = []
    for f in files:
        text = f.read_text()
        if a.write:
            new = rewrite_text(text, a.root, a.names)
            if new != text:
                f.write_text(new)
                print(f"rewrote {_display(f, a.root)}")
        problems += check_text(f.read_text(), _display(f, a.root), a.root, a.names)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems and a.check:
        marked = [m.kind for f in files for m in marked_tables(f.read_text())]
        print(f"every marked block equals its dataset ({marked.count('table')} tables, {marked.count('text')} texts)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
