"""Pre-flight check: can this configuration start at all on the study's hardware?

The decision is :func:`orchestrator.hardware.start.start_plan`, the very function the
simulated engine starts with (vLLM's own accounting: its argument refusals, weights
per GPU, profile-run activations, CUDA graphs, KV blocks for one ``max_model_len``
sequence), plus cluster-shape rules. On by default for vLLM and the simulator. A
configuration rejected here never costs a GPU start; it is recorded as ``pruned``
with the reason, and the sampler is told it violated the ``engine_started``
constraint, so it learns the infeasible region. Against a real engine a configuration
within :data:`PREFLIGHT_MARGIN` of the boundary is let try (:func:`margin`).

:func:`survey` runs the same check over the whole space before a study starts: a
study none of whose configurations can start ends there, with a report of why,
instead of spending its budget on an empty Pareto front.

Calibration: the GPU path is the simulator's memory model, matched against vLLM on
an H200 (``tests/sim/test_memory.py``). The CPU path (:func:`cpu_kv_tokens`) is
vLLM-CPU's rule (a fixed ``VLLM_CPU_KVCACHE_SPACE``); its hook for the measured
numbers is ``tests/search/test_feasibility_cpu_calibration.py`` (reference file
:data:`CPU_KV_REFERENCE`).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs, ceil_div
from orchestrator.hardware.gpus import get_gpu
from orchestrator.hardware.memory import kv_bytes_per_token, plan_memory
from orchestrator.hardware.quant_support import checkpoint_method, checkpoint_refusal
from orchestrator.hardware.start import start_plan, start_refusal
from orchestrator.models.shapes import find_model_config
from orchestrator.study.space import pick_value, value_count

# Real engines use a little memory the model cannot see (predicted KV caches are within 1%
# of vLLM's logged ones, docs/simulator.md); only reject configurations that would still
# not start with this share more of the requested memory, and let borderline ones try.
PREFLIGHT_MARGIN = 0.03
# Surveys check every configuration of spaces up to this size, a seeded sample of larger ones.
SURVEY_MAX_POINTS = 4096
NEVER_SHOWN = 12  # values named in the pre-flight line; the rest are counted
# vLLM-CPU KV cache sizes measured with real vLLM (written by the CPU calibration runs).
CPU_KV_REFERENCE = Path(__file__).resolve().parents[2] / "tests" / "data" / "cpu_kv_reference.json"
GiB = 1 << 30


@dataclass(frozen=True)
class FitVerdict:
    """Does a configuration fit before it starts (the pre-flight)? Not fitting says why, as the
    failure kind the engine would have given."""

    ok: bool
    kind: Optional[FailureKind] = None
    reason: str = ""
    kv_cache_tokens: Optional[int] = None


def preflight_on(study) -> bool:
    """Whether proposals and trials are checked before a start: ``search.preflight``, by default on
    for every engine the orchestrator starts (vLLM and the simulator: a configuration that cannot
    start takes no trial); an external endpoint is already running."""
    if study.search.preflight is not None:
        return bool(study.search.preflight)
    return study.engine.kind in ("sim", "vllm")


def survey_applies(study) -> bool:
    """Whether :func:`survey` may stop a study: engines we start, unless pre-flight is switched off."""
    return study.engine.kind in ("sim", "vllm") and study.search.preflight is not False


def resolve_args(study, args: EngineArgs) -> EngineArgs:
    """Fill vLLM's hardware-dependent defaults for the study's hardware (no engine needed)."""
    return study.with_device_defaults(args)


def margin(study) -> float:
    """How far past the memory boundary a configuration must be to be pruned: none for the
    simulator (its start is this very arithmetic, :func:`orchestrator.hardware.start.start_plan`),
    :data:`PREFLIGHT_MARGIN` of the requested memory for a real engine."""
    return 0.0 if study.engine.kind == "sim" else PREFLIGHT_MARGIN


def check(study, args: EngineArgs, *, cluster_units: Optional[int] = None,
          units_per_node: Optional[int] = None) -> FitVerdict:
    """Judge ``args`` (already resolved) against the study's model and GPU: vLLM's argument
    refusals, the cluster's shape, then the start-up memory plan the simulator starts with."""

    model = study.model_shape
    cpu = study.on_cpu
    refused = _checkpoint_refusal(study, args) or start_refusal(
        model, args, gpu=None if cpu else study.hardware.gpu, dtype=study.model.dtype)
    if refused is not None:
        return FitVerdict(False, refused.kind, refused.message)
    need = args.gpus
    if cluster_units is not None and need > cluster_units:
        return FitVerdict(False, FailureKind.PREFLIGHT,
                       f"needs {need} GPUs (TP {args.tensor_parallel_size} x PP {args.pipeline_parallel_size}) "
                       f"but the cluster has {cluster_units}")
    if units_per_node is not None and args.tensor_parallel_size > units_per_node:
        return FitVerdict(False, FailureKind.PREFLIGHT,
                       f"tensor_parallel_size {args.tensor_parallel_size} exceeds the {units_per_node} GPUs of a node")
    if cpu:
        return _check_cpu(study, model, args)
    gpu = get_gpu(study.hardware.gpu)
    try:
        plan = start_plan(model, gpu, args, study.model.dtype)
    except EngineStartError as e:
        if e.kind in _MEMORY_KINDS and _within_margin(model, gpu, args, study.model.dtype, margin(study)):
            return FitVerdict(True)
        return FitVerdict(False, e.kind, e.message)
    return FitVerdict(True, kv_cache_tokens=plan.kv_tokens)


