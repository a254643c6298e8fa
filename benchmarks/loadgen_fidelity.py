"""Our load generator against ``vllm bench serve``: same server, same requests, same schedule.

    .venv/bin/python benchmarks/loadgen_fidelity.py [--quick] [--reps 3] [--out DIR]

Stores every repetition (``runs.parquet``), the sustainable-rate ladder (``ladder.parquet``), the
ground-truth runs (``truth.parquet``) and the run record (``run.json``: command, date, cores, load
average before and after) in results/examples/loadgen-fidelity; the docs' tables and text are
computed from them (``orchestrator/doc_tables/loadgen_fidelity.py``).

Servers (started here, on 127.0.0.1, stopped at the end):

* the CPU vLLM engine: ``python -m vllm.entrypoints.openai.api_server`` on a tiny
  random-weight Llama built by ``orchestrator make-model tiny-llama DIR --weights random``
  (float32, eager, ``VLLM_CPU_KVCACHE_SPACE=1``, caches in a temporary directory);
* the simulated engine's direct HTTP server (the ``sim`` engine's front door, an
  H100 running Llama-3.1-8B in real time), started without Ray;
* a stub that streams with a known first-token delay and token gap and records when
  it actually wrote each chunk: ground truth, so each tool's own error (measured minus
  what the server did) shows which one is closer.

Both tools read one ``vllm bench serve`` custom-dataset file (word-level prompts:
exactly N tokens on the tiny model's tokenizer), send the completions API with
``ignore_eos`` and temperature 0 at a constant rate (``--burstiness inf``), and runs
alternate (ours first, then vLLM first, ...) so drift hits both, and prefix caching
is off in both servers (every run resends the same prompts). Reported per metric:
the median over repetitions for each tool, their relative difference, and the
spread between one tool's own repetitions (the noise floor of that metric).

Sustainable rate: offered constant rates climb on the sim server (short requests);
a tool sustains a rate when its sends keep up: achieved send rate >= 97% of the
offered rate and p99 send lag <= 20 ms. vLLM does not record intended send times;
its lag is estimated from ``start_times`` against the constant schedule (origin: the
least-lagged request).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataset import EXAMPLES, RunRecord, write  # noqa: E402
from fidelity_servers import MODEL, Server, start_sim, start_stub, start_vllm, stub_truth  # noqa: E402

from orchestrator.doc_tables import loadgen_fidelity as tables  # noqa: E402
from orchestrator.loadgen import Endpoint, run_load_sync  # noqa: E402
from orchestrator.measure.metrics import summarise  # noqa: E402
from orchestrator.workload.datasets import write_vllm_custom  # noqa: E402
from orchestrator.workload.generate import build_requests  # noqa: E402
from orchestrator.workload.spec import WorkloadSpec  # noqa: E402

# (our metric, vLLM's key) compared per run.
COMPARED = [
    ("output_throughput", "output_throughput"), ("request_throughput", "request_throughput"),
    ("ttft_mean_ms", "mean_ttft_ms"), ("ttft_p50_ms", "median_ttft_ms"), ("ttft_p99_ms", "p99_ttft_ms"),
    ("tpot_mean_ms", "mean_tpot_ms"), ("tpot_p50_ms", "median_tpot_ms"), ("tpot_p99_ms", "p99_tpot_ms"),
    ("itl_mean_ms", "mean_itl_ms"), ("itl_p50_ms", "median_itl_ms"), ("itl_p99_ms", "p99_itl_ms"),
    ("e2el_mean_ms", "mean_e2el_ms"), ("e2el_p50_ms", "median_e2el_ms"),
]
MAX_LAG_MS = tables.MAX_LAG_MS


# ---------------------------------------------------------------- ground truth (the stub server)
def ground_truth(url: str, tokenizer: Path, data: Path, n: int, rate: float, reps: int, tmp: Path) -> list[dict]:
    """Per repetition and tool: its TTFT and ITL and what the stub server did for the same requests (ms)."""
    rows = []
    stub_truth(url)  # reset
    for i in range(reps):
        for tool in (("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")):
            if tool == "ours":
                r = run_ours(url, data, n, rate)
                got = {k: r[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")}
            else:
                r = run_vllm(url, tokenizer, data, n, rate, tmp)
                got = {"ttft_p50_ms": r["median_ttft_ms"], "ttft_p99_ms": r["p99_ttft_ms"],
                       "itl_p50_ms": r["median_itl_ms"], "itl_p99_ms": r["p99_itl_ms"]}
            truth = stub_truth(url)
            rows.append({"tool": tool, "rep": i, **got, **{"server_" + k: v for k, v in truth.items() if k in got}})
    return rows


# ---------------------------------------------------------------- the two tools
def dataset(path: Path, n: int, input_len: int, output_len: int, seed: int = 0) -> Path:
    """``n`` prompts of ``input_len`` words (``t123``: one token each on the word-level tokenizer)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 4000, size=(n, input_len))
    write_vllm_custom(path, ((" ".join(f"t{i}" for i in row), output_len) for row in ids))
    return path


