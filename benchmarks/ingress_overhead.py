"""Ingress overhead: bare ``vllm serve`` against the ``vllm`` engine's two ingress modes.

One vLLM configuration, one GPU, three ways to reach it:

* ``bare``: ``python -m vllm.entrypoints.openai.api_server`` started by this script
  (the baseline, measured in the same run);
* ``engine``: the tuner's default ingress, deployed by the product's own code
  (``VllmServeEngine.deploy``): a Ray Serve replica runs ``vllm serve``, the load goes to it;
* ``serve_llm``: ``ray.serve.llm``'s OpenAI app, deployed by the product's own code, with
  optional serving-layer settings (``--serving '{"num_ingress_replicas": 8}'``).

The load is vLLM's own ``vllm bench serve`` (random dataset, ``--ignore-eos``), never
the tuner's load generator, so the comparison is independent of it. Every load uses a
seed this engine has not seen (prompts never hit the prefix cache): first a warm-up
load (seed 1000), then one run per rate (seed 1001, 1002, ...).

What the timer covers: each row is ``vllm bench serve``'s own figures for one load
(its duration is from its first request to its last response); deployment time is
reported separately (``deploy_s``: from the start call until the server answers).

Usage, one mode per call (each writes ``<out>/ingress_<label>.json``), then the table:

    python benchmarks/ingress_overhead.py run --mode bare --model /models/llama --out results/ingress
    python benchmarks/ingress_overhead.py run --mode engine --model /models/llama --out results/ingress
    python benchmarks/ingress_overhead.py run --mode serve_llm --model /models/llama --out results/ingress
    python benchmarks/ingress_overhead.py table results/ingress
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFIG = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9,
          "max_model_len": 4096}


def bench(base_url: str, model: str, tokenizer: str, rate: str, seed: int, n: int, out: Path, label: str,
          input_len: int, output_len: int) -> dict:
    """One ``vllm bench serve`` load; returns its result JSON."""
    name = f"{label}_r{rate}_s{seed}.json"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
           "--base-url", base_url, "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--num-prompts", str(n),
           "--request-rate", rate, "--ignore-eos", "--seed", str(seed), "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
           "--save-result", "--result-dir", str(out), "--result-filename", name]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return json.loads((out / name).read_text())


def _wait_health(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(1)
    raise RuntimeError("vllm serve not healthy in time")


def _study(model: str, ingress: str, serving: dict):
    from orchestrator.study.spec import parse_study

    return parse_study({
        "name": f"ingress-{ingress}",
        "engine": {"kind": "vllm", "platform": "cuda", "ingress": ingress, "load_format": "dummy",
                   "model_source": model, "start_timeout_s": 480},
        "model": {"name": "llama-3.1-8b", "dtype": "bfloat16"},
        "hardware": {"gpu": "H200", "gpus_per_node": 1},
        "workload": {"arrival": {"kind": "poisson", "rate": 40}, "input_len": 512, "output_len": 128},
        "space": {**CONFIG, **serving},
        "objectives": ["maximize output_throughput"],
    })


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    serving = json.loads(args.serving) if args.serving else {}
    label = args.label or (args.mode + ("-" + "-".join(f"{k}{v}" for k, v in serving.items()) if serving else ""))
    rates = args.rates.split(",")
    result = {"label": label, "mode": args.mode, "serving": serving, "config": CONFIG, "runs": []}
    t0 = time.monotonic()
    if args.mode == "bare":
        port = 8100
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
               "--served-model-name", "bare", "--load-format", "dummy", "--port", str(port),
               "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning",
               *[f"--{k.replace('_', '-')}={v}" for k, v in CONFIG.items()]]
        log = open(out / f"server_{label}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base, model, stop = f"http://127.0.0.1:{port}", "bare", lambda: (proc.terminate(), proc.wait(60))
        _wait_health(base, proc, 480)
    else:
        os.environ["PYTHONPATH"] = f"{REPO}:{os.environ.get('PYTHONPATH', '')}"  # replicas import the package
        import ray

        from orchestrator.cluster.connect import start_serve
        from orchestrator.engines import EngineContext
        from orchestrator.hardware.engine_args import engine_args_from_params
        from orchestrator.search.trial_plan import engine_for

        ray.init(include_dashboard=False, namespace="orchestrator")
        context = EngineContext(serve_port=start_serve(8000))
        study = _study(args.model, args.mode, serving)
        engine = engine_for(study, context)
        eargs = engine.resolve(engine_args_from_params({**CONFIG, **serving}))
        deployment = engine.deploy("ingress", eargs)
        deployment.__enter__()
        base, model = deployment.endpoint.base_url, deployment.endpoint.model
        stop = lambda: deployment.__exit__(None, None, None)  # noqa: E731
    result["deploy_s"] = time.monotonic() - t0
    print(f"DEPLOY {label} {result['deploy_s']:.1f}s {base}", flush=True)
    try:
        warm = bench(base, model, args.model, str(args.warmup_rate), 1000, args.warmup_prompts, out, label + "_warmup",
                     args.input_len, args.output_len)
        print(f"WARMUP {label}: {warm['request_throughput']:.1f} req/s", flush=True)
        for i, rate in enumerate(rates):
            r = bench(base, model, args.model, rate, 1001 + i, args.num_prompts, out, label, args.input_len,
                      args.output_len)
            row = {k: r.get(k) for k in ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
                                         "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms",
                                         "completed", "duration")}
            row.update(rate=rate, seed=1001 + i)
            result["runs"].append(row)
            print(f"BENCH {label} rate={rate}: {row['request_throughput']:.1f} req/s, TTFT p50/p99 "
                  f"{row['median_ttft_ms']:.0f}/{row['p99_ttft_ms']:.0f} ms, TPOT p50 {row['median_tpot_ms']:.1f} ms",
                  flush=True)
    finally:
        t1 = time.monotonic()
        stop()
        result["teardown_s"] = time.monotonic() - t1
    (out / f"ingress_{label}.json").write_text(json.dumps(result, indent=1))


def table(args) -> None:
    """Markdown table of every ``ingress_*.json`` under the folder, ratios against ``bare`` (the table of
    docs/benchmarks.md, kept equal to its dataset by ``python -m orchestrator.doc_tables.registry``)."""
    from orchestrator.doc_tables.h200 import ingress_table

    print(ingress_table(args.folder))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", choices=("bare", "engine", "serve_llm"), required=True)
    r.add_argument("--model", required=True, help="model directory (config + tokenizer; dummy weights)")
    r.add_argument("--out", required=True)
    r.add_argument("--serving", default="", help="serve_llm: JSON of num_ingress_replicas / stream_batching_interval_ms")
    r.add_argument("--label", default="")
    r.add_argument("--rates", default="40,inf")
    r.add_argument("--num-prompts", type=int, default=480)
    r.add_argument("--warmup-prompts", type=int, default=200)
    r.add_argument("--warmup-rate", default="40")
    r.add_argument("--input-len", type=int, default=512)
    r.add_argument("--output-len", type=int, default=128)
    t = sub.add_parser("table")
    t.add_argument("folder")
    args = p.parse_args()
    run(args) if args.cmd == "run" else table(args)


if __name__ == "__main__":
    main()
