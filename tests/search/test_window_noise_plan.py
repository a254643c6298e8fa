"""Which between-window noise a trial's intervals get (search.trial_plan.window_noise): the study's own,
else the one measured for its engine."""

from __future__ import annotations

import pytest

from conftest import sim_study
from orchestrator.measure.engine_noise import CPU_WINDOW_NOISE, GPU_WINDOW_NOISE, NO_WINDOW_NOISE, WindowNoise
from orchestrator.search.trial_plan import load_plan, window_noise
from orchestrator.study.spec import parse_study
from support.studies import sim_doc


def study(engine: dict, hardware: dict, **capacity):
    """One study on ``engine`` and ``hardware`` (whole sections); ``capacity``: its capacity section."""
    doc = sim_doc(name="n", workload={"arrival": {"kind": "poisson", "rate": 4}, "num_requests": 20, "output_len": 32},
                  space={"max_num_seqs": [8, 64]}, objectives=["maximize capacity_rps"],
                  constraints=["ttft_p99_ms <= 2000"]) | {"engine": engine, "hardware": hardware}
    if capacity:
        doc["capacity"] = capacity
    return parse_study(doc)


@pytest.mark.parametrize("engine, hardware, expected", [
    ({"kind": "sim", "mode": "virtual"}, {"gpu": "H200"}, NO_WINDOW_NOISE),
    ({"kind": "sim"}, {"gpu": "H200"}, NO_WINDOW_NOISE),
    ({"kind": "vllm", "platform": "cuda"}, {"gpu": "H200"}, GPU_WINDOW_NOISE),
    ({"kind": "external", "base_url": "http://127.0.0.1:8100"}, {"gpu": "H200"}, GPU_WINDOW_NOISE),
    ({"kind": "vllm", "platform": "cpu"}, {"gpu": "CPU"}, CPU_WINDOW_NOISE),
])
def test_each_engine_gets_the_noise_measured_for_it(engine, hardware, expected):
    s = study(engine, hardware)
    assert window_noise(s) == expected and load_plan(s).window_noise == expected


def test_the_studys_own_window_noise_wins_and_an_empty_one_means_none():
    gpu = {"kind": "vllm", "platform": "cuda"}
    assert window_noise(study(gpu, {"gpu": "H200"}, window_noise={})) == NO_WINDOW_NOISE
    own = window_noise(study(gpu, {"gpu": "H200"}, window_noise={"ttft_p50_ms": 0.1, "tpot_p99_ms": 0.0}))
    assert own == WindowNoise.of({"ttft_p50_ms": 0.1}) and own.sd_of("ttft_p99_ms") == 0.0
    assert window_noise(sim_study(capacity={"window_noise": {"ttft_p99_ms": 0.3}})).sd_of("ttft_p99_ms") == 0.3
