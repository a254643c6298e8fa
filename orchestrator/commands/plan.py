"""``orchestrator plan``: the fleet that serves a target rate under the SLOs, from measured capacity per replica.

Reads a study's results (trials with ``capacity_rps``, the ``levels`` table for the latency at
capacity), makes a :func:`orchestrator.apps.plan.plan_fleet`, prints the cheapest deployment and the
next ones, and writes the Ray Serve config and the KubeRay ``RayService`` of the cheapest one.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional

import pandas as pd

from orchestrator.apps.plan import DEFAULT_HEADROOM, Candidate, PlanError, check_rate, plan_fleet
from orchestrator.apps.plan_deploy import fleet_serve_config_yaml, rayservice_yaml, resource_name
from orchestrator.apps.recommend import RecommendError, engine_args_of, recommend
from orchestrator.commands.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, err, positive_int, study_from_dataset
from orchestrator.failures import TrialStatus
from orchestrator.hardware.pricing import gpu_hour_price
from orchestrator.results import load_trials
from orchestrator.results.levels import load_levels
from orchestrator.results.ties import combine_repeats

NO_CAPACITY = ("{path}: no capacity search in this study (no capacity_rps in its trials); plan needs the "
               "capacity per replica: add a `capacity:` section to the study file and run it "
               "(docs/workloads.md, \"Capacity search\")")


def _rate(text: str) -> float:
    try:
        return check_rate(text)
    except PlanError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--rate ")) from None


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.2, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a fraction >= 0 such as 0.2, got {text!r}")
    return value


def _float(row, name: str) -> Optional[float]:
    value = row.get(name) if hasattr(row, "get") else None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def capacity_level(levels, capacity_rps: float):
    """The level a capacity row reports: the highest-rate level that met the SLOs at or below the
    estimate (None: no level recorded)."""
    if levels is None or levels.empty:
        return None
    met = levels[(levels["slo_met"] == True) & (levels["rate"] <= capacity_rps * (1 + 1e-9))]  # noqa: E712
    return None if met.empty else met.sort_values("rate").iloc[-1]


def candidate_of(row, levels):
    """A :class:`~orchestrator.apps.plan.Candidate` from a trials row and its levels."""
    args = engine_args_of(row)
    capacity = _float(row, "capacity_rps") or 0.0
    low = _float(row, "capacity_rps_low")
    level = capacity_level(levels, capacity)
    source = level if level is not None else row  # the row reports the capacity level's metrics too
    rate = _float(source, "achieved_rate") or _float(source, "rate")
    e2el = _float(source, "e2el_mean_ms")
    out_tps, req_tps = _float(row, "output_throughput"), _float(row, "request_throughput")
    params = row.get("params_json")
    return Candidate(
        trial_id=str(row["trial_id"]), gpus_per_replica=int(_float(row, "gpus") or args.gpus),
        tensor_parallel_size=args.tensor_parallel_size, capacity_rps=capacity,
        capacity_rps_low=low, capacity_rps_high=_float(row, "capacity_rps_high") if low is not None else None,
        confidence=_float(row, "confidence"),
        output_tokens_per_request=out_tps / req_tps if out_tps and req_tps else None,
        rate_at_capacity=rate, e2el_mean_s_at_capacity=e2el / 1000.0 if e2el else None,
        params=", ".join(f"{k}={v}" for k, v in json.loads(params).items()) if isinstance(params, str) else "")


def _table(plans, gpu: str):
    def band(c) -> str:
        if c.capacity_rps_low is None:
            return f"{c.capacity_rps:,.4g}"
        high = "inf" if c.capacity_rps_high is None else f"{c.capacity_rps_high:,.4g}"
        return f"{c.capacity_rps:,.4g} [{c.capacity_rps_low:,.4g}, {high}]"

    return pd.DataFrame([{
        "trial": p.candidate.trial_id, "TP": p.candidate.tensor_parallel_size,
        "GPUs/replica": p.candidate.gpus_per_replica, "capacity/replica [low, high]": band(p.candidate),
        "replicas": p.replicas, "GPUs": p.gpus,
        "$/hour": "-" if p.cost_per_hour is None else f"{p.cost_per_hour:,.2f}",
        "$/Mtok": "-" if p.cost_per_mtok is None else f"{p.cost_per_mtok:,.3f}",
        "load at target": f"{p.utilisation:.0%}", "noise": p.tie_note} for p in plans])


def cmd_plan(args) -> int:
    study = study_from_dataset(args.path)
    if study is None:
        return EXIT_USAGE
    trials = load_trials(args.path, run=args.run)
    if "capacity_rps" not in trials or trials["capacity_rps"].notna().sum() == 0:
        err("plan: " + NO_CAPACITY.format(path=args.path))
        return EXIT_FAILURE
    measured = trials[(trials["status"] == TrialStatus.COMPLETED) & trials["capacity_rps"].notna()]
    pooled = combine_repeats(measured, ["capacity_rps"])  # a configuration measured again: one candidate
    levels = load_levels(args.path, list(pooled["trial_id"]))
    candidates, unreadable = [], []
    for _, row in pooled.iterrows():
        try:
            candidates.append(candidate_of(row, levels[levels["trial_id"] == row["trial_id"]]))
        except RecommendError as e:
            unreadable.append(str(e))
    price = gpu_hour_price(study.hardware.gpu, args.price) if args.price is not None else study.price
    try:
        plans = plan_fleet(candidates, args.rate, headroom=args.headroom, price_per_gpu_hour=price.value,
                           min_replicas=args.min_replicas)
        chosen = plans.best
        if args.trial:
            chosen = next((p for p in plans.plans if p.candidate.trial_id.endswith(args.trial)), None)
            if chosen is None:
                raise PlanError(f"no planned configuration {args.trial!r} (one with a measured capacity)")
        rec = recommend(trials, study, trial_id=chosen.candidate.trial_id, model=args.model)
    except (PlanError, RecommendError) as e:
        err(f"plan: {e}")
        return EXIT_FAILURE
    serve_yaml = fleet_serve_config_yaml(rec, chosen)
    manifest = rayservice_yaml(rec, chosen, name=args.name or resource_name(study.name), image=args.image,
                               gpu_name=study.hardware.gpu)
    for target, text in ((args.serve_config, serve_yaml), (args.rayservice, manifest)):
        if target:
            Path(target).write_text(text)
    _print_plan(args, study, plans, chosen, rec, price, unreadable)
    return EXIT_OK


def _print_plan(args, study, plans, chosen, rec, price, unreadable) -> None:
    c, gpu = chosen.candidate, study.hardware.gpu
    slos = ", ".join(str(s) for s in study.capacity_slo()) or "no SLOs"
    print(f"Fleet for {plans.rate:g} req/s under {slos} (study {study.name}), +{plans.headroom:.0%} headroom: "
          f"sized for {plans.rate * (1 + plans.headroom):,.4g} req/s")
    print(f"{price.describe()}")
    which = "chosen" if args.trial else "cheapest"
    cost = "" if chosen.cost_per_hour is None else f", ${chosen.cost_per_hour:,.2f}/hour"
    mtok = "" if chosen.cost_per_mtok is None else f", ${chosen.cost_per_mtok:,.3f} per million output tokens"
    print(f"\n{which.capitalize()}: trial {c.trial_id}: {chosen.replicas} replicas x {c.gpus_per_replica} {gpu} "
          f"(TP {c.tensor_parallel_size}) = {chosen.gpus} {gpu}{cost}{mtok}")
    print(f"  sized on {c.sized_on}: {c.sizing_rps:,.4g} req/s per replica "
          f"(estimate {c.capacity_rps:,.4g}); at {plans.rate:g} req/s each replica carries "
          f"{plans.rate / chosen.replicas:,.4g} req/s, {chosen.utilisation:.0%} of it")
    if chosen.replicas_on_point < chosen.replicas:
        print(f"  on the point estimate it would be {chosen.replicas_on_point} replicas: under-provisioned "
              "by the measurement's noise")
    if chosen.tied_with:
        print(f"  {chosen.tie_note} on capacity per GPU: {', '.join(chosen.tied_with)}")
    a = chosen.autoscaling
    print(f"  autoscaling: min_replicas {a.min_replicas}, max_replicas {a.max_replicas}"
          + (f", target_ongoing_requests {a.target_ongoing_requests:g}" if a.target_ongoing_requests else ""))
    print(f"    {a.derivation}")
    if c.params:
        print(f"  configuration: {c.params}")
    print(f"  {rec.vllm_command()}")
    shown = plans.plans[: args.top]
    print(f"\nThe {len(shown)} cheapest of {len(plans.plans)} configurations with a measured capacity ({gpu}):")
    with pd.option_context("display.width", 250, "display.max_columns", 50, "display.max_colwidth", 80):
        print(_table(shown, gpu).to_string(index=False))
    for tid, why in plans.skipped:
        print(f"  not planned: {tid}: {why}")
    for why in unreadable:
        print(f"  not planned: {why}")
    written = [f"{what} {path}" for what, path in (("Ray Serve config", args.serve_config),
                                                    ("RayService", args.rayservice)) if path]
    if written:
        print("\nwrote " + "; ".join(written))
    else:
        print("\n(--serve-config FILE and --rayservice FILE write the Ray Serve config and the KubeRay RayService)")


def register(sub) -> None:
    p = sub.add_parser("plan", help="the fleet (replicas, GPUs, cost, autoscaling) that serves a target rate",
                       description="From a capacity study's measured capacity per replica: the cheapest deployment "
                                   "that serves --rate req/s under the SLOs, its cost, Ray Serve autoscaling, "
                                   "Serve config and KubeRay RayService (docs/planning.md).")
    p.add_argument("path", help="the study's result directory (<output>/<study>), from a study with a capacity search")
    p.add_argument("--rate", type=_rate, required=True, help="target load in requests per second (> 0)")
    p.add_argument("--headroom", type=_fraction, default=DEFAULT_HEADROOM,
                   help=f"spare capacity above --rate, as a fraction (default {DEFAULT_HEADROOM}: size for "
                        f"{1 + DEFAULT_HEADROOM:g} x the rate)")
    p.add_argument("--min-replicas", type=int, default=1, help="autoscaling floor (default 1)")
    p.add_argument("--price", type=float, help="dollars per GPU-hour (default: the study's, else a list price)")
    p.add_argument("--trial", help="plan this trial (id or unique suffix) instead of the cheapest")
    p.add_argument("--top", type=positive_int, default=3, help="configurations to compare (default 3)")
    p.add_argument("--run", help="only trials of this run id")
    p.add_argument("--model", help="checkpoint path or Hugging Face id to serve (default: the study's model source)")
    p.add_argument("--name", help="the RayService's name (default: from the study's name)")
    p.add_argument("--image", help="container image of the RayService (default: rayproject/ray-llm of this Ray)")
    p.add_argument("--serve-config", metavar="FILE", help="write the Ray Serve config (with autoscaling) here")
    p.add_argument("--rayservice", metavar="FILE", help="write the KubeRay RayService manifest here")
    p.set_defaults(func=cmd_plan)
