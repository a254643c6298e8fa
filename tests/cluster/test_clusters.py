"""clusters/: the manifests parse, carry their required fields, agree with pyproject.toml and point at real files."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import REPO
from orchestrator.cli import build_parser
from orchestrator.study.load import load_study

CLUSTERS = REPO / "clusters"
IMAGE_HOME = "/app/"  # where clusters/Dockerfile puts the repository
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _load(rel: str) -> dict:
    docs = list(yaml.safe_load_all((CLUSTERS / rel).read_text()))
    assert len(docs) == 1, rel
    return docs[0]


def _ray_requirement() -> Requirement:
    return next(r for r in map(Requirement, PYPROJECT["project"]["dependencies"]) if r.name == "ray")


def _pinned_ray() -> Version:
    """The exact Ray of the CPU extra (what CI and the images run)."""
    pins = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["cpu"]]
    spec = next(r for r in pins if r.name == "ray").specifier
    return Version(next(iter(spec)).version)


TUNER_IMAGE = f"registry.example.com/vllm-serving-tuner:{PYPROJECT['project']['version']}"


def _repo_file(path: str) -> Path:
    """A path inside the image (/app/...) or relative to the repository, as a repository file."""
    rel = path[len(IMAGE_HOME):] if path.startswith(IMAGE_HOME) else path
    return REPO / rel


def _check_orchestrator_command(argv: list[str]) -> None:
    """An `orchestrator ...` command line: our own parser accepts it and its study file exists and validates."""
    assert argv[0] == "orchestrator", argv
    args = build_parser().parse_args(argv[1:])
    study_file = _repo_file(args.study)
    assert study_file.is_file(), f"{argv}: {study_file} does not exist"
    load_study(study_file)


def test_ray_version_is_one_across_pyproject_image_and_manifests():
    ray = _pinned_ray()
    assert ray in _ray_requirement().specifier
    base = re.search(r"^FROM rayproject/ray-llm:(\d+\.\d+\.\d+)-py(\d)(\d+)-", (CLUSTERS / "Dockerfile").read_text(),
                     re.M)
    assert base, "clusters/Dockerfile must build on rayproject/ray-llm:<ray>-py<python>-..."
    assert Version(base.group(1)) == ray
    assert Version(f"{base.group(2)}.{base.group(3)}") in SpecifierSet(PYPROJECT["project"]["requires-python"])
    for rel in ("kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "kuberay/raycronjob.yaml"):
        text = (CLUSTERS / rel).read_text()
        assert {Version(v) for v in re.findall(r'rayVersion:\s*"?([\d.]+)', text)} == {ray}, rel


def test_every_image_is_the_tuner_image_of_this_version():
    for rel in ("kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "kuberay/raycronjob.yaml",
                "kubernetes/nightly-cronjob.yaml", "ray-up-gpu.yaml"):
        images = set(re.findall(r"^\s*image:\s*(\S+)", (CLUSTERS / rel).read_text(), re.M))
        assert images == {TUNER_IMAGE}, (rel, images)


def test_dockerfile_copies_what_exists_and_installs_the_package():
    text = (CLUSTERS / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        sources = [w for w in line.split() if not w.startswith("--")][:-1]
        for src in sources:
            assert (REPO / src).exists(), src
    assert re.search(r'pip install .*"\.\[vllm\]"', text)
    assert "vllm" in PYPROJECT["project"]["optional-dependencies"]


def _cluster_spec_checks(spec: dict) -> None:
    head = spec["headGroupSpec"]
    head_container = head["template"]["spec"]["containers"][0]
    assert head_container["name"] == "ray-head"
    assert {p["containerPort"] for p in head_container["ports"]} >= {6379, 8265}
    assert "rayStartParams" in head
    assert spec["workerGroupSpecs"], "no GPU workers"
    for group in spec["workerGroupSpecs"]:
        assert group["groupName"] and "rayStartParams" in group
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1


def test_raycluster():
    doc = _load("kuberay/raycluster.yaml")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster" and doc["metadata"]["name"]
    _cluster_spec_checks(doc["spec"])


def test_rayjob_runs_a_real_study_on_the_same_cluster_spec():
    doc = _load("kuberay/rayjob.yaml")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob" and doc["metadata"]["name"]
    spec = doc["spec"]
    _check_orchestrator_command(shlex.split(spec["entrypoint"]))
    assert shlex.split(spec["entrypoint"])[1] == "run"
    assert spec["shutdownAfterJobFinishes"] is True
    yaml.safe_load(spec["runtimeEnvYAML"])
    assert spec["rayClusterSpec"] == _load("kuberay/raycluster.yaml")["spec"]


def _valid_cron(expr: str) -> bool:
    fields = expr.split()
    return len(fields) == 5 and all(re.fullmatch(r"[\d*/,\-]+", f) for f in fields)


def test_raycronjob_runs_nightly():
    doc = _load("kuberay/raycronjob.yaml")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCronJob"
    spec = doc["spec"]
    assert _valid_cron(spec["schedule"])
    job = spec["jobTemplate"]  # a RayJob spec (KubeRay 1.6 alpha API)
    argv = shlex.split(job["entrypoint"])
    assert argv[1] == "nightly"
    _check_orchestrator_command(argv)
    assert job["shutdownAfterJobFinishes"] is True
    assert job["rayClusterSpec"] == _load("kuberay/raycluster.yaml")["spec"]
    assert "RayCronJob=true" in (CLUSTERS / "kuberay/raycronjob.yaml").read_text() or \
        "featureGates[0].name=RayCronJob" in (CLUSTERS / "kuberay/raycronjob.yaml").read_text()


def test_portable_cronjob_submits_nightly_to_the_raycluster():
    doc = _load("kubernetes/nightly-cronjob.yaml")
    assert doc["apiVersion"] == "batch/v1" and doc["kind"] == "CronJob"
    spec = doc["spec"]
    assert _valid_cron(spec["schedule"]) and spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    command = pod["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    argv = shlex.split(command[2])
    assert argv[:3] == ["ray", "job", "submit"]
    address = argv[argv.index("--address") + 1]
    cluster = _load("kuberay/raycluster.yaml")["metadata"]["name"]
    assert address == f"http://{cluster}-head-svc:8265"  # the Service KubeRay creates for the head
    json.loads(argv[argv.index("--runtime-env-json") + 1])
    entry = argv[argv.index("--") + 1:]
    assert entry[1] == "nightly"
    _check_orchestrator_command(entry)


def test_ray_up_launcher_matches_rays_schema():
    import jsonschema
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    doc = _load("ray-up-gpu.yaml")
    jsonschema.validate(doc, schema)
    assert doc["head_node_type"] in doc["available_node_types"]
    workers = [t for n, t in doc["available_node_types"].items() if n != doc["head_node_type"]]
    assert any(t.get("min_workers", 0) >= 1 for t in workers)
    for cmd in re.findall(r"orchestrator (?:run|nightly) \S+", (CLUSTERS / "ray-up-gpu.yaml").read_text()):
        _check_orchestrator_command(shlex.split(cmd))


def test_cluster_study_validates():
    study = load_study(CLUSTERS / "llama3-8b-h100.yaml")
    assert study.engine.kind == "vllm" and "://" in study.output


def test_local_recipe_is_valid_shell_and_documented():
    script = CLUSTERS / "local.sh"
    assert script.stat().st_mode & 0o111, "clusters/local.sh must be executable"
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    usage = subprocess.run([str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "start" in usage.stderr and "stop" in usage.stderr


@pytest.mark.parametrize("rel", ["docs/deploying.md", "docs/nightly.md"])
def test_docs_name_only_existing_cluster_files(rel):
    text = (REPO / rel).read_text()
    for path in set(re.findall(r"\bclusters/[\w./-]+\.(?:ya?ml|sh)\b|\bclusters/Dockerfile\b", text)):
        assert (REPO / path).exists(), f"{rel} names {path}, which does not exist"
