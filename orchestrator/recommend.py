"""A recommended deployment: one measured trial as a ``vllm serve`` command and a Ray Serve LLM config.

The trial is chosen by id, or as the best trial (first objective) that meets a set
of SLOs. Both outputs come from the trial's *resolved* engine arguments
(``engine_args_json``: vLLM's hardware-dependent defaults already filled in), written
through :class:`~orchestrator.engine_args.EngineArgs`, the one mapping to vLLM's
arguments, so the command pins exactly what was measured even where a later vLLM
changes a default.
"""

from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence

import pandas as pd

from orchestrator.accelerator import runs_on_cpu
from orchestrator.engine_args import EngineArgs
from orchestrator.results.analysis import best_under_slos
from orchestrator.results.pareto import ConstraintLike, normalize_constraints, normalize_objectives
from orchestrator.study import Constraint, Study

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
    metrics: dict[str, Optional[float]]  # the trial's objective and SLO metrics, as measured
    slos: tuple[Constraint, ...]

    def slo_lines(self) -> list[str]:
        """Each SLO with the trial's measured value and whether it was met."""
        out = []
        for c in self.slos:
            value = self.metrics.get(c.metric)
            out.append(f"{c}: not measured" if value is None else
                       f"{c}: {'met' if c.met(value) else 'MISSED'} ({value:,.4g})")
        return out

    def vllm_argv(self) -> list[str]:
        argv = ["vllm", "serve", self.model, *self.engine_args.to_cli_args()]
        if self.served_name != self.model:
            argv += ["--served-model-name", self.served_name]
        return argv

    def vllm_command(self) -> str:
        """The shell command line (with environment assignments first when the engine had any)."""
        env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(env + [shlex.join(self.vllm_argv())])

    def llm_config(self) -> dict[str, Any]:
        """A ``ray.serve.llm.LLMConfig`` as plain data (one replica, the measured engine arguments)."""
        cfg: dict[str, Any] = {
            "model_loading_config": {"model_id": self.served_name, "model_source": self.model},
            "engine_kwargs": self.engine_args.to_engine_kwargs(),
            "deployment_config": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
        }
        if self.engine_args.serving():  # measured behind ray.serve.llm with these serving-layer settings
            cfg["experimental_configs"] = self.engine_args.serving()
        if self.accelerator_type:
            cfg["accelerator_type"] = self.accelerator_type
        if self.env:
            cfg["runtime_env"] = {"env_vars": dict(self.env)}
        return cfg

    def serve_config(self, app_name: str = "llm", route_prefix: str = "/") -> dict[str, Any]:
        """A Ray Serve config file (``serve run FILE`` / ``serve deploy FILE``) serving the model."""
        return {"applications": [{"name": app_name, "route_prefix": route_prefix, "import_path": SERVE_APP_IMPORT,
                                  "args": {"llm_configs": [self.llm_config()]}}]}

    def serve_config_yaml(self) -> str:
        import yaml

        head = (f"# Ray Serve LLM config for trial {self.trial_id} (run {self.run_id}).\n"
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
        if row["status"] != "completed":
            raise RecommendError(f"trial {row['trial_id']} did not complete ({row['status']}: "
                                 f"{row.get('failure_kind')}); only measured trials can be recommended")
        return row
    constraints = normalize_constraints(study.constraints if slos is None else slos)
    objective_text = objective or f"{study.objectives[0].resolved_direction} {study.objectives[0].metric}"
    (metric, direction), = normalize_objectives([objective_text])
    ranked = best_under_slos(trials, metric, direction, constraints)
    if ranked.empty:
        raise RecommendError(_why_none(trials, constraints))
    return ranked.iloc[0]


def _why_none(trials: pd.DataFrame, constraints: Sequence[Constraint]) -> str:
    completed = trials[trials["status"] == "completed"]
    if completed.empty:
        return "no trial completed; nothing was measured"
    lines = ["no completed trial meets " + ", ".join(str(c) for c in constraints) + ":"]
    for c in constraints:
        values = pd.to_numeric(completed[c.metric], errors="coerce").dropna() if c.metric in completed else []
        if len(values):
            best = values.min() if c.op in ("<=", "<") else values.max()
            lines.append(f"  {c}: best seen {best:,.4g}")
        else:
            lines.append(f"  {c}: never measured")
    return "\n".join(lines)


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
    from orchestrator.sim.hardware import get_gpu

    row = select_trial(trials, study, trial_id=trial_id, slos=slos, objective=objective)
    args = engine_args_of(row)
    constraints = tuple(normalize_constraints(study.constraints if slos is None else slos))
    gpu = str(row.get("gpu") or study.hardware.gpu)
    accelerator = None if gpu.upper() == "CPU" else get_gpu(gpu).ray_accelerator_type
    shown = [o.metric for o in study.objectives] + [c.metric for c in constraints]
    metrics = {m: (None if pd.isna(row.get(m)) else float(row.get(m))) for m in dict.fromkeys(shown) if m in row}
    return Recommendation(
        trial_id=str(row["trial_id"]), run_id=str(row["run_id"]), engine_args=args,
        model=model or default_model(study), served_name=study.model.served_name or study.model.name,
        accelerator_type=accelerator, env=_engine_env(study, gpu),
        metrics=metrics, slos=constraints)
