"""docs/simulator.md's prose beside its generated tables: the KV-cache predictions' error band, the
simulator's scores against every warm H200 measurement (replayed with its current constants), and
what the out-of-sample benchmark (``results/examples/sim-error``) predicted, left out and could not
rank."""

from __future__ import annotations

import json
import math
from itertools import combinations
from pathlib import Path

import pandas as pd

from orchestrator.apps.measured_replay import error_summary
from orchestrator.doc_tables import sim_error
from orchestrator.doc_tables.blocks import count_word, paragraph, series
from orchestrator.doc_tables.h200 import simulated_points, trials_of
from orchestrator.doc_tables.kv import KV_TOLERANCE, predictions
from orchestrator.results.query import study_dirs
from orchestrator.search.fidelity import error
from orchestrator.search.fidelity.replay import LEAVE_ONE_OUT


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
    multi = sum(p["trials"] for p in rows if not p["config"].startswith("TP 1,"))
    return paragraph(
        f"All {' and '.join(devices)} predictions are within {bound:.1%} ({min(p['err'] for p in gpu):+.2%} to "
        f"{max(p['err'] for p in gpu):+.2%}); the three largest over-predictions are at "
        f"`max_num_batched_tokens` {series([f'{b:,}' for b in batches])} (the model's activation peak is smaller than "
        f"vLLM's at small budgets) and the largest under-prediction, {low['err']:+.2%}, is at {low['config']}.",
        ("The CPU sizes are exact" if exact else "The CPU sizes are not exact")
        + " (and so are those in `tests/data/cpu_kv_reference.json`, "
        "`tests/search/test_feasibility_cpu_calibration.py`). "
        + ("No multi-GPU (TP > 1) start has been logged yet: their" if not multi else
           f"{multi} multi-GPU (TP > 1) start{'s are' if multi != 1 else ' is'} logged; their")
        + " NCCL buffers are a fixed estimate (256 MiB).")


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


INTERACTIVE = "llama3-8b-h200-interactive"


def _by_config(frame: pd.DataFrame, scheme: str, dataset: str) -> pd.DataFrame:
    """A dataset's configurations under ``scheme``: their first objective measured and predicted (medians)
    and the measured interval (medians of its bounds), as :func:`orchestrator.search.fidelity.error.ranking`
    compares them."""
    f = error.scored(frame)
    f = f[(f["scheme"] == scheme) & (f["dataset"] == dataset) & (f["level"] == -1) & (f["metric"] == f["objective"])]
    f = f.assign(low=f["measured_low"].fillna(0.0), high=f["measured_high"].fillna(math.inf))
    return f.groupby("config").agg(y=("measured", "median"), p=("predicted", "median"), margin=("margin", "max"),
                                   low=("low", "median"), high=("high", "median"), params=("params_json", "first"),
                                   trials=("trial_id", "nunique"))


def _value(x) -> str:
    return f"{x.y:.3g} [{x.low:.3g}, {'inf' if math.isinf(x.high) else f'{x.high:.3g}'}]"


