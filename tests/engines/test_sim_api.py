"""The simulated engine's OpenAI API through the official ``openai`` client, against ``orchestrator serve-sim``.

``serve-sim`` runs as users run it (a subprocess on a free port, stopped with Ctrl-C) and
serves the sim trial's own front end. What vLLM does, the simulator does:

* logprobs in all three forms: completions ``logprobs: N``, chat ``logprobs`` +
  ``top_logprobs``, and the prompt's (``echo`` with ``logprobs``; vLLM's ``prompt_logprobs``),
  streamed per chunk as well (values synthetic: the simulator has no model);
* a batched completions ``prompt`` (strings, or token-id lists): one choice per prompt;
* ``echo``: the prompt's text before the completion (the first prompt token's logprob null);
* vLLM 0.29's 400s for out-of-range sampling parameters. The expected bodies are the ones
  vLLM's own ``CompletionRequest`` / ``ChatCompletionRequest`` and ``SamplingParams`` give
  for the same bodies (vLLM 0.29.0, ``max_logprobs`` 20; ``-1`` asks for the vocabulary).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import openai
import pytest

from conftest import REPO
from support.serve_sim import base_url, client  # noqa: F401 (fixtures)
from support.serve_sim import start_serve_sim, stop

MODEL = "tiny-llama"
VOCAB = 4096  # tiny-llama's vocab_size: what "logprobs: -1" asks for
PROMPT = "t5 t6 t7 hello"


def post(base_url: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def descending(values) -> bool:
    return all(a >= b for a, b in zip(values, values[1:]))


# ---- 21: serve-sim

@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_serve_sim_serves_the_model_and_stops_cleanly_on_ctrl_c(sigint):
    """``ignored``: started as a shell starts a background job (SIGINT ignored, which a child keeps
    across exec): Ctrl-C (SIGINT) still stops it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler)
    try:
        proc, url = start_serve_sim("--model", MODEL, "--gpu", "H100-80GB", "--served-model-name", "my-model")
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["my-model"]
        out = client.completions.create(model="my-model", prompt="t1 t2", max_tokens=3)
        assert out.usage.completion_tokens == 3 and out.choices[0].text == " tok tok tok"
    finally:
        code, stderr = stop(proc)
    assert code == 0, stderr
    assert "stopped" in stderr and "Traceback" not in stderr


