"""The KubeRay CRD check (tests/support/kuberay_schema.py) accepts the project's RayCluster and rejects what the API server would."""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import REPO
from support.kuberay_schema import validate_manifest


def _raycluster() -> dict:
    return yaml.safe_load((REPO / "clusters" / "kuberay" / "raycluster.yaml").read_text())


def test_the_project_raycluster_is_valid():
    validate_manifest(_raycluster())


def test_an_undeclared_field_and_a_wrong_type_are_rejected():
    doc = _raycluster()
    typo = copy.deepcopy(doc)
    typo["spec"]["workerGroupSpecs"][0]["maxReplica"] = 4  # kubectl's strict validation: unknown field
    with pytest.raises(AssertionError, match=r"workerGroupSpecs\[0\]\.maxReplica"):
        validate_manifest(typo)
    wrong = copy.deepcopy(doc)
    wrong["spec"]["workerGroupSpecs"][0]["maxReplicas"] = "four"
    with pytest.raises(AssertionError, match="is not of type 'integer'"):
        validate_manifest(wrong)
    missing = copy.deepcopy(doc)
    del missing["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    with pytest.raises(AssertionError, match="'containers' is a required property"):
        validate_manifest(missing)
