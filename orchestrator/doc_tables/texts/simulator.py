"""docs/simulator.md's prose beside its generated tables: the KV-cache predictions' error band and the
simulator's scores against every warm H200 measurement (replayed with its current constants)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.apps.measured_replay import error_summary
from orchestrator.doc_tables.blocks import paragraph, series
from orchestrator.doc_tables.h200 import simulated_points
from orchestrator.doc_tables.kv import predictions


def kv_error_band(*paths: Path) -> str:
    rows = [p for p in predictions(*paths) if p["predicted"] is not None]
    gpu = [dict(p, err=p["predicted"] / p["logged"] - 1) for p in rows if p["device"] != "CPU"]
    cpu = [p for p in rows if p["device"] == "CPU"]
    devices = sorted({p["device"] for p in gpu})
    bound = max(abs(p["err"]) for p in gpu)
    high = sorted(gpu, key=lambda p: -p["err"])[:3]
    low = min(gpu, key=lambda p: p["err"])
    batches = sorted({int(p["config"].split("batch ")[1].split(",")[0]) for p in high})
    exact = all(p["predicted"] == p["logged"] for p in cpu)
    return paragraph(
        f"All {' and '.join(devices)} predictions are within {bound:.1%} ({min(p['err'] for p in gpu):+.2%} to "
        f"{max(p['err'] for p in gpu):+.2%}); the three largest over-predictions are at "
        f"`max_num_batched_tokens` {series([f'{b:,}' for b in batches])} (the model's activation peak is smaller than "
        f"vLLM's at small budgets) and the largest under-prediction, {low['err']:+.2%}, is at {low['config']}.",
        ("The CPU sizes are exact" if exact else "The CPU sizes are not exact")
        + " (and so are those in `tests/data/cpu_kv_reference.json`, "
        "`tests/search/test_feasibility_cpu_calibration.py`). No multi-GPU (TP > 1) start has been logged yet: their "
        "NCCL buffers are a fixed estimate (256 MiB).")


def scored_points(ingress: Path, reference: Path, study: Path) -> str:
    """The simulator's error over every warm H200 point (the ingress runs, the reference, the study)."""
    points = [p for kind, path in (("ingress", ingress), ("study", reference), ("study", study))
              for p in simulated_points(kind, str(Path(path).resolve()))]
    names = {"req_s": "request throughput", "ttft_p50_ms": "TTFT p50", "tpot_p50_ms": "TPOT p50"}
    parts = []
    for m, (mx, med, n) in error_summary(points).items():
        within = sum(1 for p in points if p.scored(m) and abs(p.err(m)) <= 0.10)
        parts.append(f"{names[m]} within 10% on {within} of {n} (median |err| {med:.0%}, max {mx:.0%})")
    return paragraph(f"Scored points (the ingress runs and both tables' levels): {'; '.join(parts)}.")
