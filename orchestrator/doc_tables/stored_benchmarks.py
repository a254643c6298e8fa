"""The blocks of docs/benchmarks.md built from the datasets the simulator benchmarks store.

Each benchmark here writes its raw results with ``--output results/examples/<name>``; the tables,
the command and the figures beside them are computed from those files.
"""

from __future__ import annotations

from orchestrator.doc_tables import multifidelity, search_efficiency
from orchestrator.doc_tables.blocks import DocBlock, text

_EX = "results/examples/"
SEARCH, MULTIFIDELITY = _EX + "search-efficiency", _EX + "multifidelity"

BLOCKS: tuple[DocBlock, ...] = (
    text("search-efficiency-run", (SEARCH,), search_efficiency.efficiency_run),
    DocBlock("search-efficiency", (SEARCH,), search_efficiency.efficiency_table),
    text("search-efficiency-findings", (SEARCH,), search_efficiency.efficiency_findings),
    text("multifidelity-run", (MULTIFIDELITY,), multifidelity.multifidelity_run),
    DocBlock("multifidelity", (MULTIFIDELITY,), multifidelity.multifidelity_table),
    text("multifidelity-findings", (MULTIFIDELITY,), multifidelity.multifidelity_findings),
)
