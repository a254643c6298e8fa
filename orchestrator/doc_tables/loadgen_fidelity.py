"""docs/benchmarks.md's load-generator fidelity tables and text, from ``results/examples/loadgen-fidelity``.

``benchmarks/loadgen_fidelity.py`` stores every repetition of each tool on each server
(``runs.parquet``: section, tool, repetition and the compared metrics under our names), the
sustainable-rate ladder (``ladder.parquet``), each tool's measured and the stub server's own
figures per repetition (``truth.parquet``) and the run record (``run.json``). Medians,
differences, noise and verdicts are computed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from orchestrator.doc_tables.blocks import bullets, paragraph
from orchestrator.doc_tables.h200 import markdown
from orchestrator.doc_tables.overhead import load_average

RUNS_FILE, LADDER_FILE, TRUTH_FILE, RUN_FILE = "runs.parquet", "ladder.parquet", "truth.parquet", "run.json"
OURS, VLLM = "ours", "vllm"
CPU_VLLM, SIM = "cpu_vllm", "sim"
METRICS = ("output_throughput", "request_throughput", "ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms",
           "tpot_p50_ms", "tpot_p99_ms", "itl_mean_ms", "itl_p50_ms", "itl_p99_ms", "e2el_mean_ms", "e2el_p50_ms")
TRUTH_METRICS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
MAX_LAG_MS, MIN_ACHIEVED = 20.0, 0.97  # a tool sustains a rate when it keeps up: these bounds
TARGET = 0.03  # the agreement bound, per metric


def _read(folder: str | Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(Path(folder) / name)


def run_record(folder: str | Path) -> dict:
    return json.loads((Path(folder) / RUN_FILE).read_text())


def _spread(x: np.ndarray) -> float:
    """Relative range of one tool's repetitions (0 with one repetition)."""
    med = float(np.median(x))
    return float((x.max() - x.min()) / abs(med)) if len(x) > 1 and med else 0.0


def agreement(folder: str | Path, section: str) -> pd.DataFrame:
    """Per metric: each tool's median over repetitions, their relative difference and the noise floor
    (the larger relative range of one tool's own repetitions)."""
    runs = _read(folder, RUNS_FILE)
    runs = runs[runs["section"] == section]
    rows = []
    for m in METRICS:
        a = runs[runs["tool"] == OURS][m].to_numpy(float)
        b = runs[runs["tool"] == VLLM][m].to_numpy(float)
        ma, mb = float(np.median(a)), float(np.median(b))
        rows.append({"metric": m, "ours": ma, "vllm": mb, "diff": (ma - mb) / mb if mb else float("nan"),
                     "noise": max(_spread(a), _spread(b))})
    return pd.DataFrame(rows)


def _agreement_table(folder: str | Path, section: str) -> str:
    rows = [[r.metric, f"{r.ours:.4g}", f"{r.vllm:.4g}", f"{r.diff:+.1%}", f"{r.noise:.1%}"]
            for r in agreement(folder, section).itertuples()]
    return markdown(["metric", "ours", "vllm bench serve", "difference", "noise (run-to-run)"], "lrrrr", rows)


def cpu_table(folder: str | Path) -> str:
    return _agreement_table(folder, CPU_VLLM)


def sim_table(folder: str | Path) -> str:
    return _agreement_table(folder, SIM)


def sustained(ladder: pd.DataFrame, tool: str) -> Optional[float]:
    ok = ladder[(ladder[f"{tool}_achieved"] >= MIN_ACHIEVED * ladder["rate"])
                & (ladder[f"{tool}_lag_p99_ms"] <= MAX_LAG_MS)]
    return float(ok["rate"].max()) if len(ok) else None


def _rate(x: Optional[float]) -> str:
    return "none of the rates" if x is None else f"{x:g} req/s"


def ladder_table(folder: str | Path) -> str:
    ladder = _read(folder, LADDER_FILE)
    rows = [[f"{r.rate:g}", f"{r.ours_achieved:.1f} / {r.ours_lag_p99_ms:.1f}",
             f"{r.vllm_achieved:.1f} / {r.vllm_lag_p99_ms:.1f}"] for r in ladder.itertuples()]
    return (markdown(["offered req/s", "ours: achieved / p99 send lag ms",
                      "vllm bench serve: achieved / p99 send lag ms (est.)"], "rrr", rows)
            + f"\n\nSustainable: ours {_rate(sustained(ladder, OURS))}, `vllm bench serve` "
              f"{_rate(sustained(ladder, VLLM))}.")


def truth(folder: str | Path) -> dict[str, dict[str, float]]:
    """Per tool and metric: the median over repetitions of measured minus what the server did (ms), and
    (``server_<metric>``) the median of what the server did."""
    t = _read(folder, TRUTH_FILE)
    out = {}
    for tool, g in t.groupby("tool"):
        d = {m: float(np.median(g[m] - g["server_" + m])) for m in TRUTH_METRICS}
        d |= {"server_" + m: float(np.median(g["server_" + m])) for m in TRUTH_METRICS}
        out[str(tool)] = d
    return out


