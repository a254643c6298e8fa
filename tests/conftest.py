"""Shared fixtures: paths, a small valid study document, and environment hygiene."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

BASE_STUDY = {
    "name": "unit",
    "engine": {"kind": "sim"},
    "model": {"name": "llama-3.1-8b"},
    "hardware": {"gpu": "H100-80GB", "gpus_per_node": 2},
    "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 20, "output_len": 32},
    "space": {
        "max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True},
        "max_num_batched_tokens": [2048, 8192],
    },
    "objectives": ["maximize output_throughput_per_gpu", "ttft_p99_ms"],
    "constraints": ["ttft_p99_ms <= 2000"],
}


@pytest.fixture
def study_doc():
    """A fresh, valid study document to mutate in a test."""
    return copy.deepcopy(BASE_STUDY)


@pytest.fixture
def repo() -> Path:
    return REPO
