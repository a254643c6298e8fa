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
and the engine's speculative acceptance. ``--output DIR`` keeps the dataset the docs read
(docs/trained-models.md's table and bullets come from ``results/examples/trained-probe-cpu-vllm``):
the study definition and trial rows, the baseline's probe answers, the Optuna journal, the model's
training record (``model-training.json``: torch's held-out perplexity) and ``run.json`` (the
command, its date and the configurations by label). The per-request rows, Ray Tune's state and the
other trials' answers (their columns are in the rows) stay in the temporary run folder: the dataset
stays well under 1 MB.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataset import RunRecord, write_files  # noqa: E402

CONFIGS = [  # (label, searched parameters); the first is the probe's baseline
    ("baseline", {"dtype": "float32", "max_num_seqs": 8, "num_speculative_tokens": 0}),
    ("max_num_seqs 1", {"dtype": "float32", "max_num_seqs": 1, "num_speculative_tokens": 0}),
    ("bfloat16", {"dtype": "bfloat16", "max_num_seqs": 8, "num_speculative_tokens": 0}),
    ("ngram 3", {"dtype": "float32", "max_num_seqs": 8, "num_speculative_tokens": 3}),
]
COLUMNS = ("token_agreement", "prefix_agreement", "logprob_diff_mean", "logprob_diff_p95", "heldout_perplexity",
           "perplexity_delta", "engine_spec_acceptance_rate")


def keep_dataset(study_dir: Path, output: Path, training: Path, record: RunRecord) -> None:
    """Copy what the docs read from the run's folder into ``output`` (whole or not at all), with the
    training record and the run's record (``run.json``: the command and the configurations)."""

    def probes(path: Path) -> None:
        for baseline in study_dir.glob("probe/*/baseline.json"):
            (path / baseline.parent.relative_to(study_dir / "probe")).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(baseline, path / baseline.relative_to(study_dir / "probe"))

    run = record.finish(configurations=[{"label": label, "params": params} for label, params in CONFIGS])
    write_files(output, run, {
        "trials": lambda path: shutil.copytree(study_dir / "trials", path),
        "study.json": lambda path: shutil.copyfile(study_dir / "study.json", path),
        "optuna.journal": lambda path: shutil.copyfile(study_dir / "optuna.journal", path),
        "probe": probes,
        "model-training.json": lambda path: shutil.copyfile(training, path)})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, help="keep the dataset in this new folder (default: keep nothing)")
    args = p.parse_args(argv)
    if args.output is not None and args.output.exists() and any(args.output.iterdir()):
        p.error(f"{args.output} is not empty: the dataset goes into a new folder")

    record = RunRecord.for_script("trained_probe.py", sys.argv[1:] if argv is None else argv)
    import ray

    from orchestrator.models.modelgen import trained_model_dir
    from orchestrator.models.training import TRAINING_FILE
    from orchestrator.results import load_trials
    from orchestrator.results.definition import write_study_definition
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
        "output": tempfile.mkdtemp(prefix="trained-probe-"),
    })
    write_study_definition(study)  # as `orchestrator run` does: the rows' objectives and probe settings
    ray.init(address="local", num_cpus=3, include_dashboard=False, namespace="orchestrator")
    try:
        run = run_study(study, quiet=True, serve_port=8135)
    finally:
        ray.shutdown()
    if args.output is not None:
        keep_dataset(Path(run.study_dir), args.output, model_dir / TRAINING_FILE, record)
    trials = load_trials(run.study_dir)
    print(f"model {model_dir}; results {args.output or run.study_dir}")
    print("| configuration | " + " | ".join(COLUMNS) + " |")
    print("| --- " * (len(COLUMNS) + 1) + "|")
    for label, params in CONFIGS:
        row = trials[(trials[list(params)] == list(params.values())).all(axis=1)].iloc[0]
        cells = [f"{row[c]:.4g}" if row[c] == row[c] and row[c] is not None else "null" for c in COLUMNS]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
