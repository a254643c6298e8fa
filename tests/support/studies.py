"""Study documents for the tests, and running a study in the test's process as ``orchestrator run`` does.

The builders return plain study documents (what a study file holds), to pass to ``parse_study`` or to
write as YAML: a small valid study of each engine, with the test's own sections merged in
(:func:`merged`). What a test is about stays at its call site, as an override."""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Mapping, Optional

import pandas as pd

from orchestrator.results import load_trials
from orchestrator.search.driver import run_study
from orchestrator.study.state_dir import local_state_dir
from support import vllm_processes

StudyDoc = dict[str, Any]

# The simulated engine in virtual time (no HTTP, no sleeping): ``engine={"mode": "served"}`` for a
# Serve application in real time. No workload: a study file's default unless the test gives one.
SIM_DOC: StudyDoc = {
    "name": "sim",
    "engine": {"kind": "sim", "mode": "virtual"},
    "model": {"name": "llama-3.1-8b"},
    "hardware": {"gpu": "H100-80GB"},
    "space": {"max_num_seqs": 8},
    "objectives": ["maximize output_throughput"],
}

# vLLM's CPU build on a tiny model: 8 MiB of KV cache (4,096 tokens of tiny-llama in float32), eager
# (no torch.compile of the model), short prompts; no pre-flight: whether a configuration starts is the
# engine's to say.
CPU_KV_BYTES = 8 << 20
CPU_VLLM_DOC: StudyDoc = {
    "name": "cpu-vllm",
    "engine": {"kind": "vllm", "platform": "cpu", "start_timeout_s": 600,
               "engine_kwargs": {"kv_cache_memory_bytes": CPU_KV_BYTES}},
    "model": {"name": "tiny-llama", "dtype": "float32"},
    "hardware": {"gpu": "CPU"},
    "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 8, "warmup_requests": 1,
                 "input_len": 32, "output_len": 16, "timeout_s": 60},
    "space": {"max_model_len": 1024, "enforce_eager": True},
    "objectives": ["maximize output_throughput"],
    "search": {"preflight": False},
}

# An endpoint that already runs: a short load of short requests.
EXTERNAL_DOC: StudyDoc = {
    "name": "ext",
    "engine": {"kind": "external"},
    "model": {"name": "llama-3.1-8b"},
    "hardware": {"gpu": "H100-80GB"},
    "workload": {"arrival": {"kind": "poisson", "rate": 40}, "num_requests": 20, "warmup_requests": 1,
                 "input_len": 16, "output_len": 4, "timeout_s": 30},
    "space": {"max_num_seqs": 8},
    "objectives": ["maximize output_throughput"],
}


def merged(doc: Mapping[str, Any], **sections: Any) -> StudyDoc:
    """A copy of ``doc`` with ``sections`` merged in, section by section: a mapping is merged key by key
    into the section of that name (the given keys first, in their order, then those of ``doc``'s section
    they do not name: a space given whole keeps its order, the order its parameters are suggested in; a
    key's value replaces the old one whole); anything else (a list, a number, a string) replaces the
    section. Replace a mapping section whole with ``merged(...) | {"space": {...}}``."""
    out = copy.deepcopy(dict(doc))
    for name, value in copy.deepcopy(sections).items():
        old = out.get(name)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            value = {**value, **{k: v for k, v in old.items() if k not in value}}
        out[name] = value
    return out


def sim_doc(**sections: Any) -> StudyDoc:
    """A study of the simulated engine (:data:`SIM_DOC`) with ``sections`` merged in."""
    return merged(SIM_DOC, **sections)


def cpu_vllm_doc(model_dir: Optional[Path | str], *, one_process: bool = True, **sections: Any) -> StudyDoc:
    """A study of vLLM's CPU build serving ``model_dir`` (:data:`CPU_VLLM_DOC`) with ``sections`` merged in.
    ``one_process``: the model run inside the engine core process (``support.vllm_processes.one_process``);
    False keeps vLLM's default, a worker process of its own."""
    doc = merged(CPU_VLLM_DOC, **sections)
    if model_dir is not None:
        doc["engine"] = {**doc["engine"], "model_source": str(model_dir)}
    if one_process:
        doc["engine"] = vllm_processes.one_process(doc["engine"])
    return doc


def external_doc(base_url: str, **sections: Any) -> StudyDoc:
    """A study of the endpoint at ``base_url`` (:data:`EXTERNAL_DOC`) with ``sections`` merged in."""
    return merged(merged(EXTERNAL_DOC, engine={"base_url": base_url}), **sections)


def run_printed(study, serve_port: int = 8131) -> tuple[pd.DataFrame, str]:
    """The study through ``run_study`` on the Ray this process is connected to: its rows and
    what it printed."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        run = run_study(study, serve_port=serve_port)
    return load_trials(run.study_dir), printed.getvalue()


def tune_trials(study) -> list[dict]:
    """The params of every Tune trial that ran (from Tune's own experiment state)."""
    out = []
    for state in (local_state_dir(study) / "_tune").rglob("experiment_state-*.json"):
        for entry in json.loads(state.read_text())["trial_data"]:
            out.append(json.loads(entry[0])["config"] if isinstance(entry, list) else entry["config"])
    return out
