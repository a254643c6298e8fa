"""``serve-sim``: the simulated engine as a standalone OpenAI-compatible server.

``orchestrator serve-sim STUDY`` serves the study's model on its GPU (dtype, calibration and
the space's fixed engine arguments included); ``orchestrator serve-sim --model M --gpu G``
serves a catalog model without a study. Engine arguments (``--max-num-seqs``, ...) override
either. For testing an OpenAI client, or as the endpoint of a ``kind: external`` study.

It is the sim trial's own server: the same :class:`~orchestrator.engines.sim.http_server.OpenAIFrontend`
over the same engine loop, through the direct door a trial's load generator uses
(``transport: direct``). Ray Serve adds nothing a standalone server needs (a replica, a
proxy, a controller), so none is started: one process, ready in about a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

from orchestrator.commands.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, err, load_study_or_report
from orchestrator.engines.sim.served import sim_resolve
from orchestrator.failures import EngineStartError
from orchestrator.hardware.accelerator import with_device_defaults
from orchestrator.hardware.engine_args import (ENGINE_ARG_RULES, SERVING_ARGS, SPECULATIVE_ARGS,
                                               engine_args_from_params, validate_engine_arg)
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape, find_model_config
from orchestrator.study.engine import SimCalibration
from orchestrator.study.space import FixedParam

_ENGINE_FLAGS = tuple(name for name in ENGINE_ARG_RULES if name not in SERVING_ARGS + SPECULATIVE_ARGS)


def _choice_type(choices: tuple):
    kinds = {type(c) for c in choices if c is not None}
    return int if kinds == {int} else str


def register(sub) -> None:
    p = sub.add_parser(
        "serve-sim", help="serve the simulated engine as an OpenAI-compatible server",
        description="Serve the simulated engine's OpenAI API (/v1/completions, /v1/chat/completions, "
                    "/v1/models, /health, /version, /metrics) for a study's model and GPU, or for --model and --gpu. "
                    "Ctrl-C stops it.")
    p.add_argument("study", nargs="?", help="a study file: its model, GPU, dtype, calibration and fixed "
                                            "engine arguments")
    p.add_argument("--model", help="model catalog name or config.json path (without a study)")
    p.add_argument("--gpu", help="GPU type, e.g. H100-80GB (without a study)")
    p.add_argument("--served-model-name", help="the model id the API answers to (default: the study's "
                                               "model.served_name, else the model name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    engine = p.add_argument_group("engine arguments", "vLLM's engine arguments, as `vllm serve` spells them")
    for name in _ENGINE_FLAGS:
        rule = ENGINE_ARG_RULES[name]
        flag = "--" + name.replace("_", "-")
        if rule.kind == "bool":
            engine.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=rule.help)
        elif rule.kind == "choice":
            engine.add_argument(flag, dest=name, type=_choice_type(rule.choices), help=rule.help,
                                choices=[c for c in rule.choices if c is not None])
        else:
            engine.add_argument(flag, dest=name, type=int if rule.kind == "int" else float, help=rule.help)
    p.set_defaults(func=cmd_serve_sim)


def _fixed_args(study) -> dict[str, Any]:
    """The study space's fixed engine arguments (those without a condition)."""
    return {name: p.value for name, p in study.space.params.items()
            if isinstance(p, FixedParam) and not p.when and name in ENGINE_ARG_RULES}


def cmd_serve_sim(args) -> int:
    if args.study and (args.model or args.gpu):
        err("serve-sim: give a study file, or --model and --gpu, not both")
        return EXIT_USAGE
    if not args.study and not (args.model and args.gpu):
        err("serve-sim: give a study file, or both --model and --gpu")
        return EXIT_USAGE
    given = {name: getattr(args, name) for name in _ENGINE_FLAGS if getattr(args, name) is not None}
    for name, value in given.items():
        why = validate_engine_arg(name, value)
        if why:
            err(f"serve-sim: --{name.replace('_', '-')} {value}: {why}")
            return EXIT_USAGE
    try:
        spec = _spec_from_study(args, given) if args.study else _spec_from_flags(args, given)
    except (KeyError, FileNotFoundError, ValueError) as e:
        err(f"serve-sim: {e.args[0] if isinstance(e, KeyError) and e.args else e}")
        return EXIT_USAGE
    if spec is None:
        return EXIT_USAGE
    return _serve(spec, args.host, args.port)


def _spec_from_study(args, given: dict) -> Optional[dict]:
    study = load_study_or_report(args.study)
    if study is None:
        return None
    resolved = sim_resolve(study, engine_args_from_params({**_fixed_args(study), **given}))
    calibration = study.engine.calibration if study.engine.kind == "sim" else SimCalibration()
    return {"model_path": find_model_config(study.model.name, study.base_dir), "model_name": study.model.name,
            "gpu": study.hardware.gpu, "args": resolved, "calibration": calibration, "dtype": study.model.dtype,
            "served": args.served_model_name or study.model.served_name or study.model.name}


def _spec_from_flags(args, given: dict) -> dict:
    gpu = get_gpu(args.gpu)
    path = find_model_config(args.model, Path.cwd())
    model = ModelShape.load(str(path))
    resolved = with_device_defaults(engine_args_from_params(given), gpu, model_max_len=model.max_position_embeddings)
    return {"model_path": path, "model_name": args.model, "gpu": gpu.name, "args": resolved,
            "calibration": SimCalibration(), "dtype": "auto", "served": args.served_model_name or args.model}


def _serve(spec: dict, host: str, port: int) -> int:
    # deferred: aiohttp's server and the served simulator (~50 ms); every command loads this module
    from orchestrator.engines.sim.http_server import build_sim_frontend, serve_direct

    args = spec["args"]
    try:
        front = build_sim_frontend(
            model_config=json.loads(Path(spec["model_path"]).read_text()), model_name=spec["model_name"],
            gpu=spec["gpu"], engine_args={f.name: getattr(args, f.name) for f in fields(args) if f.name != "extra"},
            calibration=spec["calibration"].model_dump(), served_model_name=spec["served"], dtype=spec["dtype"])
    except EngineStartError as e:  # what vLLM would fail to start with (out of memory, refused arguments)
        err(f"serve-sim: the engine does not start: {e}")
        return EXIT_FAILURE
    loop = front.rt.loop
    try:
        runner, bound = asyncio.run_coroutine_threadsafe(serve_direct(front, host, port), loop).result()
    except OSError as e:
        err(f"serve-sim: cannot listen on {host}:{port}: {e.strerror or e}")
        return EXIT_FAILURE
    stop = threading.Event()
    # Ctrl-C and SIGTERM stop it, also where it was started with SIGINT ignored (a shell's background job)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{bound}"
    settings = ", ".join(f"{k}={v}" for k, v in args.explicit().items())
    print(f"serve-sim: {spec['served']} on a simulated {spec['gpu']} ({settings})", flush=True)
    print(f"OpenAI base URL: {base}/v1   (kind: external study: engine.base_url: {base})", flush=True)
    print("logprobs are synthetic; Ctrl-C stops it", flush=True)
    while not stop.wait(1.0):
        pass
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result()
    print("serve-sim: stopped", file=sys.stderr, flush=True)
    return EXIT_OK