# Refusals decided by the memory arithmetic, where the margin lets a borderline configuration try.
_MEMORY_KINDS = (FailureKind.NO_KV_MEMORY, FailureKind.KV_CACHE_TOO_SMALL)


def _checkpoint_refusal(study, args: EngineArgs) -> Optional[EngineStartError]:
    """vLLM's refusal of a quantization the checkpoint was not made with (the device's own
    refusals are :func:`~orchestrator.hardware.start.start_refusal`'s)."""

    if args.quantization is None or study.engine.kind == "sim":  # a simulated checkpoint has no format
        return None
    checkpoint = checkpoint_method(getattr(study.engine, "model_source", None),
                                   find_model_config(study.model.name, study.base_dir))
    text = checkpoint_refusal(args.quantization, checkpoint)
    return None if text is None else EngineStartError(FailureKind.INVALID_ARGS, text)


def _within_margin(model, gpu, args: EngineArgs, dtype: str, share: float) -> bool:
    """Would the configuration start with ``share`` more of the requested memory? (then let it try)"""

    if share <= 0:
        return False
    try:
        plan_memory(model, gpu, replace(args, gpu_memory_utilization=min(1.0, args.gpu_memory_utilization
                                                                         * (1 + share))), dtype)
        return True
    except EngineStartError:
        return False


# ------------------------------------------------------------------ CPU (vLLM-CPU)
def cpu_kv_tokens(model, args: EngineArgs, kv_space_gib: float, dtype: str = "auto") -> int:
    """Tokens of KV cache vLLM-CPU allocates in ``VLLM_CPU_KVCACHE_SPACE`` GiB.

    vLLM-CPU does not profile memory: the KV cache is exactly the configured space,
    cut into blocks of ``block_size`` tokens of the model's KV bytes per token (the
    compute dtype, float32 unless set; ``kv_cache_dtype`` overrides it).
    """

    dname = dtype if dtype not in (None, "auto") else args.dtype
    dbytes = 4 if dname in (None, "auto", "float32", "float") else 2
    per_token = kv_bytes_per_token(model, args, dbytes)
    bs = int(args.block_size or 128)
    return int(kv_space_gib * GiB) // (bs * per_token) * bs


