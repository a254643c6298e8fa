"""Exchange measurements with ``vllm bench serve``: its result-JSON layout, both ways.

Export (:func:`to_bench_result`): a trial's request rows become the dictionary
``vllm bench serve --save-result --save-detailed`` writes (``duration``,
``completed``, ``request_throughput``, ``mean_ttft_ms`` / ``median_*`` / ``std_*`` /
``p50_*`` ... for ttft, tpot, itl and e2el, ``max_output_tokens_per_s``,
``max_concurrent_requests``, and the per-request lists ``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``start_times``, ``errors``), so that tools
written for vLLM's files (``vllm bench sweep``, plots, spreadsheets) read our trials.
Numbers come from :func:`orchestrator.measure.metrics.summarise` on the rebuilt records:
they are the trial row's numbers. vLLM-only aggregates (``std``, tokens per second
bucket, concurrent requests per second bucket) are computed as vLLM computes them.

Import (:func:`from_bench_result`): a vLLM result file becomes a trials row of an
existing (or new) results dataset, ``engine = external``, ``engine_mode =
vllm-bench-serve``, so ``pareto``/``show``/pandas compare it with our trials. With
the per-request lists (``--save-detailed``) the records are rebuilt and summarised
by our code (same definitions as vLLM's, plus our p90/p95 and failure kinds) and a
requests table is written; without them the summary fields are mapped one to one
(what vLLM did not write stays null). ``--metadata KEY=VALUE`` entries whose key is
a parameter of the study fill that parameter's column.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from orchestrator.failures import TrialStatus
from orchestrator.hardware.pricing import gpu_hour_price, unit_metrics
from orchestrator.measure.metrics import LATENCY_FAMILIES, LOAD_METRIC_NAMES, PERCENTILES, RequestSLO, summarise
from orchestrator.measure.records import RequestErrorKind, RequestRecord
from orchestrator.numbers import finite_float
from orchestrator.search.row import assemble_row

__all__ = ["records_from_request_rows", "to_bench_result", "records_from_bench", "from_bench_result",
           "bench_trial_id", "BENCH_ENGINE_MODE"]

BENCH_ENGINE_MODE = "vllm-bench-serve"
_BENCH_DATE = "%Y%m%d-%H%M%S"


# ---------------------------------------------------------------- records <-> request rows
def _opt(v: Any) -> Optional[float]:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return None
    return v


def records_from_request_rows(rows: pd.DataFrame) -> list[RequestRecord]:
    """Rebuild :class:`RequestRecord` objects from rows of the requests table.

    Token times are the first-token time plus the cumulated ITL gaps (the table stores
    the gaps as float32 milliseconds: times agree to well under a microsecond per gap).
    """
    out = []
    for r in rows.itertuples(index=False):
        first = _opt(r.first_token_s)
        itl = [] if r.itl_ms is None else list(r.itl_ms)
        times = [] if first is None else [first] + list(first + np.cumsum(np.asarray(itl, dtype=float)) / 1000.0)
        kind = _opt(r.error_kind)
        out.append(RequestRecord(
            index=int(r.request_index), scheduled_s=float(_opt(r.scheduled_s) or 0.0), sent_s=_opt(r.sent_s),
            first_token_s=first, end_s=_opt(r.end_s), token_times_s=times,
            prompt_tokens=None if _opt(r.prompt_tokens) is None else int(r.prompt_tokens),
            completion_tokens=None if _opt(r.completion_tokens) is None else int(r.completion_tokens),
            expected_prompt_tokens=int(r.expected_prompt_tokens), expected_output_tokens=int(r.expected_output_tokens),
            error=_opt(r.error), error_kind=RequestErrorKind(kind) if kind else None, warmup=bool(r.warmup),
            prefix_group=None if _opt(r.prefix_group) is None else int(r.prefix_group), level=int(r.level),
            window=int(_opt(getattr(r, "window", None)) or 0),
        ))
    return out


# ---------------------------------------------------------------- export
def _per_second_peaks(ok: Sequence[RequestRecord]) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests`` (1-second buckets)."""
    if not ok:
        return 0.0, 0
    t0 = min(r.sent_s for r in ok)
    t1 = max(r.end_s for r in ok)
    n = int(np.ceil(t1 - t0)) + 1
    tokens = np.zeros(n)
    conc = np.zeros(n)
    for r in ok:
        for t in r.token_times_s:
            b = int(t - t0)
            if 0 <= b < n:
                tokens[b] += 1
        conc[int(r.sent_s - t0):int(r.end_s - t0) + 1] += 1
    return float(tokens.max()), int(conc.max())


