"""What the probe's numbers mean on a trained model: the noise floor, a dtype, and speculation.

The tiny trained model (``make-model --weights trained``, recipe ``tiny``) on CPU vLLM, one
study, one engine start per configuration, the probe at ``concurrency`` 8 (so batches form and
their composition can move the numerics):

* ``baseline``: float32, max_num_seqs 8, no speculation;
* ``max_num_seqs 1``: the baseline's configuration at another batch size: the **noise floor**,
  what a setting that should change nothing reads;
* ``bfloat16``: a lower compute dtype;
* ``ngram 3``: n-gram speculation (3 tokens, lookup 2..3), which must leave greedy answers as
  they are.

    python benchmarks/trained_probe.py [--output DIR]

Prints one line per configuration: agreement, logprob drift, held-out perplexity and its delta,
and the engine's speculative acceptance.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = [  # (label, searched parameters); the first is the probe's baseline
    ("baseline", {"dtype": "float32", "max_num_seqs": 8, "num_speculative_tokens": 0}),
    ("max_num_seqs 1", {"dtype": "float32", "max_num_seqs": 1, "num_speculative_tokens": 0}),
    ("bfloat16", {"dtype": "bfloat16", "max_num_seqs": 8, "num_speculative_tokens": 0}),
    ("ngram 3", {"dtype": "float32", "max_num_seqs": 8, "num_speculative_tokens": 3}),
]
COLUMNS = ("token_agreement", "prefix_agreement", "logprob_diff_mean", "logprob_diff_p95", "heldout_perplexity",
           "perplexity_delta", "engine_spec_acceptance_rate")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=Path(tempfile.mkdtemp(prefix="trained-probe-")))
    args = p.parse_args(argv)

    import ray

    from orchestrator.models.modelgen import trained_model_dir
    from orchestrator.results import load_trials
    from orchestrator.search.driver import run_study
    from orchestrator.study.spec import parse_study

    model_dir = trained_model_dir("tiny-llama", "tiny")
    study = parse_study({
        "name": "trained-probe",
        "engine": {"kind": "vllm", "platform": "cpu", "model_source": str(model_dir), "start_timeout_s": 600,
                   "engine_kwargs": {"kv_cache_memory_bytes": 8 * 2**20}},
        "model": {"name": str(model_dir), "dtype": "float32"},
        "hardware": {"gpu": "CPU"},
        "workload": {"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 8, "warmup_requests": 1,
                     "input_len": 32, "output_len": 96, "timeout_s": 120},
        "space": {"dtype": ["float32", "bfloat16"], "max_num_seqs": [8, 1], "num_speculative_tokens": [0, 3],
                  "prompt_lookup_max": 3, "prompt_lookup_min": 2, "max_model_len": 1024, "enforce_eager": True},
        "objectives": ["maximize output_throughput"],
        "probe": {"prompts": 64, "max_input_tokens": 128, "output_tokens": 32, "concurrency": 8,
                  "baseline": CONFIGS[0][1]},
        "search": {"sampler": "random", "initial_points": [c for _, c in CONFIGS[1:]], "preflight": False},
        "budget": {"trials": len(CONFIGS), "max_concurrent_trials": 1},
        "output": str(args.output),
    })
    ray.init(address="local", num_cpus=3, include_dashboard=False, namespace="orchestrator")
    try:
        run = run_study(study, quiet=True, serve_port=8135)
    finally:
        ray.shutdown()
    trials = load_trials(run.study_dir)
    print(f"model {model_dir}; results {args.output}")
    print("| configuration | " + " | ".join(COLUMNS) + " |")
    print("| --- " * (len(COLUMNS) + 1) + "|")
    for label, params in CONFIGS:
        row = trials[(trials[list(params)] == list(params.values())).all(axis=1)].iloc[0]
        cells = [f"{row[c]:.4g}" if row[c] == row[c] and row[c] is not None else "null" for c in COLUMNS]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
