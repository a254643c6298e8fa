"""The single parameter -> vLLM argument mapping and vLLM's hardware-dependent defaults."""

from __future__ import annotations

import optuna
import pytest

from orchestrator.hardware.engine_args import EngineArgs, engine_args_from_params, validate_engine_arg
from orchestrator.study.space import SearchSpace


def test_server_defaults_follow_vllm_by_gpu_size():
    h200 = EngineArgs().resolved(device_memory_gib=140.4, device_name="H200", model_max_len=131072)
    assert (h200.max_num_batched_tokens, h200.max_num_seqs) == (8192, 1024)
    a100 = EngineArgs().resolved(device_memory_gib=80, device_name="A100-80GB", model_max_len=4096)
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    cpu = EngineArgs(tensor_parallel_size=2).resolved(device_memory_gib=24, platform="cpu", model_max_len=4096)
    assert (cpu.max_num_batched_tokens, cpu.max_num_seqs, cpu.block_size) == (4096, 256, 128)
    assert h200.enable_chunked_prefill and h200.enable_prefix_caching and h200.block_size == 16


def test_chunked_prefill_off_raises_token_budget_to_max_len():
    r = EngineArgs(enable_chunked_prefill=False, max_model_len=32768).resolved(device_memory_gib=80,
                                                                               device_name="H100")
    assert r.max_num_batched_tokens == 32768
    explicit = EngineArgs(enable_chunked_prefill=False, max_num_batched_tokens=4096,
                          max_model_len=32768).resolved(device_memory_gib=80, device_name="H100")
    assert explicit.max_num_batched_tokens == 4096


def test_params_to_kwargs_and_cli():
    args = engine_args_from_params({"max_num_seqs": 64.0, "enable_prefix_caching": False, "quantization": None,
                                    "kv_cache_dtype": "fp8"}, fixed={"load_format": "dummy"})
    kw = args.to_engine_kwargs()
    assert kw["max_num_seqs"] == 64 and isinstance(kw["max_num_seqs"], int)
    assert kw["enable_prefix_caching"] is False and kw["kv_cache_dtype"] == "fp8"
    assert kw["load_format"] == "dummy" and "quantization" not in kw
    argv = args.to_cli_args()
    assert "--no-enable-prefix-caching" in argv and argv[argv.index("--max-num-seqs") + 1] == "64"
    assert args.to_cli("m").startswith("vllm serve m ")


@pytest.mark.parametrize("name,value,ok", [
    ("tensor_parallel_size", 3, False), ("tensor_parallel_size", 4, True), ("block_size", 16, True),
    ("block_size", 17, False), ("gpu_memory_utilization", 0.0, False), ("enforce_eager", "yes", False),
    ("quantization", None, True), ("nonsense", 1, False),
])
def test_validate_engine_arg(name, value, ok):
    assert (validate_engine_arg(name, value) is None) is ok


def test_define_by_run_respects_conditions():
    space = SearchSpace.model_validate({
        "enable_chunked_prefill": [True, False],
        "long_prefill_token_threshold": {"type": "int", "low": 0, "high": 1024,
                                         "when": {"enable_chunked_prefill": True}},
        "max_num_seqs": {"type": "int", "low": 8, "high": 64, "log": True},
        "enforce_eager": False,
    })
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        t = study.ask()
        values = space.suggest(t)
        seen.add(values["enable_chunked_prefill"])
        assert ("long_prefill_token_threshold" in values) == values["enable_chunked_prefill"]
        assert values["enforce_eager"] is False and "enforce_eager" not in t.params
        assert 8 <= values["max_num_seqs"] <= 64
        study.tell(t, 0.0)
    assert seen == {True, False}


def test_grid_applies_conditions():
    space = SearchSpace.model_validate({
        "enable_chunked_prefill": [True, False],
        "long_prefill_token_threshold": {"type": "categorical", "choices": [0, 256],
                                         "when": {"enable_chunked_prefill": True}},
        "max_num_seqs": {"type": "int", "low": 8, "high": 32, "log": True},
    })
    grid = space.grid()
    # chunked on: 2 thresholds x 3 seqs (8, 16, 32); off: 3 seqs
    assert len(grid) == 9
    assert all(("long_prefill_token_threshold" in g) == g["enable_chunked_prefill"] for g in grid)
    assert space.column_types() == {"enable_chunked_prefill": "bool", "long_prefill_token_threshold": "int",
                                    "max_num_seqs": "int"}


def test_vllm_refusal_is_what_vllms_own_scheduler_config_refuses():
    """The pre-flight and the simulator refuse exactly the argument sets vLLM's SchedulerConfig
    refuses (and in its words): checked against the installed vLLM over a grid of budgets."""
    import itertools

    from vllm.config import SchedulerConfig

    from orchestrator.hardware.engine_args import EngineArgs, vllm_refusal

    for mnbt, seqs, max_len, chunked, threshold in itertools.product(
            (256, 2048, 8192), (16, 512), (1024, 4096), (True, False), (0, 2048)):
        args = EngineArgs(max_num_batched_tokens=mnbt, max_num_seqs=seqs, max_model_len=max_len,
                          enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold)
        try:
            SchedulerConfig(max_num_batched_tokens=mnbt, max_num_seqs=seqs, max_model_len=max_len,
                            enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                            is_encoder_decoder=False)
            theirs = None
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError wraps vLLM's ValueError
            theirs = str(e)
        ours = vllm_refusal(args)
        assert (ours is None) == (theirs is None), (args, ours, theirs)
        if ours is not None:
            assert ours.split(".")[0] in theirs


def test_preflight_and_simulator_refuse_a_budget_vllm_refuses(study_doc):
    from orchestrator.failures import EngineStartError, FailureKind
    from orchestrator.hardware.engine_args import EngineArgs
    from orchestrator.hardware.gpus import get_gpu
    from orchestrator.models.shapes import ModelShape
    from orchestrator.search.feasibility import check
    from orchestrator.sim.core import SimEngineCore
    from orchestrator.study.spec import parse_study

    study = parse_study(study_doc)
    gpu = get_gpu(study.hardware.gpu)
    args = EngineArgs(max_num_seqs=64, max_num_batched_tokens=2048, enable_chunked_prefill=False,
                      max_model_len=4096).resolved(device_memory_gib=gpu.memory_gib, device_name=gpu.name)
    verdict = check(study, args)
    assert not verdict.ok and verdict.kind == FailureKind.INVALID_ARGS and "smaller than max_model_len" in verdict.reason
    with pytest.raises(EngineStartError) as err:
        SimEngineCore(ModelShape.load(study.model.name), gpu, args)
    assert err.value.kind == FailureKind.INVALID_ARGS
