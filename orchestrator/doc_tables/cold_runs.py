"""docs/simulator.md's calibration against the cold H200 runs (``results/examples/h200-cold-runs``):
the measured side read from the dataset, the simulated side run here with the current constants
(virtual time, seed 0: deterministic, a few seconds), through :mod:`orchestrator.apps.cold_runs`,
the same replay ``tests/sim/`` and ``benchmarks/fit_sim_h200.py`` use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from orchestrator.apps.cold_runs import (ColdRuns, Logged, OfflineRun, OnlineRun, engine, load_cold_runs,
                                         memory_plan, simulate_offline, simulate_online)
from orchestrator.doc_tables.blocks import count_word, paragraph, series, span
from orchestrator.doc_tables.h200 import markdown
from orchestrator.doc_tables.texts.sim_history import runs as warm_runs
from orchestrator.hardware.memory import GiB
from orchestrator.sim import cost


@dataclass(frozen=True)
class Replayed:
    """The dataset and the simulator's numbers for each of its runs (in the dataset's order)."""

    runs: ColdRuns
    online: tuple[dict, ...]
    offline: tuple[dict, ...]


@functools.lru_cache(maxsize=4)
def _replayed(folder: str) -> Replayed:
    runs = load_cold_runs(folder)
    return Replayed(runs, tuple(simulate_online(runs.setup, r) for r in runs.online),
                    tuple(simulate_offline(runs.setup, r) for r in runs.offline))


def replayed(folder: str | Path) -> Replayed:
    return _replayed(str(Path(folder).resolve()))


def _recorded(value: float) -> str:
    """A measured figure as it was recorded: ``149.5``, ``12,525``."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,}"


def _online_label(r: OnlineRun) -> str:
    return f"{r.rate:g} req/s, max_num_seqs {r.max_num_seqs}, {r.num_prompts} requests"


def _offline_label(r: OfflineRun) -> str:
    return f"offline, {r.num_prompts} prompts, max_num_seqs {r.max_num_seqs}"


def cold_runs_table(folder: str | Path) -> str:
    rep = replayed(folder)
    rows = [[_online_label(r), f"{sim['ttft_p50_ms']:,.0f} / {_recorded(r.ttft_p50_ms)}",
             f"{sim['tpot_p50_ms']:.3g} / {_recorded(r.tpot_p50_ms)}",
             f"{sim['output_tok_s']:,.0f} / {_recorded(r.output_tok_s)}"] for r, sim in zip(rep.runs.online, rep.online)]
    rows += [[_offline_label(r), "–", "–", f"{sim['output_tok_s']:,.0f} / {_recorded(r.output_tok_s)}"]
             for r, sim in zip(rep.runs.offline, rep.offline)]
    return markdown(["scenario", "TTFT p50 ms: sim / real", "TPOT p50 ms: sim / real", "output tok/s: sim / real"],
                    "llll", rows)


# ---------------------------------------------------------------- memory
def _range(low: float, high: float, spec: str) -> str:
    lo, hi = format(low, spec), format(high, spec)
    return lo if lo == hi else f"{lo}–{hi}"


def _kv_cells(plans: list, logged_gib: Logged, logged_tokens: Logged) -> tuple[str, str]:
    gib = [p.kv_bytes / GiB for p in plans]
    tokens = [p.kv_tokens for p in plans]
    sim = f"{_range(min(gib), max(gib), '.2f')} GiB, {_range(min(tokens), max(tokens), ',')} tokens"
    real = (f"{_range(logged_gib.low, logged_gib.high, '.2f')} GiB, "
            f"{_range(int(logged_tokens.low), int(logged_tokens.high), ',')} tokens")
    return sim, real


def memory_table(folder: str | Path) -> str:
    """The simulator's start-up memory (the pre-flight's :func:`start_plan`) for the cold runs'
    configurations against what vLLM logged at their starts."""
    runs = load_cold_runs(folder)
    s, m = runs.setup, runs.memory
    serve = [memory_plan(s, n) for n in m.kv_serve_gib.max_num_seqs]
    offline = [memory_plan(s, n, server=False) for n in m.kv_offline_gib.max_num_seqs]
    graphs = sorted(m.cudagraph_gib)
    sim_graphs = [memory_plan(s, n).cudagraph_bytes / GiB for n in graphs]
    rows = [[f"KV cache, serve ({m.serve_budget:,}-token budget)", *_kv_cells(serve, m.kv_serve_gib, m.kv_serve_tokens)],
            [f"KV cache, offline ({m.offline_budget:,}-token budget)",
             *_kv_cells(offline, m.kv_offline_gib, m.kv_offline_tokens)],
            ["weights", f"{serve[0].weight_bytes_per_gpu / GiB:.2f} GiB", f"{m.weights_gib:.2f} GiB"],
            [f"CUDA graphs, max_num_seqs {' / '.join(str(n) for n in graphs)}",
             f"{' / '.join(f'{g:.3f}' for g in sim_graphs)} GiB",
             f"{' / '.join(f'{m.cudagraph_gib[n]:g}' for n in graphs)} GiB"]]
    return markdown([f"memory ({s.gpu}, {s.gpu_memory_utilization:g} utilisation)", "sim", "real"], "lll", rows)


