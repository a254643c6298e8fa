"""The blocks of docs/benchmarks.md built from the datasets the simulator benchmarks store.

Each benchmark here writes its raw results with ``--output results/examples/<name>``; the tables,
the command and the figures beside them are computed from those files.
"""

from __future__ import annotations

from orchestrator.doc_tables import ci_coverage, fidelity_fit, multifidelity, search_efficiency
from orchestrator.doc_tables.blocks import DocBlock, text

_EX = "results/examples/"
SEARCH, MULTIFIDELITY = _EX + "search-efficiency", _EX + "multifidelity"
COVERAGE, FIT = _EX + "ci-coverage", _EX + "fidelity-fit"

BLOCKS: tuple[DocBlock, ...] = (
    text("ci-coverage-setup", (COVERAGE,), ci_coverage.coverage_setup),
    DocBlock("ci-coverage", (COVERAGE,), ci_coverage.coverage_table),
    text("ci-coverage-findings", (COVERAGE,), ci_coverage.coverage_findings),
    text("fidelity-fit-run", (FIT,), fidelity_fit.fit_run),
    DocBlock("fidelity-fit", (FIT,), fidelity_fit.fits_table),
    text("fidelity-fit-findings", (FIT,), fidelity_fit.fit_findings),
    text("search-efficiency-run", (SEARCH,), search_efficiency.efficiency_run),
    DocBlock("search-efficiency", (SEARCH,), search_efficiency.efficiency_table),
    text("search-efficiency-findings", (SEARCH,), search_efficiency.efficiency_findings),
    text("multifidelity-run", (MULTIFIDELITY,), multifidelity.multifidelity_run),
    DocBlock("multifidelity", (MULTIFIDELITY,), multifidelity.multifidelity_table),
    text("multifidelity-findings", (MULTIFIDELITY,), multifidelity.multifidelity_findings),
)