def interactive_ranking(folder: Path) -> str:
    """The interactive study's configurations: which schemes rank them as measured, the pair the
    simulator cannot tell apart, and whether the measurement told that pair apart."""
    frame = sim_error.load(folder)
    rank = error.ranking(frame)
    mine = rank[rank["dataset"] == INTERACTIVE]
    wrong = [sim_error.SCHEME_NAMES[r.scheme] for r in mine.itertuples() if r.right < r.pairs]
    decided_wrong = [sim_error.SCHEME_NAMES[r.scheme] for r in mine.itertuples() if r.decided_right < r.decided]
    lodo = mine[mine["scheme"] == LEAVE_ONE_OUT]
    configs = _by_config(frame, LEAVE_ONE_OUT, INTERACTIVE)
    pairs = [(a, b) for (_, a), (_, b) in combinations(configs.iterrows(), 2)
             if abs(a.y - b.y) / min(a.y, b.y) > max(a.margin, b.margin) and (a.p - b.p) * (a.y - b.y) <= 0]
    n = int(lodo["decided"].sum())
    decided = (" No pair's measured intervals lie apart." if n == 0 else
               (" On the pair whose measured intervals lie apart, " if n == 1
                else f" On the {count_word(n)} pairs whose measured intervals lie apart, ")
               + ("every scheme gives the measured order." if not decided_wrong
                  else f"{series(decided_wrong)} do not give the measured order."))
    if not pairs:
        return paragraph(f"The interactive study's {count_word(len(configs))} configurations are ranked as measured "
                         "from constants not fitted on it." + decided)
    a, b = pairs[0]
    tokens = {json.loads(x.params)["max_num_batched_tokens"] for x in (a, b)}
    label = f"{tokens.pop():,}-token ones" if len(tokens) == 1 else "two configurations"
    others = [w for w in wrong if w != sim_error.SCHEME_NAMES[LEAVE_ONE_OUT]]
    alike = abs(a.p - b.p) / min(a.p, b.p) <= max(a.margin, b.margin)
    apart = a.high < b.low or b.high < a.low
    return paragraph(
        f"The interactive study's {count_word(len(configs))} configurations (the {label} are the pair above) are not "
        "all ranked as measured from constants not fitted on it"
        + (", nor with any other scheme" if len(others) == len(sim_error.SCHEME_NAMES) - 1
           else (f", nor {series(others, 'or')}" if others else ", though every other scheme ranks them so"))
        + f": the simulator predicts the two {label.replace(' ones', ' configurations')} "
        + ("alike" if alike else "in the wrong order")
        + f", where the engine measured them {abs(a.y - b.y) / min(a.y, b.y):.0%} apart"
        + (f" ({_value(a)} and {_value(b)} req/s, "
           + ("one engine start each" if a.trials == b.trials == 1 else f"{a.trials} and {b.trials} trials")
           + ": their intervals overlap, so the measurement did not tell them apart either)." if not apart
           else f" ({_value(a)} and {_value(b)} req/s).")
        + decided)


# What each dataset of the sim-error benchmark is, as the docs name it (a plural noun without "the" when
# a kind has several datasets: "fidelity run" -> "the two fidelity runs").
DATASET_NAMES = {
    "llama3-8b-h200": "the capacity study", "llama3-8b-h200-reference": "its bare `vllm serve` reference",
    "llama3-8b-h200-fidelity": "fidelity run", "llama3-8b-h200-fidelity-levels": "fidelity run",
    "llama3-8b-h200-interactive": "the interactive study", "llama3-8b-h200-kv-fp8": "the FP8 KV study",
    "multiturn-h200-fixed": "the multi-turn study", "repeatability-h200": "the repeated capacity runs",
    "repeatability-h100": "the repeated runs (capacity, and a fixed rate)",
    "starts-h100": "the engine starts of vLLM's defaults and of a tuned configuration",
    "fidelity-h100": "the fidelity study of a new space (below)",
    "trained-base-quant-h100": "the trained ~103 M-parameter model's quantization study (FP8 weights and KV cache)",
    "trained-base-spec-h100": "its speculation study's {trials} without speculation",
}


def _named(datasets: list[str], trials: dict[str, int]) -> list[str]:
    kinds: dict[str, int] = {}
    for d in datasets:
        n = trials[d]
        name = DATASET_NAMES.get(d, f"`{d}`").format(trials=f"{count_word(n)} trial{'s' if n != 1 else ''}")
        kinds[name] = kinds.get(name, 0) + 1
    return [name if name.startswith(("the ", "its ", "`")) else f"the {count_word(n)} {name}s"
            for name, n in kinds.items()]


