"""The memory model against real vLLM: the KV cache size it predicts vs the one vLLM logged.

vLLM logs ``GPU KV cache size: N tokens`` at start; the ``vllm`` engine keeps N in each
row (``kv_cache_tokens``). Each row is predicted again from its study definition and
parameters through the pre-flight (:func:`orchestrator.search.feasibility.check`, which is
:func:`orchestrator.hardware.start.start_plan` on GPUs, the simulator's own start, and vLLM-CPU's
fixed KV space on CPUs), so the table checks the one function both use. Measured CPU sizes
without a result dataset come from :data:`orchestrator.search.feasibility.CPU_KV_REFERENCE`.
Identical configurations with identical logged sizes are one line (``trials``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from orchestrator.doc_tables.h200 import markdown, params_of, trials_of
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.results.definition import read_study_definition
from orchestrator.results.query import study_dirs
from orchestrator.search import feasibility

# Predicted within this share of the logged size (docs/simulator.md states it).
KV_TOLERANCE = 0.03
# Every dataset with vLLM's logged KV cache sizes (relative to the repository root).
KV_DATASETS = tuple("results/examples/" + d for d in (
    "llama3-8b-h200", "llama3-8b-h200-interactive", "llama3-8b-h200-kv-fp8", "llama3-8b-h200-fidelity",
    "llama3-8b-h200-fidelity-levels", "multiturn-h200-fixed", "repeatability-cpu-vllm"))


def _config(args: EngineArgs) -> str:
    cells = [f"TP {args.tensor_parallel_size}", f"seqs {args.max_num_seqs}", f"batch {args.max_num_batched_tokens}",
             f"mem {args.gpu_memory_utilization:.2f}", f"len {args.max_model_len}", f"kv {args.kv_cache_dtype}"]
    if args.enforce_eager:
        cells.append("eager")
    if args.extra.get("kv_cache_memory_bytes"):
        cells.append(f"kv bytes {int(args.extra['kv_cache_memory_bytes']):,}")
    return ", ".join(cells)


def predictions(*paths: Path) -> list[dict[str, Any]]:
    """One dict per distinct (dataset, configuration, logged size): what vLLM logged and what the
    pre-flight predicts."""
    seen: Counter = Counter()
    found: dict[tuple, dict[str, Any]] = {}
    for path in map(Path, paths):
        for study_dir in study_dirs(path):
            study = read_study_definition(str(study_dir))
            rows = trials_of(study_dir)
            for _, row in rows[rows["kv_cache_tokens"].notna()].iterrows():
                args = feasibility.resolve_args(study, study.engine_args(params_of(row)))
                verdict = feasibility.check(study, args)
                key = (path.name, study.model.name, study.hardware.gpu, _config(args), int(row["kv_cache_tokens"]))
                found.setdefault(key, {"predicted": verdict.kv_cache_tokens})
                seen[key] += 1
    out = []
    for key, got in found.items():
        dataset, model, device, config, logged = key
        out.append({"dataset": dataset, "model": model, "device": device, "config": config, "trials": seen[key],
                    "logged": logged, "predicted": got["predicted"]})
    return out


def kv_prediction_table(*paths: Path) -> str:
    """Predicted vs logged KV cache tokens, one line per distinct configuration."""
    lines = []
    for p in predictions(*paths):
        err = "–" if p["predicted"] is None else f"{p['predicted'] / p['logged'] - 1:+.2%}"
        predicted = "–" if p["predicted"] is None else f"{p['predicted']:,}"
        lines.append([p["dataset"], p["model"], p["device"], p["config"], str(p["trials"]), f"{p['logged']:,}",
                      predicted, err])
    return markdown(["dataset", "model", "device", "configuration", "trials", "vLLM logged (tokens)",
                     "predicted (tokens)", "error"], "llllrrrr", lines)
