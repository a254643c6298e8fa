"""What one choice of a simulated answer says, in vLLM 0.29's shapes: its text, logprobs and end,
streamed chunk by chunk or whole.

A choice is one engine request (:class:`Sub`): one per prompt and per ``n``. Its text is the
simulator's generated token repeated, cut where the request stops
(:mod:`orchestrator.engines.sim.stops`); a stream holds back what may begin a stop string.

A streamed chunk's choice carries the keys vLLM's pydantic models dump for it
(``model_dump_json(exclude_unset=True)``): completions ``index, text, logprobs,
finish_reason, stop_reason, prompt_token_ids, token_ids``; chat's role chunk ``index,
delta{role, content}, logprobs, finish_reason``, its content chunks ``..., token_ids`` and its
last chunk ``..., stop_reason, token_ids``. ``continuous_usage_stats`` adds this choice's usage
to every chunk (its prompt's tokens, its own generated tokens so far).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from orchestrator.engines.sim.logprobs import (GENERATED_TEXT, LogprobSource, as_token_ids, chat_logprobs,
                                               completion_logprobs, prompt_tokens)
from orchestrator.engines.sim.loop import Mailbox
from orchestrator.engines.sim.requests import ApiRequest, Prompt
from orchestrator.engines.sim.stops import repeated_text


class Sub:
    """One engine request of an API request: one per prompt (a batched completions prompt has
    several) and choice (``n``), as vLLM runs each of ``n`` sequences as a request of its own."""

    __slots__ = ("index", "first", "prompt", "rid", "box", "sent", "chars", "echoed", "text_len", "logprobs")

    def __init__(self, index: int, first: bool, prompt: Prompt, rid: str, box: Mailbox,
                 logprobs: Optional[LogprobSource]):
        self.index = index  # the choice's index (completions: prompt * n + sample)
        self.first = first  # its prompt's first choice: usage counts a prompt once
        self.prompt, self.rid, self.box, self.logprobs = prompt, rid, box, logprobs
        self.sent = 0  # generated tokens already answered
        self.chars = 0  # characters of generated text already answered
        self.echoed = False
        self.text_len = 0  # characters already streamed, echo included (completions' text_offset)


def piece(req: ApiRequest, sub: Sub, n: int, done: bool) -> tuple[str, list, list]:
    """The text of ``sub``'s next ``n`` generated tokens (the prompt first, once, under ``echo``),
    with their logprob steps and token texts (empty when logprobs are not asked for). The
    text ends where the request stopped; until then a stream holds back what may begin a stop string."""
    steps: list = []
    texts: list[str] = []
    ids: list[int] = []
    text = ""
    if req.echo and not sub.echoed:
        sub.echoed = True
        text = sub.prompt.text
        if req.logprobs is not None:
            texts = prompt_tokens(sub.prompt.text)
            top = req.logprobs if req.prompt_logprobs is None else req.prompt_logprobs
            steps = sub.logprobs.prompt(sub.prompt.ids, texts, top)
            ids = list(sub.prompt.ids)
    if req.echo_only:  # the one token vLLM generates is not returned
        sub.sent += n
        return (text, *as_token_ids(steps, ids)) if req.tokens_as_ids else (text, steps, texts)
    sent = sub.sent + n
    if done:
        end = req.ending.text_len if sent == req.ending.tokens else sent * len(GENERATED_TEXT)
    else:
        end = max(sub.chars, sent * len(GENERATED_TEXT) - req.stop.holds_back)
    text += repeated_text(GENERATED_TEXT, sub.chars, end)
    sub.chars = max(sub.chars, end)
    if req.logprobs is not None:  # every token has its logprobs, a stop token's too (as in vLLM)
        steps += [sub.logprobs.generated(sub.sent + k, req.logprobs) for k in range(n)]
        texts += [GENERATED_TEXT] * n
        ids += [step[0].token_id for step in steps[len(ids):]]
    sub.sent = sent
    return (text, *as_token_ids(steps, ids)) if req.tokens_as_ids else (text, steps, texts)


def finish(req: ApiRequest, sub: Sub) -> tuple[str, Any]:
    """``(finish_reason, stop_reason)`` of an ended sequence."""
    end = req.ending
    return (end.finish_reason, end.stop_reason) if sub.sent == end.tokens else ("length", None)


def choice_logprobs(req: ApiRequest, steps: list, texts: list, text_len: int) -> Optional[dict]:
    if req.logprobs is None:
        return None
    if req.chat:
        return chat_logprobs(steps, texts, req.logprobs)
    return completion_logprobs(steps, texts, req.logprobs, offset=text_len)


def usage(subs: list[Sub], cached: bool = False) -> dict:
    """vLLM's usage of an answer: each prompt's tokens once, every choice's generated tokens."""
    prompt = sum(s.box.prompt_tokens for s in subs if s.first)
    generated = sum(s.box.generated for s in subs)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": sum(s.box.cached_tokens for s in subs if s.first)}
    return out


# ---- streamed chunks: a choice (the chunk's prefix, up to ``"choices":[``, is the caller's), then its end

def role_chunk(index: int) -> str:
    """Chat's first chunk of a choice; vLLM's also sets the chunk's ``prompt_token_ids`` and ``prompt_text``."""
    return (f'{{"index":{index},"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}],'
            '"prompt_token_ids":null,"prompt_text":null')


def echo_chunk(index: int, text: str) -> str:
    """Chat ``echo``: the last message's text, before any generated token."""
    return f'{{"index":{index},"delta":{{"content":{json.dumps(text)}}},"logprobs":null,"finish_reason":null}}]'


def chat_chunk(index: int, text: str, logprobs: Optional[dict], end: Optional[tuple[str, Any]] = None) -> str:
    choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "logprobs": logprobs,
                              "finish_reason": None if end is None else end[0]}
    if end is not None:
        choice["stop_reason"] = end[1]
    choice["token_ids"] = None
    return json.dumps(choice, separators=(",", ":")) + "]"


def completion_chunk(index: int, text: str, logprobs: Optional[dict], end: Optional[tuple[str, Any]]) -> str:
    finish_reason, stop_reason = (None, None) if end is None else end
    return json.dumps({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
                       "stop_reason": stop_reason, "prompt_token_ids": None, "token_ids": None},
                      separators=(",", ":")) + "]"


def chunk_usage(prompt: int, completion: int, chat: bool) -> str:
    """``,"usage":{...}`` of one choice's chunk (``continuous_usage_stats``), closing the chunk."""
    details = ',"completion_tokens_details":null' if chat else ""  # chat sets it, to None without a reasoning parser
    return (f',"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt + completion},'
            f'"completion_tokens":{completion}{details}}}}}')


def no_usage(prompt: int, completion: int, chat: bool) -> str:
    return "}"
