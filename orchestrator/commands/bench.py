"""``export-bench``, ``import-bench``, ``export-workload``, ``make-traces``: work with other tools' files.

* ``export-bench DIR --trial ID``: a trial in ``vllm bench serve``'s result-JSON layout;
* ``import-bench FILE... --into DIR``: vLLM result files into a results dataset;
* ``export-workload STUDY OUT``: the study's requests as ``vllm bench serve`` custom
  JSONL (the same prompts and output lengths, for a side-by-side run);
* ``make-traces DIR``: write the shipped sample traces.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from orchestrator.apps.interchange import from_bench_result, to_bench_result
from orchestrator.commands.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, err, load_study_or_report
from orchestrator.measure.metrics import RequestSLO
from orchestrator.results import ResultsStore, load_requests, load_trials
from orchestrator.results.definition import read_study_definition
from orchestrator.results.schema import requests_to_table
from orchestrator.search.trial_plan import load_plan
from orchestrator.study.judge import judge_row
from orchestrator.workload.datasets import write_vllm_custom
from orchestrator.workload.samples import write_sample_traces
from orchestrator.workload.tokens import token_ids_to_text
from orchestrator.workload.trace import TraceError


def cmd_export_bench(args) -> int:
    trials = load_trials(args.path)
    if trials.empty:
        err(f"export-bench: no trials under {args.path}")
        return EXIT_USAGE
    found = trials[trials["trial_id"] == args.trial]
    if found.empty:
        some = ", ".join(trials["trial_id"].head(5))
        err(f"export-bench: no trial {args.trial!r} under {args.path} (e.g. {some})")
        return EXIT_USAGE
    trial = found.iloc[-1].to_dict()
    requests = load_requests(args.path, trial_ids=[args.trial], include_warmup=True)
    if requests.empty:
        err(f"export-bench: trial {args.trial} has no request rows (status {trial['status']})")
        return EXIT_USAGE
    study = read_study_definition(args.path)
    slo = study.request_slo() if study is not None else None
    kwargs = {"slo": slo} if slo is not None else {}
    result = to_bench_result(trial, requests, level=args.level, detailed=not args.summary_only, **kwargs)
    text = json.dumps(result)
    if args.output in (None, "-"):
        sys.stdout.write(text + "\n")
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output} ({result['completed']} completed, {result['failed']} failed requests)")
    return EXIT_OK


def cmd_import_bench(args) -> int:
    target = Path(args.into)
    study = read_study_definition(str(target))
    if study is not None:
        name, fingerprint, param_types = study.name, study.fingerprint(), study.space.column_types()
        slo, price = study.request_slo(), study.hardware.price_per_gpu_hour
    else:
        name, fingerprint, param_types, slo, price = target.name, "external", {}, RequestSLO(), None
    store = ResultsStore(str(target.parent), name)
    bad = 0
    for path in args.files:
        try:
            raw = Path(path).read_bytes()
            data = json.loads(raw)
            row, records = from_bench_result(data, raw=raw, source=os.path.basename(path), study_name=name,
                                             fingerprint=fingerprint, param_types=param_types,
                                             gpus=args.gpus, gpu=args.gpu, slo=slo, price_per_gpu_hour=price)
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            err(f"{path}: {e}")
            bad += 1
            continue
        if study is not None:
            row.update(judge_row(study, row).columns())
        table = None
        if records is not None:
            table = requests_to_table(records, study=name, run_id=row["run_id"], trial_id=row["trial_id"])
        try:
            store.write_trial(row, table, param_types=param_types)
        except ValueError as e:
            err(f"{path}: {e}")
            bad += 1
            continue
        detail = f"{len(records)} requests" if records is not None else "summary only"
        print(f"{path}: imported as {row['trial_id']} ({detail}) into {store.study_path}")
    return EXIT_FAILURE if bad else EXIT_OK


def cmd_export_workload(args) -> int:
    study = load_study_or_report(args.study)
    if study is None:
        return EXIT_USAGE
    try:
        rs = load_plan(study).requests()
    except TraceError as e:
        err(f"{args.study}: {e}")
        return EXIT_USAGE
    n = write_vllm_custom(args.out, ((r.prompt_text or token_ids_to_text(r.prompt_token_ids), r.output_len)
                                     for r in rs.measured))
    rate = rs.requested_rate
    cmd = ["vllm", "bench", "serve", "--backend", "openai-chat" if study.workload.api == "chat" else "vllm",
           "--dataset-name", "custom", "--dataset-path", str(args.out), "--custom-output-len", "-1",
           "--num-prompts", str(n), "--request-rate", f"{rate:g}" if rate else "inf", "--ignore-eos",
           "--disable-shuffle"]
    if study.workload.api != "chat":
        cmd.append("--skip-chat-template")
    print(f"wrote {n} requests to {args.out}; replay them with:\n  {shlex.join(cmd)} --model MODEL --base-url URL")
    return EXIT_OK


def cmd_make_traces(args) -> int:
    for name, path in write_sample_traces(args.dir).items():
        print(f"wrote {path}")
    return EXIT_OK


def register(sub) -> None:
    e = sub.add_parser("export-bench", help="write a trial in vllm bench serve's result-JSON layout")
    e.add_argument("path", help="the study's result directory (<output>/<study>)")
    e.add_argument("--trial", required=True, help="trial id")
    e.add_argument("--level", type=int, help="capacity search: which load level (default: the trial row's)")
    e.add_argument("-o", "--output", "--out", dest="output", help="file to write (default: stdout)")
    e.add_argument("--summary-only", action="store_true", help="leave out the per-request lists")
    e.set_defaults(func=cmd_export_bench)

    i = sub.add_parser("import-bench", help="add vllm bench serve result files to a results dataset")
    i.add_argument("files", nargs="+", help="result JSON files (--save-result; --save-detailed adds requests)")
    i.add_argument("--into", required=True, help="a study's result directory (<output>/<study>); created if new")
    i.add_argument("--gpus", type=int, help="GPUs of the measured server (for the per-GPU metrics and cost_per_mtok)")
    i.add_argument("--gpu", help="GPU type of the measured server (its default price for cost_per_mtok)")
    i.set_defaults(func=cmd_import_bench)

    w = sub.add_parser("export-workload", help="write a study's requests as vllm bench serve custom JSONL")
    w.add_argument("study", help="study YAML file")
    w.add_argument("out", help="JSONL file to write")
    w.set_defaults(func=cmd_export_workload)

    t = sub.add_parser("make-traces", help="write the sample traces (chat, rag, summarisation, bursty, ...)")
    t.add_argument("dir", help="directory to write them to")
    t.set_defaults(func=cmd_make_traces)
