"""The memory model predicts the KV cache vLLM logs at start within 3%, on every logged trial.

Each row of the datasets that hold vLLM's ``GPU KV cache size: N tokens`` (H200 studies,
CPU vLLM runs, the CPU reference file) is predicted again through the pre-flight, the
function the simulator starts with. The table in docs/simulator.md is built from the same
list (``kv-predicted-vs-logged``, kept equal by tests/apps/test_docs_tables.py).
"""

from __future__ import annotations

from orchestrator.doc_tables.registry import ROOT, TABLES
from orchestrator.doc_tables.kv import KV_DATASETS, KV_TOLERANCE, predictions


def test_predicted_kv_cache_is_within_3_percent_of_vllm_logged():
    got = predictions(*(ROOT / d for d in KV_DATASETS))
    assert {p["device"] for p in got} >= {"H200", "CPU"}
    assert sum(p["trials"] for p in got) >= 20, got  # the datasets were read, not skipped
    for p in got:
        assert p["predicted"] is not None, p  # the pre-flight says it starts: it did
        assert abs(p["predicted"] / p["logged"] - 1) <= KV_TOLERANCE, p


def test_the_docs_table_is_registered_on_those_datasets():
    assert TABLES["kv-predicted-vs-logged"].datasets == KV_DATASETS