def test_serve_sim_for_a_study_file_serves_its_model_and_fixed_engine_args(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text(f"""
name: api
engine: {{kind: sim}}
model: {{name: {MODEL}, served_name: served-tiny}}
hardware: {{gpu: H100-80GB}}
space: {{max_num_seqs: 4, max_num_batched_tokens: [2048, 4096]}}
objectives: [maximize output_throughput]
""")
    proc, url = start_serve_sim(str(study), "--max-model-len", "512", cwd=tmp_path)
    try:
        models = openai.OpenAI(base_url=url, api_key="x", max_retries=0).models.list().model_dump()["data"]
        assert [(m["id"], m["max_model_len"]) for m in models] == [("served-tiny", 512)]
    finally:
        code, stderr = stop(proc)
    assert code == 0, stderr


@pytest.mark.parametrize("args, message", [
    ([], "give a study file, or both --model and --gpu"),
    (["--model", MODEL], "give a study file, or both --model and --gpu"),
    (["study.yaml", "--model", MODEL], "not both"),
    (["--model", MODEL, "--gpu", "H1000"], "unknown GPU 'H1000'"),
    (["--model", MODEL, "--gpu", "H100-80GB", "--max-num-seqs", "0"], "--max-num-seqs 0: expected an integer >= 1"),
])
def test_serve_sim_usage_errors_say_what_is_wrong(args, message):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "serve-sim", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_an_external_study_measures_serve_sim(base_url, tmp_path):
    from orchestrator.study.spec import parse_study
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial
    from support.studies import external_doc

    study = parse_study(external_doc(base_url.removesuffix("/v1"), output=str(tmp_path / "out")))
    row = run_trial(study, {"max_num_seqs": 8}, trial_id="t1", trial_number=0, ctx=TrialContext("r1")).row
    assert row["status"] == "completed", row.get("failure_message")
    assert row["completed"] == 20 and row["engine"] == "external"
    assert json.loads(row["extra_json"])["engine_facts"]["served_models"] == [MODEL]


def test_only_the_trial_that_claims_the_baseline_answers_the_probe_a_second_time(base_url, tmp_path):
    """The noise floor's second pass runs while no baseline is claimed; a later baseline-like trial
    skips it and reads the floor from the baseline's record."""
    from orchestrator.study.spec import parse_study
    from orchestrator.trial.run import TrialContext
    from support.recorded_trial import run_trial
    from support.studies import external_doc

    study = parse_study(external_doc(
        base_url.removesuffix("/v1"), name="floor", workload={"num_requests": 4, "warmup_requests": 0},
        probe={"max_input_tokens": 32, "output_tokens": 4, "concurrency": 8, "perplexity_sequences": 0},
        output=str(tmp_path / "out")))
    rows = [run_trial(study, {"max_num_seqs": 8}, trial_id=f"t{i}", trial_number=i, ctx=TrialContext("r1")).row
            for i in (1, 2)]
    assert [r["status"] for r in rows] == ["completed", "completed"], [r.get("failure_message") for r in rows]
    (probe_set,) = (tmp_path / "out" / "floor" / "probe").iterdir()
    first, second = (json.loads((probe_set / f"t{i}.json").read_text()) for i in (1, 2))
    assert first["floor"]["concurrency"] == 1 and "floor" not in second
    assert rows[1]["probe_baseline"] == "t1" and rows[1]["token_agreement"] is not None
    for name in ("floor_token_agreement", "floor_logprob_diff_mean"):
        assert rows[0][name] is not None and rows[1][name] == rows[0][name], name


# ---- 17: logprobs

def test_completions_logprobs(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp.tokens == [" tok"] * 5 and "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [0, 4, 8, 12, 16]
    assert all(v < 0 for v in lp.token_logprobs)
    for chosen, token, top in zip(lp.token_logprobs, lp.tokens, lp.top_logprobs):
        assert top[token] == chosen and len(top) == 3  # the chosen token is the likeliest of the top 3
        assert descending(list(top.values())) and sum(math.exp(v) for v in top.values()) <= 1
    again = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, logprobs=3)
    assert again.choices[0].logprobs == lp  # deterministic
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).choices[0].logprobs is None
    zero = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=0).choices[0].logprobs
    assert [list(top) for top in zero.top_logprobs] == [[" tok"], [" tok"]]


def test_chat_logprobs_and_top_logprobs(client):
    messages = [{"role": "user", "content": PROMPT}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, logprobs=True,
                                         top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert [c.token for c in content] == [" tok"] * 4
    for c in content:
        assert c.logprob < 0 and c.bytes == list(c.token.encode())
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token
        assert c.top_logprobs[0].logprob == c.logprob and descending([t.logprob for t in c.top_logprobs])
        assert all(t.bytes == list(t.token.encode()) for t in c.top_logprobs)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, logprobs=True)
    assert [c.top_logprobs for c in plain.choices[0].logprobs.content] == [[], []]
    assert client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).choices[0].logprobs is None


def test_streamed_logprobs_come_with_each_chunk(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=2).choices[0].logprobs
    tokens, values, offsets, text = [], [], [], ""
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=2, stream=True):
        choice = chunk.choices[0]
        if choice.text:
            assert "".join(choice.logprobs.tokens) == choice.text  # this chunk's tokens
            tokens += choice.logprobs.tokens
            values += choice.logprobs.token_logprobs
            offsets += choice.logprobs.text_offset
            text += choice.text
    assert (tokens, values, offsets) == (full.tokens, full.token_logprobs, full.text_offset)

    messages = [{"role": "user", "content": PROMPT}]
    chat_full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, logprobs=True,
                                               top_logprobs=1).choices[0].logprobs.content
    streamed = []
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, logprobs=True,
                                                top_logprobs=1, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            streamed += chunk.choices[0].logprobs.content
    assert streamed == chat_full


def test_prompt_logprobs(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 2})
    prompt_lp = out.model_dump()["choices"][0]["prompt_logprobs"]
    assert len(prompt_lp) == 4 and prompt_lp[0] is None
    for step, word in zip(prompt_lp[1:], [" t6", " t7", " hello"]):
        assert word in [c["decoded_token"] for c in step.values()]
        assert all(c["logprob"] < 0 and c["rank"] >= 1 for c in step.values())