def run_ours(url: str, data: Path, n: int, rate: float, timeout_s: float = 300) -> dict:
    spec = WorkloadSpec.model_validate({"dataset": {"format": "vllm-custom", "path": str(data), "shuffle": False},
                                        "arrival": {"kind": "constant", "rate": rate}, "num_requests": n,
                                        "warmup_requests": 0, "warmup": {"enabled": False},  # as vllm bench serve
                                        "timeout_s": timeout_s})
    rs = build_requests(spec, 0, 4096)
    t0 = time.perf_counter()
    records = run_load_sync(Endpoint(url, MODEL), rs, timeout_s=timeout_s)
    wall = time.perf_counter() - t0
    m = summarise(records, requested_rate=rate, max_sched_lag_ms=MAX_LAG_MS).as_dict()
    m["wall_s"] = wall
    m["_records"] = records
    return m


def definitions_check(run: dict) -> float:
    """Largest relative difference between our metrics and vLLM's ``calculate_metrics`` on the same records."""
    from vllm.benchmarks import serve
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    ok = [r for r in run["_records"] if not r.warmup]
    outputs = [RequestFuncOutput(success=r.success, ttft=r.ttft_s or 0.0, itl=r.itl_s, latency=r.latency_s or 0.0,
                                 output_tokens=r.output_tokens, prompt_len=r.prompt_tokens or 0,
                                 start_time=r.sent_s or 0.0) for r in ok]
    with contextlib.redirect_stdout(io.StringIO()):
        vm, _ = serve.calculate_metrics(input_requests=[], outputs=outputs, dur_s=run["duration_s"], tokenizer=None,
                                        selected_percentiles=[99], goodput_config_dict={})
    pairs = [(run["request_throughput"], vm.request_throughput), (run["output_throughput"], vm.output_throughput)]
    for fam in ("ttft", "tpot", "itl", "e2el"):
        pairs += [(run[f"{fam}_mean_ms"], getattr(vm, f"mean_{fam}_ms")),
                  (run[f"{fam}_p50_ms"], getattr(vm, f"median_{fam}_ms")),
                  (run[f"{fam}_p99_ms"], dict(getattr(vm, f"percentiles_{fam}_ms"))[99])]
    return max(abs(a - b) / abs(b) for a, b in pairs if b)


def run_vllm(url: str, tokenizer: Path, data: Path, n: int, rate: float, tmp: Path) -> dict:
    from vllm.benchmarks import serve

    p = argparse.ArgumentParser()
    serve.add_cli_args(p)
    name = f"vllm-{time.time_ns()}.json"
    argv = ["--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", MODEL,
            "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path", str(data),
            "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(n),
            "--request-rate", str(rate), "--burstiness", "inf", "--ignore-eos", "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
            "--save-result", "--save-detailed", "--result-dir", str(tmp), "--result-filename", name,
            "--disable-tqdm", "--seed", "0"]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        serve.main(p.parse_args(argv))
    wall = time.perf_counter() - t0
    result = json.loads((tmp / name).read_text())
    result["wall_s"] = wall
    starts = np.sort(np.asarray(result["start_times"], dtype=float))
    result["achieved_rate"] = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else None
    # Intended time of request i: origin + (i + 1) / rate (vLLM's constant schedule); origin: least lagged.
    due = (np.arange(len(starts)) + 1) / rate
    lag = starts - due
    lag -= lag.min()
    result["sched_lag_p50_ms"] = float(np.percentile(lag, 50) * 1000)
    result["sched_lag_p99_ms"] = float(np.percentile(lag, 99) * 1000)
    return result


# ---------------------------------------------------------------- comparisons
def agreement(url: str, tokenizer: Path, data: Path, n: int, rate: float, reps: int, tmp: Path,
              section: str) -> tuple[list[dict], float]:
    """Every repetition of each tool (the compared metrics under our names), and the largest relative
    difference between our metrics and vLLM's ``calculate_metrics`` on our last run's records."""
    rows, last = [], None
    for i in range(reps):
        # Alternate who goes first: slow drift of the machine hits both tools alike.
        for tool in (("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")):
            if tool == "ours":
                last = run_ours(url, data, n, rate)
                rows.append({"section": section, "tool": tool, "rep": i, **{m: last[m] for m, _ in COMPARED}})
            else:
                v = run_vllm(url, tokenizer, data, n, rate, tmp)
                rows.append({"section": section, "tool": tool, "rep": i, **{m: v[k] for m, k in COMPARED}})
    return rows, definitions_check(last)


