"""Validate a KubeRay manifest as the Kubernetes API server would: against the CRD's ``openAPIV3Schema``.

``tests/data/kuberay/<Kind>.schema.json.gz``: the ``ray.io/v1`` schemas of KubeRay v1.6.2's CRDs
(``ray-operator/config/crd/bases/ray.io_<kind>s.yaml``), descriptions removed. Two checks:

* JSON Schema validation (types, enums, required fields, patterns);
* unknown fields: ``kubectl apply`` validates strictly by default and rejects a field the schema
  does not declare (where the schema does not keep unknown fields,
  ``x-kubernetes-preserve-unknown-fields``), which JSON Schema alone lets through.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "kuberay"


@lru_cache(maxsize=None)
def crd_schema(kind: str) -> dict:
    with gzip.open(DATA / f"{kind}.schema.json.gz", "rt") as f:
        return json.load(f)["openAPIV3Schema"]


def unknown_fields(doc: Any, schema: dict, path: str = "") -> list[str]:
    """Paths in ``doc`` that ``schema`` does not declare."""
    out: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return out
    if isinstance(doc, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in doc.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None and extra is not True:
                out.append(f"{path}.{key}")
    elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(doc):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def validate_manifest(doc: dict) -> None:
    """Raise AssertionError (schema errors, unknown fields) unless ``doc`` is a valid object of its kind."""
    import jsonschema

    assert doc.get("apiVersion") == "ray.io/v1", doc.get("apiVersion")
    schema = crd_schema(doc["kind"])
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:10])
    unknown = unknown_fields(doc, schema)
    assert not unknown, f"fields the {doc['kind']} CRD does not declare: {unknown}"
