"""A recommended deployment: one measured trial as a ``vllm serve`` command and a Ray Serve LLM config.

The trial is chosen by id, or as the best trial (first objective) that meets a set
of SLOs. Both outputs come from the trial's *resolved* engine arguments
(``engine_args_json``: vLLM's hardware-dependent defaults already filled in), written
through :class:`~orchestrator.hardware.engine_args.EngineArgs`, the one mapping to vLLM's
arguments, so the command pins exactly what was measured even where a later vLLM
changes a default.
"""

from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Sequence

import pandas as pd
import yaml

from orchestrator.failures import TrialStatus
from orchestrator.hardware.accelerator import runs_on_cpu
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import GPUS, get_gpu
from orchestrator.hardware.pricing import unit_columns
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE
from orchestrator.redaction import EnvRef, holds_secret, is_secret_key, redact, shell_line
from orchestrator.results.analysis import best_under_slos
from orchestrator.results.decisions import PICK_RULE, pick
from orchestrator.results.outcomes import why_no_trial_qualifies
from orchestrator.results.pareto import ConstraintLike, normalize_constraints, normalize_objectives
from orchestrator.results.ties import combine_repeats
from orchestrator.study.spec import Constraint, Study

SERVE_APP_IMPORT = "ray.serve.llm:build_openai_app"


class RecommendError(ValueError):
    """No trial can be recommended (unknown id, nothing meets the SLOs, nothing measured)."""


@dataclass(frozen=True)
class Recommendation:
    """One trial turned into deployable configuration."""

    trial_id: str
    run_id: str
    engine_args: EngineArgs
    model: str  # what vLLM loads: a path or a Hugging Face id
    served_name: str  # the model id clients send
    accelerator_type: Optional[str]  # Ray's accelerator name (None: CPU)
    env: dict[str, str]
    metrics: dict[str, Optional[float]]  # the trial's objective, SLO, per-GPU and cost metrics, as measured
    slos: tuple[Constraint, ...]
    agreement: Optional[str] = None  # the probe's agreement with the baseline it was chosen under
    choice: Optional[str] = None  # how it was chosen among trials tied within the noise
    intervals: dict[str, tuple[Optional[float], Optional[float]]] = field(default_factory=dict)

    def measured_text(self) -> str:
        """``metric value [low, high], ...``: what was measured, with the interval where known."""
        def one(k: str, v: float) -> str:
            lo, hi = self.intervals.get(k, (None, None))
            band = "" if lo is None else f" [{lo:,.4g}, {'inf' if hi is None else f'{hi:,.4g}'}]"
            return f"{k} {v:,.4g}{band}"

        return ", ".join(one(k, v) for k, v in self.metrics.items() if v is not None)

    def slo_lines(self) -> list[str]:
        """Each SLO with the trial's measured value and whether it was met."""
        out = []
        for c in self.slos:
            value = self.metrics.get(c.metric)
            out.append(f"{c}: not measured" if value is None else
                       f"{c}: {'met' if c.met(value) else 'MISSED'} ({value:,.4g})")
        return out

    def vllm_argv(self) -> list[Any]:
        argv = ["vllm", "serve", self.model, *self.engine_args.cli_words()]
        if self.served_name != self.model:
            argv += ["--served-model-name", self.served_name]
        return argv

    def vllm_command(self) -> str:
        """The shell command line (with environment assignments first when the engine had any).

        A secret is never printed: its variable is expanded by the shell (``HF_TOKEN="${HF_TOKEN}"``), as is
        a value that holds one (``HTTPS_PROXY=http://user:pw@proxy``).
        """
        env = [f'{k}="${{{k}}}"' if is_secret_key(k) or holds_secret(v) else f"{k}={shlex.quote(v)}"
               for k, v in sorted(self.env.items())]
        return " ".join(env + [shell_line(self.vllm_argv())])

    def llm_config(self) -> dict[str, Any]:
        """A ``ray.serve.llm.LLMConfig`` as plain data (one replica, the measured engine arguments)."""
        cfg: dict[str, Any] = {
            "model_loading_config": {"model_id": self.served_name, "model_source": self.model},
            "engine_kwargs": {k: str(v) if isinstance(v, EnvRef) else v
                              for k, v in redact(self.engine_args.to_engine_kwargs()).items()},
            "deployment_config": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
        }
        if self.engine_args.serving():  # measured behind ray.serve.llm with these serving-layer settings
            cfg["experimental_configs"] = self.engine_args.serving()
        if self.accelerator_type:
            cfg["accelerator_type"] = self.accelerator_type
        if self.env:
            cfg["runtime_env"] = {"env_vars": redact(dict(self.env))}
        return cfg

    def serve_config(self, app_name: str = "llm", route_prefix: str = "/") -> dict[str, Any]:
        """A Ray Serve config file (``serve run FILE`` / ``serve deploy FILE``) serving the model."""
        return {"applications": [{"name": app_name, "route_prefix": route_prefix, "import_path": SERVE_APP_IMPORT,
                                  "args": {"llm_configs": [self.llm_config()]}}]}

    def serve_config_yaml(self) -> str:
        head = (f"# Ray Serve LLM config for trial {self.trial_id} (run {self.run_id}).\n"
                + (f"# {self.agreement}\n" if self.agreement else "")
                + (f"# {self.choice}\n" if self.choice else "") +
                "# Deploy: serve run THIS_FILE   (or: serve deploy THIS_FILE on a running cluster)\n")
        return head + yaml.safe_dump(self.serve_config(), sort_keys=False)