# ---- 19: echo

def test_echo_returns_the_prompt_first(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True)
    assert out.choices[0].text == PROMPT + " tok tok" and out.choices[0].logprobs is None
    ids = client.completions.create(model=MODEL, prompt=[5, 6], max_tokens=1, echo=True)
    assert ids.choices[0].text == "t5 t6 tok"
    only = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True)
    assert only.choices[0].text == PROMPT  # vLLM: the prompt alone (and one token generated, not returned)
    assert only.usage.completion_tokens == 1


def test_echo_with_logprobs_gives_the_prompt_tokens_logprobs(client):
    lp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True, logprobs=1).choices[0].logprobs
    assert lp.tokens == ["t5", " t6", " t7", " hello", " tok", " tok"]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first prompt token: none, as vLLM
    assert all(v < 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset == [0, 2, 5, 8, 14, 18]
    for token, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert top[token] == value and 1 <= len(top) <= 2

    streamed = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True, logprobs=1,
                                              stream=True))
    # The first chunk echoes the prompt with the first token; a busy server sends what is ready by
    # then in one chunk (vLLM merges the steps a slow reader has not taken), so it may hold both.
    first = streamed[0].choices[0]
    assert first.text.startswith(PROMPT + " tok") and first.logprobs.tokens[:5] == lp.tokens[:5]
    assert first.logprobs.token_logprobs[0] is None
    chunks = [c for s in streamed for c in s.choices]
    assert "".join(c.text for c in chunks) == PROMPT + " tok tok"
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == lp.tokens


# ---- 18: batched prompts

@pytest.mark.parametrize("prompt, texts", [
    (["t5 t6", "hello", "t9 t9 t9"], ["t5 t6", "hello", "t9 t9 t9"]),
    ([[5, 6], [7], [8, 9, 10]], ["t5 t6", "t7", "t8 t9 t10"]),
])
def test_a_batched_prompt_gets_one_choice_per_prompt(client, prompt, texts):
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, echo=True, logprobs=1)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [t + " tok tok" for t in texts]
    assert [len(c.logprobs.tokens) for c in out.choices] == [len(t.split()) + 2 for t in texts]
    assert out.usage.prompt_tokens == sum(len(t.split()) for t in texts) and out.usage.completion_tokens == 6

    text = {0: "", 1: "", 2: ""}
    finished = set()
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, stream=True):
        for c in chunk.choices:
            text[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert text == {0: " tok tok tok", 1: " tok tok tok", 2: " tok tok tok"} and finished == {0, 1, 2}


# ---- 20: parameter errors, as vLLM 0.29 answers them

def vllm(message: str, param=None) -> dict:
    return {"message": message, "type": "BadRequestError", "param": param, "code": 400}


COMPLETION_ERRORS = [  # (fields, the error vLLM 0.29 answers)
    ({"temperature": -1}, vllm("temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
                               "temperature")),
    ({"temperature": 3}, vllm("temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)",
                              "temperature")),
    ({"top_p": 2}, vllm("top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)", "top_p")),
    ({"top_p": 0}, vllm("top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p")),
    ({"logprobs": -1}, vllm(f"Requested sample logprobs of {VOCAB}, which is greater than max allowed: 20 "
                            f"(parameter=logprobs, value={VOCAB})", "logprobs")),
    ({"logprobs": -2}, vllm("`logprobs` must be a positive value or -1. (parameter=logprobs, value=-2)", "logprobs")),
    ({"logprobs": 21}, vllm("Requested sample logprobs of 21, which is greater than max allowed: 20 "
                            "(parameter=logprobs, value=21)", "logprobs")),
    ({"logprobs": 21, "echo": True}, vllm("Requested sample logprobs of 21, which is greater than max allowed: 20 "
                                          "(parameter=logprobs, value=21)", "logprobs")),
    ({"logprobs": -5, "temperature": -1},
     vllm("`logprobs` must be a positive value or -1. (parameter=logprobs, value=-5)", "logprobs")),
    ({"extra_body": {"top_k": -2}}, vllm("top_k must be 0 (disable), or at least 1, got -2.")),
    ({"presence_penalty": 3}, vllm("presence_penalty must be in [-2, 2], got 3.0.")),
    ({"frequency_penalty": -2.5}, vllm("frequency_penalty must be in [-2, 2], got -2.5.")),
    ({"extra_body": {"repetition_penalty": 0}}, vllm("repetition_penalty must be greater than zero, got 0.0.")),
    ({"extra_body": {"min_p": 2}}, vllm("min_p must be in [0, 1], got 2.0.")),
    ({"extra_body": {"min_tokens": -1}}, vllm("min_tokens must be greater than or equal to 0, got -1.")),
    ({"max_tokens": 4, "extra_body": {"min_tokens": 20}},
     vllm("min_tokens must be less than or equal to max_tokens=4, got 20.")),
    ({"top_p": 2, "temperature": -1, "presence_penalty": 9}, vllm("presence_penalty must be in [-2, 2], got 9.0.")),
    ({"max_tokens": 0}, vllm("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens")),
    ({"stream_options": {"include_usage": True}},
     vllm("Stream options can only be defined when `stream=True`. (parameter=stream_options)", "stream_options")),
    ({"extra_body": {"prompt_logprobs": -3}},
     vllm("`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, value=-3)",
          "prompt_logprobs")),
    ({"extra_body": {"prompt_logprobs": 21}},
     vllm("Requested prompt logprobs of 21, which is greater than max allowed: 20 "
          "(parameter=prompt_logprobs, value=21)", "prompt_logprobs")),
    ({"stream": True, "extra_body": {"prompt_logprobs": 2}},
     vllm("`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)", "prompt_logprobs")),
]


@pytest.mark.parametrize("fields, expected", COMPLETION_ERRORS, ids=[json.dumps(c[0]) for c in COMPLETION_ERRORS])
def test_completion_parameter_errors_answer_like_vllm(client, fields, expected):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="t5", **fields)
    assert (e.value.status_code, e.value.body) == (400, expected)


