"""The served simulator answers bad requests as vLLM's OpenAI server does, on both of its doors.

The expected answers were recorded from vLLM 0.29.0 (the CPU build in this venv, ``python -m
vllm.entrypoints.openai.api_server`` on a generated tiny model): a field it validates in
``SamplingParams`` gives 400 with ``{"error": {message, type, param, code}}``; a value of the
wrong type gives pydantic's request validation (type ``Bad Request``, param ``body.<field>``);
an unknown model 404 ``NotFoundError``; an unknown route or a wrong method is FastAPI's own
JSON, ``{"detail": "Not Found"}`` (404) and ``{"detail": "Method Not Allowed"}`` (405, with
``Allow``). ``n > 1`` gives n choices on both doors, as vLLM does.

The simulator is deployed once as the sim engine deploys it in a trial (a Ray Serve
application with its direct aiohttp server), and every case goes over real HTTP to the
direct server and to the Serve (FastAPI) route.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Optional

import pytest

from conftest import shared_serve

pytestmark = pytest.mark.slow  # the served unit's Ray and Serve

MODEL = "sim-api"


@pytest.fixture(scope="module")
def doors(tmp_path_factory):
    from orchestrator.engines import EngineContext, serve_app
    from orchestrator.engines.sim.served import ServedSimEngine
    from orchestrator.hardware.engine_args import engine_args_from_params
    from orchestrator.study.spec import parse_study
    from support.studies import sim_doc

    context = EngineContext(serve_port=shared_serve())  # the served unit's Ray and Serve
    study = parse_study(sim_doc(name="api", engine={"mode": "served"},
                                model={"name": "tiny-llama", "served_name": MODEL},
                                output=str(tmp_path_factory.mktemp("out"))))
    engine = ServedSimEngine(study, context)
    with engine.deploy("sim-api", engine.resolve(engine_args_from_params({"max_num_seqs": 8}))) as dep:
        direct = dep.endpoint.facts["direct_url"]
        assert direct and dep.endpoint.base_url == direct
        yield {"direct": direct, "serve": context.serve_url("/" + serve_app.app_name_for("sim-api"))}


def call(base: str, path: str, method: str = "GET", body: Any = None, raw: Optional[bytes] = None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, headers, text = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, e.headers, e.read().decode()
    assert headers.get("Content-Type", "").startswith(("application/json", "text/event-stream")), (path, text)
    return status, headers, (json.loads(text) if headers["Content-Type"].startswith("application/json") else text)


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "t5 t6 t7", **fields}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "t5 t6"}], **fields}


def vllm_error(message: str, param: Optional[str], code: int = 400, kind: str = "BadRequestError") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


MAX_TOKENS_0 = vllm_error("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens")

CASES = [  # (path, body, status, vLLM 0.29.0's body)
    ("/v1/completions", completion(max_tokens=0), 400, MAX_TOKENS_0),
    ("/v1/completions", completion(max_tokens=0, stream=True), 400, MAX_TOKENS_0),
    ("/v1/chat/completions", chat(max_tokens=0), 400, MAX_TOKENS_0),
    ("/v1/chat/completions", chat(max_completion_tokens=0), 400, MAX_TOKENS_0),
    ("/v1/completions", completion(max_tokens=-1), 400,
     vllm_error("max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)", "max_tokens")),
    ("/v1/completions", completion(max_tokens=4, n=0), 400, vllm_error("n must be at least 1, got 0.", None)),
    ("/v1/completions", completion(model="other", max_tokens=4), 404,
     vllm_error("The model `other` does not exist.", "model", 404, "NotFoundError")),
]


@pytest.mark.parametrize("door", ["direct", "serve"])
@pytest.mark.parametrize("path, body, status, expected", CASES,
                         ids=["max_tokens0", "max_tokens0-stream", "chat-max_tokens0", "chat-max_completion0",
                              "max_tokens-1", "n0", "unknown-model"])
def test_bad_values_answer_like_vllm(doors, door, path, body, status, expected):
    got_status, _, got = call(doors[door], path, "POST", body)
    assert (got_status, got) == (status, expected)


@pytest.mark.parametrize("door", ["direct", "serve"])
@pytest.mark.parametrize("field, value", [("max_tokens", "x"), ("max_tokens", 2.5), ("n", "two")])
def test_wrong_types_are_request_validation_errors(doors, door, field, value):
    status, _, got = call(doors[door], "/v1/completions", "POST", completion(**{field: value}))
    assert status == 400
    assert set(got) == {"error"} and got["error"]["type"] == "Bad Request" and got["error"]["code"] == 400
    assert got["error"]["param"] == f"body.{field}" and repr(value) in got["error"]["message"]


@pytest.mark.parametrize("door", ["direct", "serve"])
def test_n_above_one_gives_n_choices(doors, door):
    status, _, got = call(doors[door], "/v1/completions", "POST", completion(max_tokens=4, n=3))
    assert status == 200 and [c["index"] for c in got["choices"]] == [0, 1, 2]
    assert got["usage"]["completion_tokens"] == 12
    status, _, got = call(doors[door], "/v1/chat/completions", "POST", chat(max_tokens=4, n=2, stream=True))
    events = [json.loads(line[len("data: "):]) for line in got.splitlines() if line.startswith("data: {")]
    finished = sorted(c["index"] for e in events for c in e["choices"] if c["finish_reason"])
    assert status == 200 and finished == [0, 1]


@pytest.mark.parametrize("door", ["direct", "serve"])
@pytest.mark.parametrize("method, path, status, expected, allow", [
    ("GET", "/nope", 404, {"detail": "Not Found"}, None),
    ("POST", "/v1/nope", 404, {"detail": "Not Found"}, None),
    ("GET", "/v1/completions", 405, {"detail": "Method Not Allowed"}, "POST"),
    ("DELETE", "/v1/models", 405, {"detail": "Method Not Allowed"}, "GET"),
    ("POST", "/health", 405, {"detail": "Method Not Allowed"}, "GET"),
])
def test_unknown_routes_and_methods_answer_json(doors, door, method, path, status, expected, allow):
    got_status, headers, got = call(doors[door], path, method, {} if method == "POST" else None)
    assert (got_status, got) == (status, expected)
    if allow:
        assert headers["Allow"] == allow


@pytest.mark.parametrize("door", ["direct", "serve"])
def test_version_is_the_vllm_it_answers_as(doors, door):
    assert call(doors[door], "/version")[::2] == (200, {"version": "0.29.0"})


@pytest.mark.parametrize("door", ["direct", "serve"])
def test_good_requests_still_work(doors, door):
    """n: 1 and an absent max_tokens (vLLM's completions default: 16) are fine."""
    status, _, got = call(doors[door], "/v1/completions", "POST", completion(max_tokens=3, n=1))
    assert status == 200 and got["usage"]["completion_tokens"] == 3 and len(got["choices"]) == 1
    status, _, got = call(doors[door], "/v1/completions", "POST", completion(max_tokens=None))
    assert status == 200 and got["usage"]["completion_tokens"] == 16
    status, _, got = call(doors[door], "/v1/chat/completions", "POST", chat(max_completion_tokens=2, stream=True,
                                                                            stream_options={"include_usage": True}))
    assert status == 200 and '"completion_tokens": 2' in got and got.rstrip().endswith("data: [DONE]")


def _running(base: str) -> float:
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def test_a_client_that_goes_away_ends_its_request(doors):
    """As vLLM aborts a request whose client disconnected, the simulator stops generating it (and
    frees its slot) as soon as the stream cannot be written, not when the request would have ended."""
    import http.client
    import time
    from urllib.parse import urlparse

    base, tokens, read = doors["direct"], 4000, 40
    url = urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(completion(max_tokens=tokens, ignore_eos=True, stream=True)),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    t0, chunks = time.monotonic(), 0
    while chunks < read:  # the request's own pace: what the rest of it would take
        chunks += resp.fp.readline().startswith(b"data: {")
    left_s = (time.monotonic() - t0) / read * (tokens - read)
    assert left_s > 1.0, f"the request would end in {left_s:.2f} s: too soon to tell an abort from its end"
    assert _running(base) == 1
    conn.sock.shutdown(2)
    conn.close()
    gone = time.monotonic()
    while _running(base) and time.monotonic() - gone < left_s:
        time.sleep(0.05)
    assert _running(base) == 0 and time.monotonic() - gone < left_s / 3, (time.monotonic() - gone, left_s)
    status, _, got = call(base, "/v1/completions", "POST", completion(max_tokens=2))
    assert status == 200 and got["usage"]["completion_tokens"] == 2  # the server goes on answering
