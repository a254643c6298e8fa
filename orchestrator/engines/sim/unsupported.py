"""Request parameters vLLM honours and the simulator cannot: refused in vLLM's error shape, never ignored.

A parameter the simulator would otherwise drop changes what a real server answers (a logit
bias, a JSON schema, beam search): a client tested against the simulator would pass and fail
against vLLM. Each is refused with a 400 naming it (:data:`NOT_SIMULATED`), unless absent or
at vLLM's default. Tool calling is answered as ``vllm serve`` without ``--tool-call-parser``
answers it: tools may be listed, asking for a call is refused with vLLM's own message.
"""

from __future__ import annotations

from typing import Any

from orchestrator.engines.sim.errors import BadRequest, validation_error

_FIXED_TOKEN = "the simulator generates one fixed token, so a constraint on the tokens cannot hold"
NOT_SIMULATED: dict[str, str] = {  # request field: why (docs/simulator.md lists them)
    "use_beam_search": "beam search is not simulated",
    "logit_bias": _FIXED_TOKEN,
    "allowed_token_ids": _FIXED_TOKEN,
    "bad_words": _FIXED_TOKEN,
    "logprob_token_ids": "logprobs are synthetic and cover the generated token and the top alternatives only",
    "response_format": "structured outputs are not simulated (only type \"text\" is)",
    "structured_outputs": "structured outputs are not simulated",
    "repetition_detection": "the simulated text repeats one token",
    "prompt_embeds": "the simulator reads prompts as text or token ids",
    "truncate_prompt_tokens": "prompt truncation is not simulated",
    "cache_salt": "the simulated prefix cache is not salted",
    "kv_transfer_params": "disaggregated serving is not simulated",
    "ec_transfer_params": "disaggregated serving is not simulated",
    "vllm_xargs": "custom extensions are not simulated",
    "stream_interval": "set the server's --stream-interval instead",
    "return_token_ids": "token ids are not returned by the simulator",
}


def check_simulated(body: dict) -> None:
    """Refuse a parameter the simulator cannot honour; its absence or vLLM's default is fine."""
    for name, why in NOT_SIMULATED.items():
        value = body.get(name)
        if value is None or value is False or value == [] or value == {}:
            continue
        if name == "response_format" and isinstance(value, dict) and value.get("type") == "text":
            continue
        raise BadRequest(f"`{name}` is not supported by the simulated engine: {why}.", param=name)


def _tool_choice(body: dict) -> Any:
    return body.get("tool_choice", "auto" if body.get("tools") else None)  # tools without a choice: "auto"


def check_tool_usage(body: dict) -> None:
    """vLLM's ``check_tool_usage`` (a raw-JSON validator), its first checks."""
    if body.get("tools") == []:
        raise validation_error("`tools` must not be an empty array. Either provide at least one tool or omit the "
                               "field entirely.", param="tools")
    choice = _tool_choice(body)
    if choice in (None, "none"):
        return
    if body.get("tools") is None:
        raise validation_error("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise validation_error(f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", \"auto\" or "
                               "\"required\" are supported.", param="tool_choice")


def check_tools(body: dict) -> None:
    """What ``vllm serve`` without ``--tool-call-parser`` answers (vLLM's ``OnlineRenderer``):
    tools are accepted, a request to call one is refused."""
    choice = _tool_choice(body)
    if choice in (None, "none"):
        return
    if choice == "auto":
        raise BadRequest('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    described = f'function "{name}"' if name is not None else f'"{choice}"'
    raise BadRequest(f"tool_choice={described} requires --tool-call-parser to be set")
