"""``orchestrator recommend``: the command line vLLM itself parses back to the trial's parameters."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import asdict

import pandas as pd
import pytest
import yaml

from conftest import REPO
from orchestrator.apps.recommend import RecommendError, engine_args_of, recommend, select_trial
from orchestrator.hardware.engine_args import SPECULATIVE_ARGS, EngineArgs
from orchestrator.study.spec import parse_study
from support.studies import sim_doc

# vLLM's own `vllm serve` parser (the CPU build is enough): argv in, the parsed engine arguments out as JSON.
# One process (importing vLLM takes seconds) for two commands: argv[1] and a speculative one, argv[5].
VLLM_PARSE = r"""
import json, shlex, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser(prog="vllm")
serve = ServeSubcommand()
serve.subparser_init(parser.add_subparsers(dest="subcommand", required=True))

def parse(command):
    argv = shlex.split(command)
    assert argv[0] == "vllm", argv
    args = parser.parse_args(argv[1:])
    serve.validate(args)
    args.model = args.model_tag
    return args, AsyncEngineArgs.from_cli_args(args)

args, engine = parse(sys.argv[1])
from_kwargs = AsyncEngineArgs(model=args.model, **json.loads(sys.argv[2]))
fields = json.loads(sys.argv[3])

# Ray's own models accept the Serve config (what `serve run FILE` validates first).
import yaml
from ray.serve.llm import LLMConfig, LLMServingArgs
app = yaml.safe_load(open(sys.argv[4]))["applications"][0]
LLMServingArgs.model_validate(app["args"])
llm = LLMConfig.model_validate(app["args"]["llm_configs"][0])
print(json.dumps({"cli": {f: getattr(engine, f) for f in fields + ["model"]},
                  "llm_config": {"accelerator_type": llm.accelerator_type, "model_id": llm.model_id,
                                 "engine_kwargs": llm.engine_kwargs},
                  "kwargs": {f: getattr(from_kwargs, f) for f in fields},
                  "served_model_name": args.served_model_name,
                  "speculative_config": parse(sys.argv[5])[1].speculative_config}, default=str))