def truth_table(folder: str | Path) -> str:
    t = truth(folder)
    rows = [[m, f"{t[OURS]['server_' + m]:.2f}", f"{t[OURS][m]:+.2f}", f"{t[VLLM][m]:+.2f}"] for m in TRUTH_METRICS]
    return markdown(["metric", "server did (ms)", "ours: measured - server (ms)",
                     "vllm bench serve: measured - server (ms)"], "lrrr", rows)


def setup_text(folder: str | Path) -> str:
    run = run_record(folder)
    return paragraph(f"{load_average(run)}; client and servers on the same machine, {run['reps']} repetitions per "
                     f"tool, about {run['seconds'] / 60:.0f} minutes.")


def definitions_text(folder: str | Path) -> str:
    run = run_record(folder)
    return paragraph("Both tools' records give the same metrics under vLLM's own `calculate_metrics` (largest "
                     f"relative difference {run['definitions_max_rel_diff'][CPU_VLLM]:.1e}): the definitions "
                     "agree exactly; what differs is the measurement.")


def _pct_max(values: pd.Series) -> str:
    return f"{100 * values.abs().max():.1f}%"


def findings(folder: str | Path) -> str:
    sim, cpu = agreement(folder, SIM), agreement(folder, CPU_VLLM)
    t, ladder = truth(folder), _read(folder, LADDER_FILE)
    sim_worst = sim.loc[sim["diff"].abs().idxmax()]
    sim_within_noise = int((sim["diff"].abs() <= np.maximum(sim["noise"], TARGET)).sum())
    closer = OURS if abs(t[OURS]["ttft_p50_ms"]) <= abs(t[VLLM]["ttft_p50_ms"]) else VLLM
    name = {OURS: "ours", VLLM: "`vllm bench serve`"}
    thr = cpu[cpu["metric"].isin(["output_throughput", "request_throughput"])]["diff"]
    means = cpu[cpu["metric"].str.endswith("_mean_ms")]["diff"]
    over = cpu[cpu["diff"].abs() > TARGET]
    over_in_noise = over[over["diff"].abs() <= over["noise"]]
    beyond = over[over["diff"].abs() > over["noise"]]
    tiny = beyond[(beyond["ours"].abs() < 0.05) & (beyond["vllm"].abs() < 0.05)]
    beyond_note = ""
    if len(beyond):
        beyond_note = (f" Beyond their noise: {', '.join(beyond['metric'])}"
                       + (f"; of these, {', '.join(tiny['metric'])} are below 0.05 ms for both tools (most tokens read "
                          "together in one chunk), where a relative difference means nothing" if len(tiny) else "")
                       + ".")
    ours_best, vllm_best = sustained(ladder, OURS), sustained(ladder, VLLM)
    top = ladder.iloc[-1]
    return bullets([
        f"On the sim engine every metric agrees within {100 * abs(sim_worst['diff']):.1f}% (largest: "
        f"{sim_worst['metric']}); {sim_within_noise} of {len(sim)} differences are within the larger of "
        f"{100 * TARGET:g}% and the run-to-run noise. Against ground truth {name[closer]} is the closer of the two on "
        f"p50 TTFT: ours {t[OURS]['ttft_p50_ms']:+.1f} ms, `vllm bench serve` {t[VLLM]['ttft_p50_ms']:+.1f} ms (p99: "
        f"{t[OURS]['ttft_p99_ms']:+.1f} vs {t[VLLM]['ttft_p99_ms']:+.1f} ms); ITL errors are "
        f"{min(abs(t[x][m]) for x in t for m in ('itl_p50_ms', 'itl_p99_ms')):.2f}–"
        f"{max(abs(t[x][m]) for x in t for m in ('itl_p50_ms', 'itl_p99_ms')):.2f} ms for both.",
        f"On the CPU vLLM server, throughput agrees within {_pct_max(thr)}; mean TTFT, TPOT, ITL and E2E within "
        f"{_pct_max(means)}. {len(over)} of {len(cpu)} rows differ by more than {100 * TARGET:g}%, "
        f"{len(over_in_noise)} of them by less than their own run-to-run noise: on {run_record(folder)['cpu_count']} "
        "cores the engine, its API server and the load generator share the machine, and a tiny model's few-ms steps "
        "make every scheduling hiccup visible." + beyond_note,
        f"Ours sustains {_rate(ours_best)} from one process (p99 send lag {top['ours_lag_p99_ms']:.1f} ms at "
        f"{top['rate']:g}); `vllm bench serve` sustains {_rate(vllm_best)} (p99 lag {top['vllm_lag_p99_ms']:.1f} ms at "
        f"{top['rate']:g}): ours "
        + (">= vLLM's, the target." if (ours_best or 0) >= (vllm_best or 0) else "< vLLM's: **the target is missed**."),
    ])
