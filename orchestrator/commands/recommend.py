"""``orchestrator recommend``: the ``vllm serve`` command and Ray Serve LLM config of one trial."""

from __future__ import annotations

from pathlib import Path

from orchestrator.apps.recommend import RecommendError, recommend
from orchestrator.commands.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, err, study_from_dataset
from orchestrator.results import load_trials


def cmd_recommend(args) -> int:
    study = study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    try:
        trials = load_trials(args.path, run=args.run)
        rec = recommend(trials, study, trial_id=args.trial, slos=args.slo or None, objective=args.objective,
                        model=args.model)
    except RecommendError as e:
        err(f"recommend: {e}")
        return EXIT_FAILURE
    except ValueError as e:  # a malformed --slo or --objective
        err(f"recommend: {e}")
        return EXIT_USAGE
    config_yaml = rec.serve_config_yaml()
    if args.serve_config:
        Path(args.serve_config).write_text(config_yaml)
    if args.format == "command":
        print(rec.vllm_command())
        return EXIT_OK
    if args.format == "yaml":
        print(config_yaml, end="")
        return EXIT_OK
    print(f"trial {rec.trial_id} (run {rec.run_id}): {rec.measured_text()}")
    if rec.intervals:
        print("  ([low, high]: where the true value lies, at the confidence the trial was measured with)")
    if rec.choice:
        print(f"  {rec.choice}")
    if rec.slos:
        print("SLOs: " + "; ".join(rec.slo_lines()))
    if rec.agreement:
        print(rec.agreement)
    print()
    print("# vllm serve")
    print(rec.vllm_command())
    print()
    written = f", written to {args.serve_config}" if args.serve_config else ""
    print(f"# Ray Serve LLM (ray.serve.llm.LLMConfig){written}")
    print(config_yaml, end="")
    return EXIT_OK


def register(sub) -> None:
    r = sub.add_parser("recommend", help="the vllm serve command and Ray Serve LLM config of a trial",
                       description="Pick a trial (by id, or the best one under SLOs) and print the exact "
                                   "`vllm serve` command and the ray.serve.llm config that reproduce it.")
    r.add_argument("path", help="the study's result directory (<output>/<study>)")
    r.add_argument("--trial", help="trial id (or a unique suffix, e.g. -0007)")
    r.add_argument("--slo", action="append", metavar="'METRIC<=VALUE'",
                   help="an SLO the trial must meet (repeatable); default: the study's constraints")
    r.add_argument("--objective", help="'maximize|minimize METRIC' to rank by; default: the study's first objective")
    r.add_argument("--run", help="only trials of this run id")
    r.add_argument("--model", help="checkpoint path or Hugging Face id to serve (default: the study's model source)")
    r.add_argument("--format", choices=["text", "command", "yaml"], default="text",
                   help="text: both, with the measurements; command: only the vllm serve line; yaml: only the config")
    r.add_argument("--serve-config", metavar="FILE", help="also write the Ray Serve config YAML here")
    r.set_defaults(func=cmd_recommend)