def _number(value: Any) -> Any:
    """Floats as their shortest decimal text (0.6000000000000001 -> 0.6): what a person would type."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    return value


def engine_args_of(row: pd.Series) -> EngineArgs:
    """The trial's resolved :class:`EngineArgs`, from its ``engine_args_json`` column."""
    raw = row.get("engine_args_json")
    if not isinstance(raw, str) or not raw:
        raise RecommendError(f"trial {row.get('trial_id')} has no recorded engine arguments "
                             f"(status {row.get('status')}); pick a completed trial")
    data = json.loads(raw)
    known = {f.name for f in fields(EngineArgs)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RecommendError(f"trial {row.get('trial_id')}: engine arguments {unknown} are unknown to this "
                             "version of the tuner; upgrade it to read these results")
    data = {k: _number(v) for k, v in data.items()}
    data["extra"] = {k: _number(v) for k, v in (data.get("extra") or {}).items()}
    return EngineArgs(**data)


def select_trial(trials: pd.DataFrame, study: Study, *, trial_id: Optional[str] = None,
                 slos: Optional[Sequence[ConstraintLike]] = None, objective: Optional[str] = None) -> pd.Series:
    """The trial to deploy.

    ``trial_id``: that trial (the full id; a unique suffix such as ``-0007`` also
    works). Otherwise the completed trial that meets ``slos`` (default: the study's
    constraints) with the best ``objective`` (default: the study's first objective).
    """
    if trials.empty:
        raise RecommendError("no trials recorded")
    if trial_id is not None:
        exact = trials[trials["trial_id"] == trial_id]
        if exact.empty:
            exact = trials[trials["trial_id"].str.endswith(trial_id)]
        if len(exact) > 1:
            raise RecommendError(f"{trial_id!r} matches {len(exact)} trials: {', '.join(exact['trial_id'][:5])}; "
                                 "give the full trial id")
        if exact.empty:
            close = difflib.get_close_matches(trial_id, list(trials["trial_id"]), n=3)
            raise RecommendError(f"no trial {trial_id!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        row = exact.iloc[0]
        if row["status"] != TrialStatus.COMPLETED:
            raise RecommendError(f"trial {row['trial_id']} did not complete ({row['status']}: "
                                 f"{row.get('failure_kind')}); only measured trials can be recommended")
        return row
    constraints = normalize_constraints(study.constraints if slos is None else slos)
    objective_text = objective or f"{study.objectives[0].resolved_direction} {study.objectives[0].metric}"
    (metric, direction), = normalize_objectives([objective_text])
    if metric not in trials.columns:
        close = difflib.get_close_matches(metric, [str(c) for c in trials.columns], n=3)
        raise ValueError(f"--objective: no metric {metric!r} in this study's trials"
                         + (f" (did you mean {', '.join(close)}?)" if close else ""))
    completed = trials[trials["status"] == TrialStatus.COMPLETED] if "status" in trials.columns else trials
    pooled = combine_repeats(completed, [metric, "ttft_p99_ms"])  # a configuration measured again: pooled
    confidence = study.capacity.confidence if study.capacity is not None else DEFAULT_CONFIDENCE
    ranked = best_under_slos(pooled, metric, direction, constraints, margin=study.analysis.equivalence_margin,
                             confidence=confidence)
    if ranked.empty:
        raise RecommendError(why_no_trial_qualifies(trials, constraints, [metric]))
    return choose(ranked, metric, study.analysis.equivalence_margin)


def choose(ranked: pd.DataFrame, metric: str, margin: float) -> pd.Series:
    """The trial to deploy from :func:`best_under_slos`' ranking: among the best and those equivalent to
    it (within ``margin``), the one :data:`PICK_RULE` picks; its ``choice`` says why, and names the
    trials not yet told apart from the best (their difference straddles the margin)."""
    best = ranked.iloc[0]
    equivalent = ranked[ranked["equivalent_to_best"]]
    undecided = ranked[ranked["tied_with_best"] & ~ranked["equivalent_to_best"]]
    chosen = pick(equivalent, distance_from_defaults).copy() if len(equivalent) > 1 else best.copy()
    notes = []
    if len(equivalent) > 1:
        others = len(equivalent) - 1
        notes.append(f"equivalent on {metric} within ±{margin:.0%} to {others} other{'s' if others != 1 else ''} "
                     f"(best measured: trial {best['trial_id']}, {best[metric]:,.4g}); chosen by {PICK_RULE}")
    if len(undecided):
        notes.append(f"not yet told apart from {len(undecided)} other{'s' if len(undecided) != 1 else ''} on {metric} "
                     f"({', '.join(undecided['trial_id'].astype(str)[:3])}): their paired difference straddles "
                     f"±{margin:.0%}; measure them again to decide")
    chosen["choice"] = "; ".join(notes) or None
    return chosen


def _row_gpu(row: pd.Series, fallback: str) -> str:
    """The row's GPU if it names one the catalog knows (or CPU), else ``fallback`` (a damaged row)."""
    gpu = row.get("gpu")
    return gpu if isinstance(gpu, str) and (gpu in GPUS or gpu.upper() == "CPU") else fallback


def distance_from_defaults(row: pd.Series) -> int:
    """How many engine arguments of a trial differ from what vLLM picks by itself on its hardware
    (the model length and dtype are the workload's, not a tuning choice)."""
    try:
        args = engine_args_of(row)
    except RecommendError:
        return 10 ** 6
    gpu = _row_gpu(row, "")
    if not gpu:
        return 10 ** 6
    cpu = gpu.upper() == "CPU"
    memory = 0.0 if cpu else get_gpu(gpu).memory_mib / 1024
    default = EngineArgs(max_model_len=args.max_model_len, dtype=args.dtype).resolved(
        device_memory_gib=memory, device_name=gpu, platform="cpu" if cpu else "cuda")
    names = [f.name for f in fields(EngineArgs) if f.name not in ("extra", "max_model_len", "dtype")]
    return sum(getattr(args, n) != getattr(default, n) for n in names)


def _engine_env(study: Study, gpu: str) -> dict[str, str]:
    env = dict(getattr(study.engine, "env", {}) or {})
    if study.engine.kind == "vllm" and runs_on_cpu(study.engine, gpu):
        # vLLM on CPU sizes its KV cache from this variable, not from gpu_memory_utilization.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(study.engine.cpu_kv_cache_gib))
    return env


def default_model(study: Study) -> str:
    """What ``vllm serve`` should load: the vLLM engine's model source, else the model's name."""
    return getattr(study.engine, "model_source", None) or study.model.name


def recommend(trials: pd.DataFrame, study: Study, *, trial_id: Optional[str] = None,
              slos: Optional[Sequence[ConstraintLike]] = None, objective: Optional[str] = None,
              model: Optional[str] = None) -> Recommendation:
    """Choose a trial (see :func:`select_trial`) and turn it into a :class:`Recommendation`.

    ``model``: the checkpoint to serve (path or Hugging Face id); default
    :func:`default_model`. Clients keep using the study's model name
    (``--served-model-name``).
    """
    row = select_trial(trials, study, trial_id=trial_id, slos=slos, objective=objective)
    args = engine_args_of(row)
    constraints = tuple(normalize_constraints(study.constraints if slos is None else slos))
    gpu = _row_gpu(row, study.hardware.gpu)
    accelerator = None if gpu.upper() == "CPU" else get_gpu(gpu).ray_accelerator_type
    ranked_by = [normalize_objectives([objective])[0][0]] if objective else []
    shown = ranked_by + [o.metric for o in study.objectives] + [c.metric for c in constraints] + unit_columns(row)
    metrics = {m: (None if pd.isna(row.get(m)) else float(row.get(m))) for m in dict.fromkeys(shown) if m in row}
    intervals = {}
    for m in metrics:
        lo, hi = row.get(f"{m}_low"), row.get(f"{m}_high")
        if lo is not None and not pd.isna(lo):
            intervals[m] = (float(lo), None if hi is None or pd.isna(hi) else float(hi))
    choice = row.get("choice")
    return Recommendation(
        trial_id=str(row["trial_id"]), run_id=str(row["run_id"]), engine_args=args,
        model=model or default_model(study), served_name=study.model.served_name or study.model.name,
        accelerator_type=accelerator, env=_engine_env(study, gpu),
        metrics=metrics, slos=constraints, agreement=agreement_line(row),
        choice=choice if isinstance(choice, str) else None, intervals=intervals)


def agreement_line(row: pd.Series) -> Optional[str]:
    """What the probe measured for a trial, in one line (None: no probe, or no baseline to compare with)."""
    value = row.get("token_agreement")
    if value is None or pd.isna(value):
        return None
    parts = [f"{m} {float(row[m]):.4g}" for m in ("token_agreement", "prefix_agreement", "logprob_diff_mean",
                                                  "logprob_diff_p95", "first_divergence_mean")
             if m in row and not pd.isna(row[m])]
    return (f"agreement with baseline trial {row.get('probe_baseline')} (reference: {row.get('probe_reference')}): "
            + ", ".join(parts))
