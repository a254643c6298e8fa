"""One answer to "is this a CPU study" and one set of device defaults, whoever asks."""

from __future__ import annotations

import pytest

from orchestrator.apps import recommend
from orchestrator.cluster import connect as cluster
from orchestrator.engines.vllm.serve import resolve_platform
from orchestrator.hardware.engine_args import EngineArgs
from orchestrator.hardware.gpus import get_gpu
from orchestrator.models.shapes import ModelShape
from orchestrator.search import feasibility
from orchestrator.search.trial_plan import engine_for
from orchestrator.sim.core import SimEngineCore
from orchestrator.study.spec import parse_study
from support.studies import sim_doc


def study(engine: dict, gpu: str):
    """One study on ``engine`` (its whole engine section) and ``gpu``."""
    return parse_study(sim_doc(name="acc", model={"name": "tiny-llama"}, hardware={"gpu": gpu}) | {"engine": engine})


@pytest.mark.parametrize("engine, gpu, cpu", [
    ({"kind": "vllm", "platform": "cpu"}, "H100-80GB", True),
    ({"kind": "vllm", "platform": "auto"}, "CPU", True),
    ({"kind": "vllm", "platform": "auto"}, "cpu", True),
    ({"kind": "vllm", "platform": "cuda"}, "CPU", True),  # the hardware says CPU: nothing to take a GPU from
    ({"kind": "vllm", "platform": "cuda"}, "H100-80GB", False),
    # The study decides, not the machine: a GPU study planned on this GPU-less machine is a GPU study.
    ({"kind": "vllm", "platform": "auto"}, "H100-80GB", False),
    ({"kind": "sim"}, "H100-80GB", False),
])
def test_every_caller_gives_the_same_answer(engine, gpu, cpu):
    s = study(engine, gpu)
    assert s.on_cpu is cpu
    if s.engine.kind == "vllm":
        assert (resolve_platform(s) == "cpu") is cpu
    assert (cluster.engine_resource(s.engine.kind, s.on_cpu) == "CPU") is (cpu and s.engine.kind == "vllm")
    assert ("VLLM_CPU_KVCACHE_SPACE" in recommend._engine_env(s, s.hardware.gpu)) is cpu  # noqa: SLF001


@pytest.mark.parametrize("engine, gpu", [({"kind": "vllm", "platform": "cpu"}, "CPU"),
                                         ({"kind": "vllm", "platform": "cuda"}, "H200"),
                                         ({"kind": "vllm", "platform": "auto"}, "H100-80GB"),
                                         ({"kind": "sim"}, "A100-80GB"), ({"kind": "sim", "mode": "virtual"}, "H200")])
def test_pre_flight_engine_and_simulator_resolve_alike(engine, gpu):
    s = study(engine, gpu)
    args = EngineArgs(tensor_parallel_size=1, dtype="float32")
    expected = s.with_device_defaults(args)
    assert expected.max_num_seqs is not None and expected.block_size == (128 if s.on_cpu else 16)
    assert feasibility.resolve_args(s, args) == expected
    assert engine_for(s).resolve(args) == expected
    if not s.on_cpu:  # the simulator core fills unresolved arguments the same way
        assert SimEngineCore(ModelShape.load("tiny-llama"), get_gpu(gpu), args).args == expected