def sim_error_datasets(folder: Path) -> str:
    """What the out-of-sample benchmark predicts, GPU by GPU, from its rows."""
    frame = sim_error.load(folder)
    shipped = frame[frame["scheme"] == frame["scheme"].iloc[0]]
    trials = shipped.groupby("dataset")["trial_id"].nunique().to_dict()
    by_gpu = {g: set(s["dataset"]) for g, s in shipped.groupby("gpu")}
    order = sorted(by_gpu, key=lambda g: (g != "H200", g))  # the GPU the constants were fitted on first
    # the docs' order of the datasets, then any new one
    listed = {g: [d for d in DATASET_NAMES if d in by_gpu[g]] + sorted(by_gpu[g] - set(DATASET_NAMES)) for g in order}
    told = "; ".join(f"on the {g.split('-')[0]}: {series(_named(listed[g], trials))}" for g in order)
    return paragraph(
        "How far off is the simulator on a workload, a configuration and a GPU it was not fitted on? Every completed "
        "real trial of the real-engine datasets in `results/examples` is predicted by the virtual-time simulator with "
        "the trial's configuration and its study's workload, as the fidelity search scores a configuration "
        "(`orchestrator/search/fidelity/replay.py`): a capacity trial's capacity (its study's capacity search, run in "
        "virtual time) and each of its load levels that ran to the end, at the level's rate; a fixed-rate trial's one "
        f"window. {told[0].upper()}{told[1:]}. Before predicting, the calibration that `search.fidelity: sim` fits "
        "(step overhead, prefill compute and decode bandwidth efficiency, frontend latency; on the three levels of "
        "each capacity trial nearest its capacity; one Levenberg-Marquardt iteration from none, where a study's refit "
        "does two from its last fit: one keeps the benchmark to minutes on two shared cores, `run.json` has its "
        "seconds) is fitted on other datasets:")


def sim_error_left_out(folder: Path) -> str:
    """What is not scored and what the benchmark left out (its ``run.json``), with why."""
    left = json.loads((Path(folder) / sim_error.RUN_FILE).read_text())["left_out"]
    spec = sum(1 for why in left.values() if why.startswith("speculative decoding"))
    kinds = ["the simulator's own datasets" if any(w.startswith("the simulator's own") for w in left.values()) else "",
             "the CPU runs" if any("CPU" in w for w in left.values()) else "",
             "the ingress runs (benchmark files, no study to replay)",
             f"the {count_word(spec)} trial{'s' if spec != 1 else ''} with speculative decoding, which the simulator "
             "does not model" if spec else ""]
    return paragraph(
        "An error is (predicted - measured) / measured. Not scored: the TTFT of an overloaded or harness-bound level "
        "(a queue's or the client's, as in the table above), and a capacity that is below or above every level "
        f"measured (0, or a lower bound). Left out: {series([k for k in kinds if k])}. A level's output throughput "
        "below the capacity is close to what was sent, in the simulator as on the engine: the capacity is the "
        "throughput that tests the model.")


def kv_rows(*paths: Path) -> str:
    """What the KV table's rows are: the vLLM of the GPU rows, and what each column holds."""
    gpu_rows = [trials_of(d) for p in paths for d in study_dirs(Path(p))]
    gpu_rows = [t[t["gpu"] != "CPU"] for t in gpu_rows]
    rows = pd.concat([t[t["kv_cache_tokens"].notna()] for t in gpu_rows if len(t)], ignore_index=True)
    vllm = sorted({json.loads(v).get("vllm") for v in rows["versions_json"].dropna()} - {None})
    gpus = sorted(set(rows["gpu"]))
    return paragraph(
        "vLLM logs `GPU KV cache size: N tokens` at start; the `vllm` engine keeps N in each row (`kv_cache_tokens`). "
        "Every logged size in the example datasets, predicted again from the row's study and parameters through the "
        "pre-flight (on GPUs the simulator's `start_plan`; on CPUs vLLM-CPU's fixed KV space), must be within "
        f"{KV_TOLERANCE:.0%} (`tests/hardware/test_kv_prediction.py`; the pre-flight's margin, docs/search.md, is 3% "
        f"of the requested memory on top). The {series(gpus)} rows are vLLM {series(vllm, 'or')} with `--load-format "
        "dummy`, Llama-3.1-8B, block 16; `configuration` is TP, `max_num_seqs`, `max_num_batched_tokens`, "
        "`gpu_memory_utilization`, `max_model_len`, KV dtype (`eager`: `enforce_eager`, no CUDA graphs). Regenerate "
        "with `python -m orchestrator.doc_tables.registry --write kv-predicted-vs-logged`.")