def cpu_kv_space_gib(study, args: EngineArgs) -> Optional[float]:
    """The KV space vLLM-CPU gets: ``kv_cache_memory_bytes`` where set (it wins over the
    environment), else ``VLLM_CPU_KVCACHE_SPACE`` (``engine.cpu_kv_cache_gib``)."""
    fixed = args.extra.get("kv_cache_memory_bytes")
    return int(fixed) / GiB if fixed else getattr(study.engine, "cpu_kv_cache_gib", None)


def _check_cpu(study, model, args: EngineArgs) -> FitVerdict:
    space = cpu_kv_space_gib(study, args)
    if not space or not args.max_model_len:
        return FitVerdict(True)
    tokens = cpu_kv_tokens(model, args, space, study.model.dtype)
    need = ceil_div(int(args.max_model_len), int(args.block_size or 128)) * int(args.block_size or 128)
    if need > tokens * (1 + margin(study)):
        given = (f"kv_cache_memory_bytes={args.extra['kv_cache_memory_bytes']}"
                 if args.extra.get("kv_cache_memory_bytes") else f"VLLM_CPU_KVCACHE_SPACE={space:g} GiB")
        return FitVerdict(False, FailureKind.KV_CACHE_TOO_SMALL,
                       f"ValueError: To serve at least one request with the model's max seq len "
                       f"({args.max_model_len}), the KV cache needs {need:,} tokens but {given} holds "
                       f"{tokens:,}. Raise engine.cpu_kv_cache_gib (or kv_cache_memory_bytes) or lower "
                       f"max_model_len.")
    return FitVerdict(True, kv_cache_tokens=tokens)


# ------------------------------------------------------------------ the whole space
# What to change, per kind of failure (the report's last word).
_ADVICE = {
    FailureKind.WEIGHTS_OOM: "the weights do not fit on the GPUs of one replica: raise tensor_parallel_size "
                             "or pipeline_parallel_size, quantize, or pick a GPU with more memory",
    FailureKind.NO_KV_MEMORY: "nothing is left for the KV cache after weights and activations: raise "
                              "gpu_memory_utilization or tensor_parallel_size, lower max_num_batched_tokens",
    FailureKind.KV_CACHE_TOO_SMALL: "the KV cache cannot hold one max_model_len sequence: lower max_model_len, "
                                    "use kv_cache_dtype fp8, raise gpu_memory_utilization or tensor_parallel_size",
    FailureKind.INVALID_ARGS: "vLLM rejects these argument combinations (see the message)",
    FailureKind.PREFLIGHT: "the cluster is too small for these parallel sizes: lower tensor_parallel_size x "
                           "pipeline_parallel_size or add GPUs",
}


