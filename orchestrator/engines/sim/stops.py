"""Where a simulated completion ends: stop strings, stop token ids and ``max_tokens``, as vLLM 0.29 decides.

The simulator generates one token over and over (:data:`~orchestrator.engines.sim.logprobs.GENERATED_TEXT`,
one id), so the whole completion is known before the request runs. :func:`plan_ending` replays
vLLM's per-token checks on it and says after how many tokens the request ends, how much of
its text is returned, and why; the engine loop ends the request there (vLLM aborts it in
the engine core once its output processor sees a stop string).

vLLM's order, per generated token (``v1/core/sched/utils.check_stop``, then
``v1/engine/detokenizer.BaseIncrementalDetokenizer.update`` / ``check_stop_strings``):

1. a token in ``stop_token_ids`` stops (``stop_reason``: the id), except among the first
   ``min_tokens`` tokens, where the sampler cannot pick it; then ``max_tokens`` ends it
   (``length``);
2. a token that stopped is left out of the text unless ``include_stop_str_in_output``;
3. once more than ``min_tokens`` tokens exist, a stop string ending in the new text stops
   (``stop_reason``: the string), whatever the engine said: the text is cut before it (after it
   with ``include_stop_str_in_output``). The earliest-ending string wins; ties go to list order.

A stream holds back the last ``len(longest stop string) - 1`` characters until the request
ends, so that a stop string is never half sent (:attr:`StopRule.holds_back`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Union


@dataclass(frozen=True)
class StopRule:
    """A request's stop parameters, as vLLM's ``SamplingParams`` holds them."""

    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    include_in_output: bool = False
    min_tokens: int = 0

    @property
    def active(self) -> bool:
        return bool(self.strings or self.token_ids)

    @property
    def holds_back(self) -> int:
        """Characters a stream withholds until the request ends (vLLM's ``stop_buffer_length``)."""
        if not self.strings or self.include_in_output:
            return 0
        return max(len(s) for s in self.strings) - 1


@dataclass(frozen=True)
class Ending:
    """How one generated sequence ends."""

    tokens: int  # tokens generated, the one that stopped it included (all of them count in usage)
    text_len: int  # characters of generated text returned
    finish_reason: str  # "stop" or "length"
    stop_reason: Union[str, int, None]  # the stop string or token id; None for "length"


def repeated_text(token_text: str, start: int, end: int) -> str:
    """Characters ``[start, end)`` of ``token_text`` repeated (the simulator's generated text)."""
    if end <= start:
        return ""
    size = len(token_text)
    first = start // size
    return (token_text * ((end + size - 1) // size - first))[start - first * size:end - first * size]


def _stop_string(text: str, new_chars: int, rule: StopRule) -> Optional[tuple[str, int]]:
    """vLLM's ``check_stop_strings``: the stop string ending earliest in the new text, and the
    length the text is cut to."""
    if not new_chars:
        return None
    best, best_start, best_end = None, 0, sys.maxsize
    for stop in rule.strings:
        start = text.find(stop, 1 - new_chars - len(stop))
        if start != -1 and start + len(stop) < best_end:
            best, best_start, best_end = stop, start, start + len(stop)
    if best is None:
        return None
    return best, (best_end if rule.include_in_output else best_start)


def plan_ending(rule: StopRule, max_tokens: int, token_text: str, token_id: int) -> Ending:
    """Where a completion of ``token_text`` repeated (each token ``token_id``) ends under ``rule``."""
    if not rule.active:
        return Ending(max_tokens, max_tokens * len(token_text), "length", None)
    # The text is periodic: once a stop string's search window lies wholly inside it, every later
    # step searches the same characters, so a stop not found by then is never found.
    longest = max((len(s) for s in rule.strings), default=0)
    horizon = min(max_tokens, rule.min_tokens + longest // max(1, len(token_text)) + 3)
    text = ""
    for k in range(1, horizon + 1):
        reason: Optional[str] = None
        stop_reason: Union[str, int, None] = None
        if token_id in rule.token_ids and k > rule.min_tokens:
            reason, stop_reason = "stop", token_id
        elif k >= max_tokens:
            reason = "length"
        before = len(text)
        if reason != "stop" or rule.include_in_output:
            text += token_text
        checked_from = len(text) if rule.min_tokens and k <= rule.min_tokens else before
        if rule.strings and k > rule.min_tokens:
            found = _stop_string(text, len(text) - checked_from, rule)
            if found is not None:
                reason, (stop_reason, cut) = "stop", found
                text = text[:cut]
        if reason is not None:
            return Ending(k, len(text), reason, stop_reason)
    return Ending(max_tokens, max_tokens * len(token_text), "length", None)
