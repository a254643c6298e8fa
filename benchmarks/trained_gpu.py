"""Learned weights on one GPU (docs/trained-models.md).

    python benchmarks/trained_gpu.py study STUDY_YAML MODEL_DIR GPU [--draft DRAFT_DIR] > OUT.yaml
    python benchmarks/trained_gpu.py train MODEL_DIR [--recipe base]

writes the study file with its model set to a trained model directory (``model.name`` and
``engine.model_source``), ``hardware.gpu`` to the GPU the machine has, and the value ``draft`` of
``speculative_model`` (in the space and the initial points) to a draft model's directory. ``train``
trains a recipe into a directory: the function ``orchestrator make-model tiny-llama DIR --weights
trained --recipe R`` calls, without the command line's imports, so that it runs on a machine that has
only torch and transformers (before the study's packages are installed). ``bash
benchmarks/trained_gpu.sh RESULTS`` runs the whole benchmark (train, then both studies).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml


def study_for_model(study_yaml: Path, model_dir: Path, gpu: str, draft: Path | None = None) -> dict:
    doc = yaml.safe_load(study_yaml.read_text())
    doc["model"]["name"] = str(model_dir.resolve())
    doc["engine"]["model_source"] = str(model_dir.resolve())
    doc["hardware"]["gpu"] = gpu
    if draft is not None:
        named = lambda v: str(draft.resolve()) if v == "draft" else v  # noqa: E731
        space = doc["space"]
        if "speculative_model" in space:
            value = space["speculative_model"]
            space["speculative_model"] = [named(v) for v in value] if isinstance(value, list) else named(value)
        for point in doc.get("search", {}).get("initial_points", []):
            if "speculative_model" in point:
                point["speculative_model"] = named(point["speculative_model"])
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("study", help="the study file with the trained model and this GPU")
    s.add_argument("study_yaml", type=Path)
    s.add_argument("model_dir", type=Path)
    s.add_argument("gpu")
    s.add_argument("--draft", type=Path, help="the draft model's directory (speculative_model: draft)")
    t = sub.add_parser("train", help="train a recipe (make-model --weights trained)")
    t.add_argument("model_dir", type=Path)
    t.add_argument("--recipe", default="tiny")
    args = p.parse_args(argv)
    if args.command == "train":
        from orchestrator.models.modelgen import make_model_dir

        make_model_dir("tiny-llama", args.model_dir, weights="trained", recipe=args.recipe)
        return 0
    yaml.safe_dump(study_for_model(args.study_yaml, args.model_dir, args.gpu, args.draft), sys.stdout,
                   sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