CHAT_ERRORS = [
    ({"top_logprobs": 3}, vllm("when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
                               "top_logprobs")),
    ({"logprobs": True, "top_logprobs": -2},
     vllm("`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value=-2)", "top_logprobs")),
    ({"logprobs": True, "top_logprobs": 21}, vllm("Requested sample logprobs of 21, which is greater than max "
                                                  "allowed: 20 (parameter=logprobs, value=21)", "logprobs")),
    ({"logprobs": True, "top_logprobs": -1}, vllm(f"Requested sample logprobs of {VOCAB}, which is greater than max "
                                                  f"allowed: 20 (parameter=logprobs, value={VOCAB})", "logprobs")),
    ({"temperature": -1}, vllm("temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
                               "temperature")),
    ({"top_p": 2}, vllm("top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)", "top_p")),
]


@pytest.mark.parametrize("fields, expected", CHAT_ERRORS, ids=[json.dumps(c[0]) for c in CHAT_ERRORS])
def test_chat_parameter_errors_answer_like_vllm(client, fields, expected):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], **fields)
    assert (e.value.status_code, e.value.body) == (400, expected)


def test_the_error_body_is_vllms_whole(base_url):
    status, body = post(base_url, "/completions", {"model": MODEL, "prompt": "t5", "top_p": 2})
    assert (status, body) == (400, {"error": vllm("top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)",
                                                  "top_p")})


@pytest.mark.parametrize("fields, param", [({"temperature": "hot"}, "body.temperature"),
                                           ({"temperature": "hot", "top_p": "x"}, "body.temperature"),
                                           ({"echo": "maybe"}, "body.echo"),
                                           ({"prompt": [-1]}, "body.prompt.0")])
def test_wrong_types_are_request_validation_errors(base_url, fields, param):
    status, body = post(base_url, "/completions", {"model": MODEL, "prompt": "t5", **fields})
    assert status == 400 and body["error"]["type"] == "Bad Request" and body["error"]["param"] == param
    assert body["error"]["message"].startswith(f"{len(body['error']['message'].splitlines()) - 1} validation error")


def test_too_many_logprobs_in_a_stream_is_an_error_event(client):
    """vLLM's engine refuses it after the stream's 200: an error event, which the client raises."""
    with pytest.raises(openai.APIError, match="greater than max allowed: 20"):
        for _ in client.completions.create(model=MODEL, prompt="t5", logprobs=21, stream=True):
            pass
