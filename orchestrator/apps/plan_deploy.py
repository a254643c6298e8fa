"""A fleet plan as deployable files: the Ray Serve config with autoscaling, and a KubeRay ``RayService``.

The Serve config is :meth:`orchestrator.apps.recommend.Recommendation.serve_config` (the trial's
measured engine arguments as a ``ray.serve.llm`` ``LLMConfig``, what ``recommend`` writes) with
the plan's ``autoscaling_config`` in its ``deployment_config``: ``serve run FILE`` /
``serve deploy FILE`` read it. The ``RayService`` (``ray.io/v1``) carries the same config as its
``serveConfigV2`` and a cluster whose GPU worker group holds one replica per pod (TP x PP GPUs:
a replica's tensor-parallel workers share one node), ``minReplicas`` / ``maxReplicas`` pods as
the autoscaling's replicas, with Ray's autoscaler on so pods follow Serve's replicas.

Pure: data in, plain dicts and YAML text out.
"""

from __future__ import annotations

import copy
import re
from importlib.metadata import version
from typing import Any, Optional

import yaml

from orchestrator.apps.plan import FleetPlan
from orchestrator.apps.recommend import Recommendation

__all__ = ["fleet_serve_config", "fleet_serve_config_yaml", "rayservice_manifest", "rayservice_yaml",
           "resource_name", "DEFAULT_IMAGE_TEMPLATE"]

# The image clusters/Dockerfile builds on: Ray with vLLM, so ray.serve.llm runs the recommended engine.
DEFAULT_IMAGE_TEMPLATE = "rayproject/ray-llm:{ray}-py311-cu128"


def fleet_serve_config(rec: Recommendation, plan: FleetPlan) -> dict[str, Any]:
    """``recommend``'s Serve config of the plan's trial, autoscaled as the plan says."""
    config = copy.deepcopy(rec.serve_config())
    for app in config["applications"]:
        for llm in app["args"]["llm_configs"]:
            llm.setdefault("deployment_config", {})["autoscaling_config"] = plan.autoscaling.config()
    return config


def fleet_serve_config_yaml(rec: Recommendation, plan: FleetPlan) -> str:
    c = plan.candidate
    head = (f"# Ray Serve LLM config planned for {plan.rate:g} req/s (+{plan.headroom:.0%} headroom): "
            f"trial {c.trial_id} (run {rec.run_id}), {plan.replicas} replicas x {c.gpus_per_replica} GPU(s).\n"
            f"# Sized on {c.sized_on}: {c.sizing_rps:,.4g} req/s per replica.\n"
            f"# {plan.autoscaling.derivation}\n"
            "# Deploy: serve run THIS_FILE   (or: serve deploy THIS_FILE on a running cluster)\n")
    return head + yaml.safe_dump(fleet_serve_config(rec, plan), sort_keys=False)


def resource_name(text: str, suffix: str = "") -> str:
    """A Kubernetes object name (DNS-1123 label: lower case letters, digits, '-'; at most 63)."""
    base = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "vllm"
    tail = f"-{suffix}" if suffix else ""
    return (base[: 63 - len(tail)].rstrip("-") + tail)[:63]


def _ray_version() -> str:
    return version("ray")


def rayservice_manifest(rec: Recommendation, plan: FleetPlan, *, name: str, image: Optional[str] = None,
                        ray_version: Optional[str] = None, gpu_name: Optional[str] = None) -> dict[str, Any]:
    """A KubeRay ``RayService`` running the plan: Serve config and the cluster it needs."""
    ray = ray_version or _ray_version()
    image = image or DEFAULT_IMAGE_TEMPLATE.format(ray=ray)
    per_pod = plan.candidate.gpus_per_replica
    scaling = plan.autoscaling
    worker_container: dict[str, Any] = {
        "name": "ray-worker", "image": image,
        # vLLM needs the host's CPU and memory too: a starting point per GPU, to adjust to the nodes
        "resources": {"requests": {"cpu": str(8 * per_pod), "memory": f"{64 * per_pod}Gi",
                                   "nvidia.com/gpu": str(per_pod)},
                      "limits": {"cpu": str(8 * per_pod), "memory": f"{64 * per_pod}Gi",
                                 "nvidia.com/gpu": str(per_pod)}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    worker_pod: dict[str, Any] = {
        "containers": [worker_container],
        # vLLM's tensor-parallel workers and Ray's object store use shared memory
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{16 * per_pod}Gi"}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    group = resource_name(f"{gpu_name or 'gpu'}-x{per_pod}")
    cluster = {
        "rayVersion": ray,
        "enableInTreeAutoscaling": True,  # pods follow Serve's replicas, between min and max
        "headGroupSpec": {
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
            "template": {"spec": {"containers": [{
                "name": "ray-head", "image": image,
                "ports": [{"containerPort": 6379, "name": "gcs-server"},
                          {"containerPort": 8265, "name": "dashboard"},
                          {"containerPort": 10001, "name": "client"},
                          {"containerPort": 8000, "name": "serve"}],
                "resources": {"requests": {"cpu": "4", "memory": "16Gi"},
                              "limits": {"cpu": "4", "memory": "16Gi"}}}]}},
        },
        "workerGroupSpecs": [{
            "groupName": group,
            "replicas": max(scaling.min_replicas, 0),
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "rayStartParams": {},
            "template": {"spec": worker_pod},
        }],
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "vllm-serving-tuner",
                                              "app.kubernetes.io/component": "llm-serving"}},
        "spec": {
            "serveConfigV2": yaml.safe_dump(fleet_serve_config(rec, plan), sort_keys=False),
            "rayClusterConfig": cluster,
        },
    }


def _block_strings_dumper():
    """A YAML dumper that writes multi-line strings (the embedded Serve config) as ``|`` blocks."""
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return Dumper


def rayservice_yaml(rec: Recommendation, plan: FleetPlan, **kwargs: Any) -> str:
    c = plan.candidate
    head = (f"# KubeRay RayService planned for {plan.rate:g} req/s (+{plan.headroom:.0%} headroom): trial "
            f"{c.trial_id}, {plan.autoscaling.min_replicas}..{plan.replicas} replicas x {c.gpus_per_replica} GPU(s).\n"
            "# Worker CPU, memory, image and tolerations are starting points: adjust them to the nodes.\n"
            "# Apply: kubectl apply -f THIS_FILE\n")
    return head + yaml.dump(rayservice_manifest(rec, plan, **kwargs), Dumper=_block_strings_dumper(), sort_keys=False)
