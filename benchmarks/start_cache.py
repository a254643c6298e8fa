"""What the study's shared compile cache saves: the same trials with it and without it.

Real vLLM with torch.compile on (``enforce_eager`` false), through the product's own path
(``run_study``: Ray, Serve, Tune, the results sink), the same ``--trials`` configurations twice:

* ``shared``: one study of all of them: vLLM's compile cache and Inductor's in the study's
  folder, shared by its trials (what a study does unless ``VLLM_CACHE_ROOT`` /
  ``TORCHINDUCTOR_CACHE_DIR`` are set);
* ``cold``: each configuration in a study of its own, run after the shared one: every start
  begins with empty caches (a fresh cache folder per trial).

The configurations differ only in what leaves vLLM's compile cache key alone (prefix caching,
``stream_interval``, and ``gpu_memory_utilization`` on a GPU), except with ``--key-change``, where
the last one doubles ``max_num_batched_tokens`` (a new compile range: compiled again). Every trial
replays the same short load (it measures the start, not the engine).

Prints each trial's start phases from vLLM's log (``start_*``; torch.compile compiled, or loaded
from the cache), ``startup_s`` and its device-seconds (the trial's GPUs, or on vLLM-CPU its CPU
unit, held from deploy to release: ``wall_time_s - queue_s`` times the units), each arm's total
and shared against cold: the table of docs/benchmarks.md
(:func:`orchestrator.doc_tables.start_phases.start_cache_table`). Nothing is asserted.

    python benchmarks/start_cache.py [--trials 3] [--key-change] [--output DIR]     # vLLM-CPU, tiny model
    python benchmarks/start_cache.py --gpu H100-80GB --model llama-3.1-8b --model-source DIR [--trials 6]
    ... --arms shared | --arms cold --cold-trials 2,3 --output SAME_DIR    # the arms in two runs (a device call's time)

On a GPU, ``DIR`` holds the model's config.json and tokenizer (``load_format: dummy``: random
weights). ``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR`` are unset for the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SERVE_PORT = 8137


def configurations(n: int, gpu: bool, key_change: bool) -> list[dict[str, Any]]:
    """``n`` configurations of one compile cache key (but the last, with ``key_change``)."""
    base: dict[str, Any] = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 1024,
                            "enforce_eager": False}
    out = []
    for k in range(n):
        point = {**base, "enable_prefix_caching": k % 2 == 0, "stream_interval": (1, 2, 4)[k % 3]}
        if gpu:
            point["gpu_memory_utilization"] = (0.9, 0.85, 0.8)[k % 3]
        out.append(point)
    if key_change and n > 1:
        out[-1]["max_num_batched_tokens"] = 2 * base["max_num_batched_tokens"]
    return out


def study_doc(name: str, output: Path, points: list[dict[str, Any]], a: argparse.Namespace,
              model_dir: Path) -> dict[str, Any]:
    values = {k: sorted({p[k] for p in points}) for k in points[0]}
    space: dict[str, Any] = {k: v if len(v) > 1 else v[0] for k, v in values.items()}  # one value: fixed
    engine: dict[str, Any] = {"kind": "vllm", "model_source": str(model_dir), "start_timeout_s": 900}
    if a.gpu:
        engine.update(platform="cuda", load_format="dummy")
        hardware = {"gpu": a.gpu, "gpus_per_node": 1}
        model = {"name": a.model}
    else:
        engine.update(platform="cpu", engine_kwargs={"kv_cache_memory_bytes": 8 * 2**20})
        hardware = {"gpu": "CPU"}
        model = {"name": "tiny-llama", "dtype": "float32"}
    return {
        "name": name, "engine": engine, "model": model, "hardware": hardware,
        "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": a.requests, "warmup_requests": 1,
                     "warmup": {"enabled": False}, "input_len": {"kind": "uniform", "min": 64, "max": 128},
                     "output_len": 16, "timeout_s": 120},
        "space": space, "objectives": ["maximize output_throughput"],
        "search": {"sampler": "random", "initial_points": points, "preflight": False},
        "budget": {"trials": len(points), "max_concurrent_trials": 1},
        "output": str(output),
    }


def run_arm(docs: list[dict[str, Any]]) -> None:
    """Run each study document, one after another."""
    from orchestrator.results.definition import write_study_definition
    from orchestrator.search.driver import run_study
    from orchestrator.study.spec import parse_study

    for doc in docs:
        study = parse_study(doc)
        write_study_definition(study)  # study.json beside the data: `orchestrator show` reads it
        t0 = time.monotonic()
        run = run_study(study, quiet=True, resume=False, serve_port=SERVE_PORT)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())  # the machine may be shared: how busy it was
        print(f"  {study.name}: {time.monotonic() - t0:.0f} s ({run.study_dir}); load average now {load}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--key-change", action="store_true", help="the last trial doubles max_num_batched_tokens")
    ap.add_argument("--requests", type=int, default=8, help="measured requests per trial (at 4 req/s)")
    ap.add_argument("--gpu", help="a GPU of the catalog (e.g. H100-80GB); default: vLLM-CPU")
    ap.add_argument("--model", default="llama-3.1-8b", help="with --gpu: the model's shape in the catalog")
    ap.add_argument("--model-source", type=Path, help="with --gpu: its config.json and tokenizer")
    ap.add_argument("--output", type=Path, default=None)
    ap.add_argument("--arms", default="shared,cold", help="which arms to run: shared, cold or both (the table "
                    "reads whatever --output holds, so the arms may run one after the other into one folder)")
    ap.add_argument("--cold-trials", default=None,
                    help="the cold arm's configurations, 1-based (e.g. 2,3: those the shared arm started from "
                         "its cache); default: all")
    a = ap.parse_args(argv)
    if a.gpu and a.model_source is None:
        ap.error("--gpu needs --model-source (a folder with config.json and a tokenizer)")
    out = a.output or Path(tempfile.mkdtemp(prefix="start-cache-"))
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):  # the study's own caches, not these
        os.environ.pop(var, None)

    import ray

    from orchestrator.cluster.connect import start_serve
    from orchestrator.doc_tables.start_phases import arm_trials, start_cache_measured_table, start_cache_table
    from orchestrator.models.modelgen import make_model_dir

    model_dir = a.model_source or make_model_dir("tiny-llama", out / "tiny-llama", weights="random")
    points = configurations(a.trials, bool(a.gpu), a.key_change)
    shared_docs = [study_doc("start-cache-shared", out / "shared", points, a, model_dir)]
    cold_ks = [int(k) - 1 for k in a.cold_trials.split(",")] if a.cold_trials else range(len(points))
    cold_docs = [study_doc(f"start-cache-cold-{k + 1}", out / "cold", [points[k]], a, model_dir) for k in cold_ks]
    arms = {x.strip() for x in a.arms.split(",")}
    if not arms <= {"shared", "cold"}:
        ap.error(f"--arms: {a.arms!r}; allowed: shared, cold (comma-separated)")
    ray.init(address="local", num_cpus=4, num_gpus=1 if a.gpu else 0, include_dashboard=False,
             namespace="orchestrator", log_to_driver=False)
    try:
        start_serve(SERVE_PORT)
        if "shared" in arms:
            print(f"shared caches, one study of {len(points)} trials:", flush=True)
            run_arm(shared_docs)
        if "cold" in arms:
            print(f"cold caches, {len(cold_docs)} studies of one trial:", flush=True)
            run_arm(cold_docs)
    finally:
        ray.shutdown()

    unit = "GPUs" if a.gpu else "CPU unit (vLLM-CPU)"
    print(f"\ndevice: {a.gpu or 'CPU'}; device-s: the trial's {unit} held from deploy to release\n")
    print(start_cache_table(out))
    print("\n" + start_cache_measured_table(out))
    if (out / "shared").is_dir() and (out / "cold").is_dir():
        shared, cold = arm_trials(out / "shared"), arm_trials(out / "cold")
        cold_s = dict(zip(cold["params_json"], cold["startup_s"]))
        pairs = [(k + 1, s, cold_s[pj]) for k, (pj, s) in enumerate(zip(shared["params_json"], shared["startup_s"]))
                 if pj in cold_s]
        print("\nshared / cold, configuration by configuration (startup_s): "
              + ", ".join(f"{k}: {s / c:.2f}x" for k, s, c in pairs))
    print(f"datasets: {out}/shared, {out}/cold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