@dataclass(frozen=True)
class SpaceSurvey:
    """Pre-flight verdicts over a study's space (every point, or a seeded sample of a large one)."""

    checked: int
    space_size: int
    feasible: int
    failures: dict[str, int] = field(default_factory=dict)  # failure kind -> configurations
    # (parameter, value) -> the failure kind of every checked configuration with it: values
    # that can never start, whatever the other parameters (the sampler's proposals there are
    # turned away by the pre-flight, at no trial's cost)
    never: dict[tuple[str, Any], str] = field(default_factory=dict)
    examples: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)  # kind -> (params, reason)

    @property
    def sampled(self) -> bool:
        return self.checked < self.space_size

    @property
    def all_infeasible(self) -> bool:
        return self.checked > 0 and self.feasible == 0

    def droppable(self) -> dict[str, list[Any]]:
        """Values that never start, to take out of the space before sampling: only where every
        point of the space was checked (a sample cannot prove "never")."""
        if self.sampled or self.all_infeasible:
            return {}
        out: dict[str, list[Any]] = {}
        for (name, value) in self.never:
            out.setdefault(name, []).append(value)
        return out

    def report(self, *, trimmed: bool = False) -> str:
        """Why nothing (or how much) of the space can start, one block per failure kind
        (``trimmed``: the values that never start were taken out of the space)."""
        scope = (f"{self.checked:,} sampled of {self.space_size:,}" if self.sampled
                 else f"all {self.checked:,}")
        if not self.all_infeasible:
            text = f"pre-flight: {self.feasible:,} of {scope} configurations can start"
            if self.never:
                never = [f"{k}={v} ({kind})" for (k, v), kind in self.never.items()]
                more = f", ... and {len(never) - NEVER_SHOWN:,} more" if len(never) > NEVER_SHOWN else ""
                text += ("; never starts" + (" (taken out of the space before sampling)" if trimmed else "")
                         + ": " + ", ".join(never[:NEVER_SHOWN]) + more)
            return text
        lines = [f"no configuration of the search space can start ({scope} configurations checked "
                 "with the pre-flight memory model):"]
        for kind, n in sorted(self.failures.items(), key=lambda kv: -kv[1]):
            params, reason = self.examples[kind]
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            lines.append(f"  {n:,} x {kind}: {_ADVICE.get(FailureKind(kind), kind)}")
            lines.append(f"      e.g. {shown}: {reason[:400]}")
        return "\n".join(lines)


def space_points(space, seed: int, max_points: int = SURVEY_MAX_POINTS) -> tuple[list[dict[str, Any]], int]:
    """Every configuration of ``space`` (conditions applied), or a seeded sample; and the space's size.

    The size of a large space is the product of its parameters' value counts (an upper
    bound where conditions switch parameters off).
    """
    bound = space.grid_bound()
    if bound <= max_points:
        pts = space.grid()
        return pts, len(pts)
    rng = random.Random(seed)
    names = space.ordered_names()
    seen, out = set(), []
    for _ in itertools.repeat(None, max_points * 4):
        pt: dict[str, Any] = {}
        for name in names:
            p = space.params[name]
            if p.active(pt):
                pt[name] = pick_value(p, rng)
        key = tuple(sorted((k, repr(v)) for k, v in pt.items()))
        if key not in seen:
            seen.add(key)
            out.append(pt)
            if len(out) >= max_points:
                break
    return out, bound


def survey(study, *, cluster_units: Optional[int] = None, units_per_node: Optional[int] = None,
           max_points: int = SURVEY_MAX_POINTS) -> SpaceSurvey:
    """Run :func:`check` over the study's space (pure arithmetic: milliseconds per point)."""
    points, size = space_points(study.space, study.seed, max_points)
    feasible = 0
    failures: Counter = Counter()
    examples: dict[str, tuple[dict[str, Any], str]] = {}
    seen_ok: set[tuple[str, str]] = set()
    seen_bad: dict[tuple[str, str], tuple[Any, str]] = {}
    searched = {k for k, p in study.space.params.items() if value_count(p) > 1}
    for params in points:
        try:
            args = resolve_args(study, study.engine_args(params))
            verdict = check(study, args, cluster_units=cluster_units, units_per_node=units_per_node)
        except (ValueError, TypeError) as e:  # arguments the engine could not even build
            verdict = FitVerdict(False, FailureKind.INVALID_ARGS, str(e))
        keys = [(k, repr(v)) for k, v in params.items() if k in searched]
        if verdict.ok:
            feasible += 1
            seen_ok.update(keys)
            continue
        kind = (verdict.kind or FailureKind.PREFLIGHT).value
        failures[kind] += 1
        examples.setdefault(kind, (params, verdict.reason))
        for key, (name, value) in zip(keys, ((k, v) for k, v in params.items() if k in searched)):
            seen_bad.setdefault(key, (value, kind))
    never = {(k, value): kind for (k, r), (value, kind) in seen_bad.items() if (k, r) not in seen_ok} \
        if feasible else {}
    return SpaceSurvey(len(points), size, feasible, dict(failures), never=never, examples=examples)
