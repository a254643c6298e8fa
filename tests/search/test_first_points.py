"""The points a study tries first: the probe's baseline, then ``search.initial_points``, in order."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from orchestrator.search.first_points import enqueue_initial_points, enqueue_probe_baseline
from orchestrator.study.spec import parse_study
from support.studies import merged


def _first_trials(study, n):
    """What the searcher's Optuna study hands out first, as the driver enqueues it."""
    ostudy = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    searcher = SimpleNamespace(_ot_study=ostudy)  # where OptunaSearch keeps its study
    enqueue_probe_baseline(study, searcher, resumed=False)
    enqueue_initial_points(study, searcher, resumed=False)
    out = []
    for _ in range(n):
        trial = ostudy.ask()
        out.append(study.space.suggest(trial))
        ostudy.tell(trial, 1.0)
    return out


@pytest.fixture
def probe_study(study_doc):
    doc = merged(study_doc, engine={"kind": "vllm", "load_format": "dummy"}, probe={},
                 objectives=["maximize output_throughput"], constraints=[])
    return doc | {"space": {"quantization": [None, "fp8"], "kv_cache_dtype": ["auto", "fp8"], "max_num_seqs": [128, 32]}}


def test_an_initial_point_that_is_the_baseline_runs_first_as_written(probe_study):
    points = [{"quantization": None, "kv_cache_dtype": "auto", "max_num_seqs": 128},
              {"quantization": None, "kv_cache_dtype": "auto", "max_num_seqs": 32},
              {"quantization": "fp8", "kv_cache_dtype": "auto", "max_num_seqs": 128}]
    study = parse_study({**probe_study, "search": {"sampler": "random", "initial_points": points}})
    got = _first_trials(study, 3)
    assert [{k: g[k] for k in points[0]} for g in got] == points  # no extra baseline drawn before them


def test_without_a_baseline_among_the_initial_points_the_baseline_comes_first(probe_study):
    points = [{"quantization": "fp8", "kv_cache_dtype": "fp8", "max_num_seqs": 128}]
    study = parse_study({**probe_study, "search": {"sampler": "random", "initial_points": points}})
    first, second = _first_trials(study, 2)
    assert first["quantization"] is None and first["kv_cache_dtype"] == "auto"  # its other arguments drawn
    assert {k: second[k] for k in points[0]} == points[0]