def _stats(values_s: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values_s or [0.0], dtype=float) * 1000.0  # vLLM reports 0 for an empty list
    out = {"mean": float(arr.mean()), "median": float(np.median(arr)), "std": float(arr.std())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out


def _json_field(value: Any) -> dict:
    """A ``*_json`` column's value as a dict (null, NaN from pandas, or missing: empty)."""
    return json.loads(value) if isinstance(value, str) and value else {}


def _arrival_fields(workload: Mapping[str, Any]) -> dict[str, Any]:
    arrival = workload.get("arrival") or {}
    kind = arrival.get("kind")
    rate: Any = arrival.get("rate")
    if kind in ("burst", "concurrency"):
        rate = "inf"
    burstiness = {"poisson": 1.0, "gamma": arrival.get("burstiness")}.get(kind)
    conc = arrival.get("concurrency") if kind == "concurrency" else workload.get("max_concurrency")
    return {"request_rate": rate, "burstiness": burstiness, "max_concurrency": conc}


def to_bench_result(trial: Mapping[str, Any], request_rows: pd.DataFrame, *, level: Optional[int] = None,
                    slo: RequestSLO = RequestSLO(), detailed: bool = True) -> dict[str, Any]:
    """One trial (a trials-table row as a mapping, plus its request rows) in vLLM's result layout.

    ``level``: for a capacity-search trial, which load level (default: the level the
    trial row describes). Warm-up requests are left out, as vLLM leaves out its own.
    """
    rows = request_rows[~request_rows["warmup"].astype(bool)]
    extra = _json_field(trial.get("extra_json"))
    if level is None:
        level = (extra.get("capacity") or {}).get("level_of_row")
    if level is not None:
        rows = rows[rows["level"] == level]
    records = sorted(records_from_request_rows(rows), key=lambda r: r.index)
    workload = _json_field(trial.get("workload_json"))
    traffic = _arrival_fields(workload)
    requested = traffic["request_rate"] if isinstance(traffic["request_rate"], (int, float)) else None
    m = summarise(records, gpus=int(trial.get("gpus") or 1), slo=slo, requested_rate=requested)
    ok = [r for r in records if r.success]
    max_tok_s, max_conc = _per_second_peaks(ok)
    started = trial.get("started_at")
    date = pd.Timestamp(started).strftime(_BENCH_DATE) if started is not None else ""
    model = trial.get("model") or ""
    out: dict[str, Any] = {
        "date": date,
        "endpoint_type": "openai-chat" if workload.get("api") == "chat" else "vllm",
        "backend": "openai-chat" if workload.get("api") == "chat" else "vllm",
        "label": f"orchestrator:{trial.get('study')}/{trial.get('trial_id')}",
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": len(records),
        # Our own keys (what `--metadata KEY=VALUE` would add): where the numbers come from.
        "study": trial.get("study"), "run_id": trial.get("run_id"), "trial_id": trial.get("trial_id"),
        "vllm_command": trial.get("vllm_command"), "level": level,
        **traffic,
        "duration": m.duration_s,
        "completed": m.completed,
        "failed": m.failed,
        "total_input_tokens": m.total_input_tokens,
        "total_output_tokens": m.total_output_tokens,
        "request_throughput": m.request_throughput,
        "request_goodput": m.goodput if not slo.empty else None,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "max_output_tokens_per_s": max_tok_s,
        "max_concurrent_requests": max_conc,
        "rtfx": 0.0,
    }
    series = {"ttft": [r.ttft_s for r in ok], "tpot": [r.tpot_s for r in ok if r.tpot_s is not None],
              "itl": [x for r in ok for x in r.itl_s], "e2el": [r.latency_s for r in ok]}
    for fam in LATENCY_FAMILIES:
        st = _stats(series[fam])
        out[f"mean_{fam}_ms"] = st["mean"]
        out[f"median_{fam}_ms"] = st["median"]
        out[f"std_{fam}_ms"] = st["std"]
        for p in PERCENTILES:
            out[f"p{p}_{fam}_ms"] = st[f"p{p}"]
    if detailed:
        t0 = min((r.sent_s for r in records if r.sent_s is not None), default=0.0)
        out["input_lens"] = [r.prompt_tokens if r.prompt_tokens is not None else r.expected_prompt_tokens
                             for r in records]
        out["output_lens"] = [r.output_tokens if r.success else 0 for r in records]
        out["ttfts"] = [r.ttft_s if r.success else 0.0 for r in records]
        out["itls"] = [r.itl_s if r.success else [] for r in records]
        out["start_times"] = [(r.sent_s - t0) if r.sent_s is not None else None for r in records]
        out["generated_texts"] = ["" for _ in records]
        out["errors"] = ["" if r.success else (r.error or "failed") for r in records]
    return out


# ---------------------------------------------------------------- import
def bench_trial_id(raw: bytes) -> str:
    """A stable trial id for a result file (re-importing it replaces, never duplicates)."""
    return "bench-" + hashlib.sha256(raw).hexdigest()[:16]


def _error_kind(text: str) -> RequestErrorKind:
    low = text.lower()
    if "timeout" in low or "timed out" in low:
        return RequestErrorKind.TIMEOUT
    if "http" in low or "status" in low or "bad request" in low:
        return RequestErrorKind.HTTP_STATUS
    return RequestErrorKind.CONNECTION


def records_from_bench(data: Mapping[str, Any]) -> Optional[list[RequestRecord]]:
    """Per-request records from a ``--save-detailed`` result (None when the lists are absent).

    Send times are ``start_times`` from the first one; each successful request's tokens
    arrive at send + ttft, then after each ``itls`` gap. vLLM does not record when a
    request was due, so ``scheduled_s`` is its send time (no lag is implied).
    """
    keys = ("start_times", "ttfts", "itls", "input_lens", "output_lens", "errors")
    if not all(isinstance(data.get(k), list) for k in keys):
        return None
    n = len(data["ttfts"])
    if any(len(data[k]) != n for k in keys):
        raise ValueError("per-request lists have different lengths: "
                         + ", ".join(f"{k} {len(data[k])}" for k in keys))
    starts = [s for s in data["start_times"] if s is not None]
    t0 = min(starts) if starts else 0.0
    out = []
    for i in range(n):
        sent = data["start_times"][i]
        sent = None if sent is None else float(sent) - t0
        err = data["errors"][i] or None
        rec = RequestRecord(index=i, scheduled_s=sent or 0.0, sent_s=sent,
                            prompt_tokens=int(data["input_lens"][i]), expected_prompt_tokens=int(data["input_lens"][i]))
        if err is None and sent is not None:
            t = sent + float(data["ttfts"][i])
            times = [t]
            for gap in data["itls"][i]:
                t += float(gap)
                times.append(t)
            rec.token_times_s, rec.first_token_s, rec.end_s, rec.finished_s = times, times[0], times[-1], times[-1]
            rec.completion_tokens = int(data["output_lens"][i])
            rec.expected_output_tokens = rec.completion_tokens
        else:
            rec.error = str(err or "no start time recorded")[:500]
            rec.error_kind = _error_kind(rec.error)
            rec.finished_s = sent
        out.append(rec)
    return out


def _summary_metrics(data: Mapping[str, Any]) -> dict[str, Optional[float]]:
    """Our metric names from vLLM's summary fields (no per-request lists)."""
    completed, failed = finite_float(data.get("completed")), finite_float(data.get("failed")) or 0.0
    dur = finite_float(data.get("duration"))
    total_in = finite_float(data.get("total_input_tokens"))
    m: dict[str, Optional[float]] = {
        "num_requests": completed + failed if completed is not None else None,
        "completed": completed, "failed": failed, "duration_s": dur,
        "request_throughput": finite_float(data.get("request_throughput")),
        "input_throughput": total_in / dur if total_in is not None and dur else None,
        "output_throughput": finite_float(data.get("output_throughput")),
        "total_token_throughput": finite_float(data.get("total_token_throughput")),
        "goodput": finite_float(data.get("request_goodput")),
        "total_input_tokens": total_in, "total_output_tokens": finite_float(data.get("total_output_tokens")),
        "requested_rate": finite_float(data.get("request_rate")),
    }
    for fam in LATENCY_FAMILIES:
        m[f"{fam}_mean_ms"] = finite_float(data.get(f"mean_{fam}_ms"))
        m[f"{fam}_p50_ms"] = finite_float(data.get(f"p50_{fam}_ms", data.get(f"median_{fam}_ms")))
        for p in PERCENTILES[1:]:
            m[f"{fam}_p{p}_ms"] = finite_float(data.get(f"p{p}_{fam}_ms"))
    return m


def from_bench_result(data: Mapping[str, Any], *, raw: bytes, source: str, study_name: str, fingerprint: str,
                      param_types: Mapping[str, str], gpus: Optional[int] = None, gpu: Optional[str] = None,
                      slo: RequestSLO = RequestSLO(), price_per_gpu_hour: Optional[float] = None,
                      ) -> tuple[dict[str, Any], Optional[list[RequestRecord]]]:
    """A trials row (and records, when the file has per-request lists) for one vLLM result file.

    ``price_per_gpu_hour``: for ``cost_per_mtok`` (default: the price table's, for ``gpu``)."""
    if not isinstance(data, Mapping) or "completed" not in data or "duration" not in data:
        raise ValueError("not a vllm bench serve result (no 'completed' / 'duration' fields)")
    try:
        started = datetime.strptime(str(data.get("date", "")), _BENCH_DATE).replace(tzinfo=timezone.utc)
    except ValueError:
        started = datetime.now(timezone.utc)
    records = records_from_bench(data)
    requested = finite_float(data.get("request_rate"))
    if records is not None:
        metrics = summarise(records, gpus=gpus or 1, slo=slo, requested_rate=requested).as_dict()
        metrics["sched_lag_p50_ms"] = metrics["sched_lag_p99_ms"] = metrics["sched_lag_max_ms"] = None
        metrics["loadgen_overloaded"] = None  # vLLM does not record intended send times
        if gpus is None:
            metrics["output_throughput_per_gpu"] = None
    else:
        metrics = _summary_metrics(data)
        if gpus and metrics.get("output_throughput") is not None:
            metrics["output_throughput_per_gpu"] = metrics["output_throughput"] / gpus
    params = {k: data[k] for k in param_types if k in data}
    scalars = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
    description: dict[str, Any] = {
        "study": study_name, "study_fingerprint": fingerprint, "run_id": "imported",
        "trial_id": bench_trial_id(raw), "trial_number": -1,
        "started_at": started, "finished_at": started, "engine": "external", "engine_mode": BENCH_ENGINE_MODE,
        "model": data.get("model_id"), "gpu": gpu, "gpus": gpus,
        "params_json": json.dumps(params, sort_keys=True, default=str),
        "workload_json": json.dumps({k: data.get(k) for k in ("num_prompts", "request_rate", "burstiness",
                                                               "max_concurrency", "backend")}, default=str),
    }
    for name, kind in param_types.items():
        if name in params:
            description[name] = _coerce_param(params[name], kind)
    measured = {**{k: v for k, v in metrics.items() if k in LOAD_METRIC_NAMES},
                **unit_metrics(metrics, gpus, gpu_hour_price(gpu or "", price_per_gpu_hour).value)}
    extra = json.dumps({"source": source, "label": data.get("label"), "bench": scalars}, default=str)
    row = assemble_row(description, TrialStatus.COMPLETED, measured, extra_json=extra)
    return row, records


def _coerce_param(value: Any, kind: str) -> Any:
    """``--metadata`` values are strings: turn them into the parameter column's type."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind == "bool":
        return text.lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(float(text))
    if kind == "float":
        return float(text)
    return text