# ---------------------------------------------------------------- prose
def calibration_setup(folder: str | Path) -> str:
    """The paragraph before the tables: what was measured, and how the constants were fitted since."""
    runs = load_cold_runs(folder)
    s = runs.setup
    n = len(runs.online) + len(runs.offline)
    return paragraph(
        f"Constants were fitted to real vLLM {s.vllm} on one {s.gpu} with a Llama-3.1-8B shaped model (dummy "
        f"weights, bf16, {s.input_len} in / {s.output_len} out, `max_model_len` {s.max_model_len}), measured with "
        f"`vllm serve` + `vllm bench serve` (Poisson arrivals): first on the {count_word(n)} cold runs below (a fresh "
        "`vllm serve` per configuration, no warm-up, so their first requests pay one-off costs; "
        f"{count_word(len(runs.offline))} of them offline through `LLM.generate`), then re-fitted on warm runs on "
        "fresh prompts (next section) and finally fitted jointly on every warm measurement, the capacity study's "
        "levels included (\"Against the H200 capacity study\" below), the cold runs kept at a lower weight. "
        "Virtual-time simulation of the cold runs (seed 0) with the current constants (`python "
        "benchmarks/fit_sim_h200.py` prints them with the other tables; the measured figures are "
        "`results/examples/h200-cold-runs/cold_runs.json`):")


def _errs(pairs: list[tuple[float, float]]) -> list[float]:
    return [100 * (sim / real - 1) for sim, real in pairs]


def _signed(errs: list[float], up: str, down: str) -> str:
    """``1–14% slow``; ``-3% to +5%`` when the signs differ."""
    if all(e < 0 for e in errs) or all(e >= 0 for e in errs):
        return f"{span([abs(e) for e in errs])}% {down if errs[0] < 0 else up}"
    return f"{min(errs):+.0f}% to {max(errs):+.0f}%"


def cold_findings(folder: str | Path, ingress: str | Path) -> str:
    """How far the current constants are from the cold runs, and why (``ingress``: the warm runs it is
    compared with)."""
    rep = replayed(folder)
    s = rep.runs.setup
    by_seqs: dict[int, list] = {}
    for r, sim in zip(rep.runs.online, rep.online):
        by_seqs.setdefault(r.max_num_seqs, []).append((r, sim))
    for r, sim in zip(rep.runs.offline, rep.offline):
        by_seqs.setdefault(r.max_num_seqs, []).append((r, sim))
    few, many = min(by_seqs), max(by_seqs)

    def tput(n):
        return _errs([(sim["output_tok_s"], r.output_tok_s) for r, sim in by_seqs[n]])

    few_online = [(r, sim) for r, sim in zip(rep.runs.online, rep.online) if r.max_num_seqs == few]
    tpot = _errs([(sim["tpot_p50_ms"], r.tpot_p50_ms) for r, sim in few_online])
    decode = [r.tpot_p50_ms for r, _ in few_online]
    core = engine(few, gpu=s.gpu, model=s.model, gpu_memory_utilization=s.gpu_memory_utilization,
                  max_model_len=s.max_model_len)
    weights_ms = 1000 * core.cost.weight_read_bytes / core.cost.bw
    fastest = max(rep.runs.online, key=lambda r: r.output_tok_s)
    warm = warm_runs(ingress).values("inf", "output_throughput")
    slow_run, slow_sim = min(few_online, key=lambda p: p[0].rate)
    ratio = slow_sim["ttft_p50_ms"] / slow_run.ttft_p50_ms
    faster = "faster" if fastest.output_tok_s > max(warm) else "not faster"
    return paragraph(
        f"Against the cold runs the {few}-sequence points are now {_signed(tput(few), 'fast', 'slow')} in "
        f"throughput and {_signed(tpot, 'high', 'low')} in TPOT, the {many}-sequence ones "
        f"{_signed(tput(many), 'fast', 'slow')}: the warm data needs a larger per-step overhead "
        f"({cost.STEP_OVERHEAD_S * 1000:g} ms, the most these runs allow: their {few}-sequence decode steps take "
        f"{span(decode, '.1f')} ms, ~{weights_ms:.1f} ms of which is streaming the weights at the simulator's HBM rate), and the cold runs were "
        f"{faster} when saturated than the warm ones are ({fastest.output_tok_s:,.0f} tok/s at {fastest.rate:g} req/s "
        f"cold against {series([f'{w:,.0f}' for w in sorted(warm)])} in the rate-`inf` warm runs of the next "
        f"section). The {slow_run.rate:g} req/s, {few}-sequence run sits at that configuration's capacity, so its "
        f"TTFT p50 is queue-dominated and swings with the arrival sequence (sim / real {ratio:.1f}x).")