"""


def _study(tmp_path):
    return parse_study(sim_doc(
        name="rec", hardware={"gpus_per_node": 2},
        space={"max_num_seqs": [8, 64], "gpu_memory_utilization": {"type": "float", "low": 0.5, "high": 0.9,
                                                                     "step": 0.05}},
        objectives=["maximize output_throughput_per_gpu", "minimize ttft_p99_ms"],
        constraints=["ttft_p99_ms <= 500"], output=str(tmp_path)))


def _row(trial_id, status="completed", tput=100.0, ttft=100.0, **engine):
    args = EngineArgs(max_num_seqs=engine.get("max_num_seqs", 8), gpu_memory_utilization=0.6000000000000001,
                      max_num_batched_tokens=8192, max_model_len=131072, block_size=16, enable_chunked_prefill=True,
                      enable_prefix_caching=True)
    return {"trial_id": trial_id, "run_id": "r", "status": status, "gpu": "H100-80GB", "feasible": ttft <= 500,
            "output_throughput_per_gpu": tput, "ttft_p99_ms": ttft, "failure_kind": None,
            "engine_args_json": json.dumps(asdict(args)) if status == "completed" else None}


def test_select_by_slos_id_and_suffix(tmp_path):
    study = _study(tmp_path)
    trials = pd.DataFrame([_row("r-0000", tput=300, ttft=900), _row("r-0001", tput=200, ttft=400),
                           _row("r-0002", tput=150, ttft=100), _row("r-0003", status="infeasible")])
    assert select_trial(trials, study)["trial_id"] == "r-0001"  # best throughput under ttft <= 500
    assert select_trial(trials, study, slos=["ttft_p99_ms <= 1000"])["trial_id"] == "r-0000"
    assert select_trial(trials, study, slos=["ttft_p99_ms <= 1000"],
                        objective="minimize ttft_p99_ms")["trial_id"] == "r-0002"
    assert select_trial(trials, study, trial_id="-0002")["trial_id"] == "r-0002"
    with pytest.raises(RecommendError, match="did not complete"):
        select_trial(trials, study, trial_id="r-0003")
    with pytest.raises(RecommendError, match="did you mean"):
        select_trial(trials, study, trial_id="r-0009")
    with pytest.raises(RecommendError, match="best seen 100"):
        select_trial(trials, study, slos=["ttft_p99_ms <= 50"])
    # An objective on a metric the trials do not have: a usage error naming the near ones, not a KeyError.
    with pytest.raises(ValueError, match="no metric 'output_throughput_per_gpus'.*did you mean output_throughput_per_gpu"):
        select_trial(trials, study, objective="maximize output_throughput_per_gpus")


def test_floats_are_written_as_typed(tmp_path):
    study = _study(tmp_path)
    rec = recommend(pd.DataFrame([_row("r-0000")]), study, slos=[], model="/models/llama")
    assert "--gpu-memory-utilization 0.6 " in rec.vllm_command() + " "
    assert rec.llm_config()["engine_kwargs"]["gpu_memory_utilization"] == 0.6
    assert rec.accelerator_type == "H100"
    assert rec.vllm_argv()[:3] == ["vllm", "serve", "/models/llama"]
    assert rec.vllm_argv()[-2:] == ["--served-model-name", "llama-3.1-8b"]
    assert engine_args_of(pd.Series(_row("x"))).max_num_batched_tokens == 8192


@pytest.mark.slow
@pytest.mark.vllm
def test_recommended_command_parses_with_vllm_and_matches_the_trial(tmp_path_factory, tmp_path):
    from support.quickstart_dataset import shared_quickstart

    from orchestrator.results import load_trials, pareto_front
    from orchestrator.results.definition import read_study_definition

    study_dir = shared_quickstart(tmp_path_factory)
    study = read_study_definition(str(study_dir))
    trials = load_trials(study_dir)
    front = pareto_front(trials, study.objectives)  # the quickstart's SLOs may be out of reach in a short run
    chosen = front.iloc[-1]  # a front point other than the highest-throughput one, when there are several

    config = tmp_path / "serve.yaml"
    checkpoint = tmp_path / "models" / "Llama-3.1-8B-Instruct"  # vLLM resolves a path that exists as it is
    checkpoint.mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "orchestrator", "recommend", str(study_dir), "--trial",
                        chosen["trial_id"], "--model", str(checkpoint), "--serve-config", str(config)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    command = next(line for line in r.stdout.splitlines() if line.startswith("vllm serve "))
    slo_line = next(line for line in r.stdout.splitlines() if line.startswith("SLOs: "))
    for c in study.constraints:  # met or missed, as measured
        assert f"{c}: {'met' if c.met(chosen[c.metric]) else 'MISSED'}" in slo_line

    params = json.loads(chosen["params_json"])
    resolved = json.loads(chosen["engine_args_json"])
    serve_config = yaml.safe_load(config.read_text())
    llm_config = serve_config["applications"][0]["args"]["llm_configs"][0]
    # the speculation knobs are not engine fields of vLLM's: they reach it as one speculative_config (below)
    fields = sorted(k for k, v in resolved.items() if k != "extra" and v is not None and k not in SPECULATIVE_ARGS)
    # A trial that speculated (n-gram lookup): its three knobs reach vLLM as one speculative_config.
    speculative = EngineArgs(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=2)
    speculative_row = {**_row("r-0009"), "engine_args_json": json.dumps(asdict(speculative))}
    speculative_command = recommend(pd.DataFrame([speculative_row]), _study(tmp_path), slos=[],
                                    model=str(checkpoint)).vllm_command()
    parsed = subprocess.run([sys.executable, "-c", VLLM_PARSE, command, json.dumps(llm_config["engine_kwargs"]),
                             json.dumps(fields), str(config), speculative_command],
                            capture_output=True, text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VLLM_NO_USAGE_STATS": "1",
                                 "HF_HUB_OFFLINE": "1"})
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    out = json.loads(parsed.stdout.strip().splitlines()[-1])

    assert out["cli"]["model"] == str(checkpoint)
    assert out["served_model_name"] == ["llama-3.1-8b"]
    for name, value in params.items():  # every searched parameter, as vLLM understood it
        assert out["cli"][name] == pytest.approx(value), name
    for name in fields:  # the resolved defaults too, from the command and from the LLMConfig alike
        assert out["cli"][name] == pytest.approx(resolved[name]), name
        assert out["kwargs"][name] == out["cli"][name], name

    assert out["llm_config"]["accelerator_type"] == "H100" and out["llm_config"]["model_id"] == "llama-3.1-8b"
    assert out["llm_config"]["engine_kwargs"] == llm_config["engine_kwargs"]
    assert serve_config["applications"][0]["import_path"] == "ray.serve.llm:build_openai_app"
    assert shlex.split(command)[2] == str(checkpoint)
    assert out["speculative_config"] == speculative.speculative_config() == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def test_recommendation_states_the_agreement_it_was_chosen_under(tmp_path):
    study = _study(tmp_path)
    probed = {**_row("r-0001", tput=200), "token_agreement": 0.97, "prefix_agreement": 0.8, "logprob_diff_mean": 0.01,
              "probe_reference": "dummy", "probe_baseline": "r-0000"}
    rec = recommend(pd.DataFrame([_row("r-0000", tput=100), probed]), study, slos=["token_agreement >= 0.95"])
    assert rec.trial_id == "r-0001"
    assert rec.agreement == ("agreement with baseline trial r-0000 (reference: dummy): token_agreement 0.97, "
                             "prefix_agreement 0.8, logprob_diff_mean 0.01")
    assert f"# {rec.agreement}\n" in rec.serve_config_yaml()
    assert recommend(pd.DataFrame([_row("r-0000")]), study).agreement is None  # no probe, nothing claimed
