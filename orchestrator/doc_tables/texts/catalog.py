"""Every generated text, by name, with the datasets it reads (relative to the repository root).

:mod:`orchestrator.doc_tables.registry` adds these to its tables; a text sits between
``<!-- text: NAME (DATASETS) -->`` and ``<!-- /text -->`` in README.md or docs/*.md.
"""

from __future__ import annotations

from orchestrator.doc_tables.blocks import DocBlock, text
from orchestrator.doc_tables.kv import KV_DATASETS
from orchestrator.doc_tables.texts import (decisions, h200_runs, h200_studies, planning, repeatability, setups,
                                           sim_capacity, sim_history, simulator, start_cache,
                                           trained)

_EX = "results/examples/"
INGRESS, REF, STUDY = _EX + "h200-ingress", _EX + "llama3-8b-h200-reference", _EX + "llama3-8b-h200"
FIDELITY, LEVELS = _EX + "llama3-8b-h200-fidelity", _EX + "llama3-8b-h200-fidelity-levels"
INTERACTIVE, KV_FP8 = _EX + "llama3-8b-h200-interactive", _EX + "llama3-8b-h200-kv-fp8"
MULTITURN = _EX + "multiturn-h200-fixed"
SIM, CPU, H200, H100 = (_EX + d for d in ("repeatability-sim", "repeatability-cpu-vllm", "repeatability-h200",
                                          "repeatability-h100"))
QUANT, SPEC = _EX + "trained-base-quant-h100", _EX + "trained-base-spec-h100"
DECISIONS, STARTS_H100, STARTS_CPU = _EX + "decisions-sim", _EX + "starts-h100", _EX + "starts-cpu-vllm"
START_CACHE_H100, FIDELITY_H100 = _EX + "start-cache-h100", _EX + "fidelity-h100"
STARTS_ONE_MACHINE = _EX + "starts-h100-one-machine"
SIM_ERROR = _EX + "sim-error"

TEXTS: tuple[DocBlock, ...] = (
    # README.md
    text("readme-engines", (INGRESS, REF), h200_runs.readme_engines),
    text("readme-scoring-rate", (FIDELITY, LEVELS), h200_studies.readme_scoring_rate),
    # docs/benchmarks.md
    text("decisions-sim-setup", (DECISIONS,), setups.decisions_setup),
    text("decisions-sim-findings", (DECISIONS,), decisions.decisions_findings),
    text("decisions-sim-coverage", (DECISIONS,), decisions.decisions_coverage),
    text("starts-setup", (STARTS_H100, STARTS_CPU), setups.starts_setup),
    text("starts-findings", (STARTS_H100, STARTS_CPU), decisions.starts_findings),
    text("starts-one-machine-setup", (STARTS_ONE_MACHINE,), setups.one_machine_setup),
    text("starts-one-machine-findings", (STARTS_ONE_MACHINE,), decisions.one_machine_findings),
    text("start-wall-h100-findings", (STARTS_ONE_MACHINE,), start_cache.start_wall_findings),
    text("start-cache-h100-findings", (START_CACHE_H100, FIDELITY_H100), start_cache.start_cache_findings),
    text("h200-ingress-targets", (INGRESS,), h200_runs.ingress_targets),
    text("h200-ingress-findings", (INGRESS,), h200_runs.ingress_findings),
    text("repeatability-setup", (SIM, H200, H100), setups.repeatability_setup),
    text("repeatability-fixed-rate-intro", (SIM, CPU, H100), setups.fixed_rate_intro),
    text("repeatability-findings", (SIM, CPU, H100), repeatability.repeatability_findings),
    text("repeatability-h200-findings", (H200, STUDY), repeatability.h200_repeatability),
    text("repeatability-h100-findings", (H100, STUDY), repeatability.h100_repeatability),
    text("window-noise-findings", (H200, H100, CPU, SIM), repeatability.window_noise_findings),
    text("h200-interactive-run", (INTERACTIVE,), h200_runs.interactive_run),
    text("h200-interactive-verdict", (INTERACTIVE,), h200_runs.interactive_verdict),
    text("h200-reference-checks", (REF,), h200_studies.reference_checks),
    text("h200-capacity-search", (STUDY,), h200_studies.capacity_search),
    text("h200-capacity-dataset", (STUDY,), h200_studies.capacity_dataset),
    text("h200-capacity-verdict", (STUDY, REF, H200), h200_studies.capacity_verdict),
    text("h200-capacity-findings", (STUDY,), h200_studies.capacity_findings),
    text("h200-fidelity-run", (FIDELITY,), h200_studies.fidelity_run),
    text("h200-fidelity-findings", (FIDELITY, STUDY), h200_studies.fidelity_findings),
    text("h200-fidelity-levels-run", (LEVELS,), h200_studies.fidelity_levels_run),
    text("h200-fidelity-levels-findings", (LEVELS, FIDELITY), h200_studies.fidelity_levels_findings),
    text("h200-kv-fp8-run", (KV_FP8,), h200_runs.kv_fp8_run),
    text("h200-kv-fp8-findings", (KV_FP8,), h200_runs.kv_fp8_findings),
    text("trained-runs", (QUANT, SPEC), trained.trained_runs),
    text("trained-quantization-findings", (QUANT,), trained.quantization_findings),
    text("trained-speculation-intro", (SPEC,), trained.speculation_intro),
    text("trained-speculation-findings", (SPEC, QUANT), trained.speculation_findings),
    text("trained-training-twice", (SPEC, QUANT), trained.training_twice),
    text("h200-multiturn-intro", (MULTITURN,), h200_runs.multiturn_intro),
    text("h200-multiturn-measured", (MULTITURN,), h200_runs.multiturn_measured),
    text("h200-multiturn-findings", (MULTITURN,), h200_runs.multiturn_findings),
    # docs/trained-models.md
    text("trained-models-gpu-training", (QUANT, SPEC), trained.models_gpu_training),
    text("trained-models-gpu-floor", (QUANT, SPEC), trained.models_gpu_floor),
    text("trained-models-gpu-guardrail", (QUANT,), trained.models_gpu_guardrail),
    text("trained-models-gpu-speculation", (SPEC,), trained.models_gpu_speculation),
    # docs/simulator.md
    text("sim-refit-steps", (INGRESS,), sim_history.refit_steps),
    text("sim-refit-tradeoff", (INGRESS,), sim_history.refit_tradeoff),
    text("kv-rows", KV_DATASETS, simulator.kv_rows),
    text("kv-error-band", KV_DATASETS, simulator.kv_error_band),
    text("sim-error-datasets", (SIM_ERROR,), simulator.sim_error_datasets),
    text("sim-error-left-out", (SIM_ERROR,), simulator.sim_error_left_out),
    text("sim-error-interactive", (SIM_ERROR,), simulator.interactive_ranking),
    text("fidelity-h100-findings", (FIDELITY_H100,), start_cache.fidelity_h100_findings),
    text("sim-vs-h200-capacity-setup", (REF, STUDY), sim_capacity.capacity_setup),
    text("sim-vs-h200-scored", (INGRESS, REF, STUDY), simulator.scored_points),
    text("sim-vs-h200-capacity-misses", (REF, STUDY, INGRESS), sim_capacity.capacity_misses),
    text("sim-vs-h200-capacity-help", (REF, STUDY), sim_capacity.capacity_help),
    # docs/planning.md
    text("planning-interval-sizing", (INTERACTIVE,), planning.interval_sizing),
    # docs/nightly.md
    text("nightly-capacity-spread", (H200, H100), repeatability.nightly_spread),
)