def sustainable(url: str, tokenizer: Path, tmp: Path, rates: list[float], seconds: float) -> list[dict]:
    ladder = []
    for rate in rates:
        n = int(rate * seconds)
        data = dataset(tmp / f"ladder-{rate:g}.jsonl", n, 32, 8, seed=1)
        o = run_ours(url, data, n, rate, timeout_s=60)
        v = run_vllm(url, tokenizer, data, n, rate, tmp)
        ladder.append({"rate": rate, "n": n,
                       "ours_achieved": o["achieved_rate"], "ours_lag_p99_ms": o["sched_lag_p99_ms"],
                       "ours_ok": o["completed"], "ours_client_us_per_token": o["client_us_per_token"],
                       "vllm_achieved": v["achieved_rate"], "vllm_lag_p99_ms": v["sched_lag_p99_ms"],
                       "vllm_ok": v["completed"]})
    return ladder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and repetitions (writes nothing by default)")
    ap.add_argument("--reps", type=int, help="repetitions per tool (default 3, quick 1)")
    ap.add_argument("--out", type=Path, help="the dataset's folder (default: results/examples/loadgen-fidelity, "
                                             "for a full run)")
    a = ap.parse_args()
    reps = a.reps or (1 if a.quick else 3)
    out = a.out or (None if a.quick else EXAMPLES / "loadgen-fidelity")
    record, t_start = RunRecord.from_argv(), time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="loadgen-fidelity-"))
    runs: list[dict] = []
    extra: dict[str, Any] = {"reps": reps, "python": platform.python_version(), "definitions_max_rel_diff": {}}
    servers: list[Server] = []
    try:
        model_dir = tmp / "tiny-llama"
        subprocess.run([sys.executable, "-m", "orchestrator", "make-model", "tiny-llama", str(model_dir),
                        "--weights", "random"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        t = time.perf_counter()
        server, url = start_vllm(model_dir, tmp)
        servers.append(server)
        extra["vllm_start_s"] = time.perf_counter() - t
        n = 40 if a.quick else 160
        data = dataset(tmp / "cpu.jsonl", n, 64, 32)
        run_ours(url, dataset(tmp / "warm.jsonl", 16, 64, 32, seed=9), 16, 4.0)  # one-off warm-up costs
        rows, extra["definitions_max_rel_diff"][tables.CPU_VLLM] = agreement(url, model_dir, data, n, 4.0, reps, tmp,
                                                                             tables.CPU_VLLM)
        runs += rows
        print(f"CPU vLLM: {len(rows)} runs", flush=True)
        server.stop()
        servers.remove(server)
        server, url = start_sim(tmp)
        servers.append(server)
        n = 100 if a.quick else 400
        data = dataset(tmp / "sim.jsonl", n, 512, 64)
        run_ours(url, dataset(tmp / "warm2.jsonl", 16, 512, 64, seed=9), 16, 8.0)
        rows, extra["definitions_max_rel_diff"][tables.SIM] = agreement(url, model_dir, data, n, 20.0, reps, tmp,
                                                                        tables.SIM)
        runs += rows
        rates = [50, 100, 200, 300] if a.quick else [50, 100, 200, 300, 400, 600, 800]
        ladder = sustainable(url, model_dir, tmp, rates, 3.0 if a.quick else 5.0)
        print(f"sim: {len(rows)} runs, ladder of {len(ladder)} rates", flush=True)
        server.stop()
        servers.remove(server)
        server, url = start_stub(tmp)
        servers.append(server)
        n = 100 if a.quick else 300
        data = dataset(tmp / "stub.jsonl", n, 64, 32)
        truth = ground_truth(url, model_dir, data, n, 30.0, reps, tmp)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if out is None:
        print("--quick: nothing written (give --out to keep it)")
        return 0
    import pandas as pd

    frames = {tables.RUNS_FILE: pd.DataFrame(runs), tables.LADDER_FILE: pd.DataFrame(ladder),
              tables.TRUTH_FILE: pd.DataFrame(truth)}
    print(f"wrote {write(out, frames, record.finish(**extra, seconds=round(time.monotonic() - t_start)))}")
    for build in (tables.cpu_table, tables.sim_table, tables.ladder_table, tables.truth_table, tables.findings):
        print("\n" + build(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
