"""Where a simulated completion stops is where vLLM 0.29 stops it.

The simulator's text is one token repeated (``" tok"``, one id). vLLM's own stop logic is
driven over that token stream: the scheduler's ``check_stop`` (stop token ids, ``max_tokens``)
and the detokenizer's ``BaseIncrementalDetokenizer.update`` (stop strings, ``min_tokens``,
``include_stop_str_in_output``) with ``get_next_output_text`` for what a stream releases
token by token. For every combination of a grid of stop parameters, :func:`plan_ending`
must end after the same token, with the same text, reason and ``stop_reason``, and a stream
must release the same text at every token.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from orchestrator.engines.sim.stops import StopRule, plan_ending, repeated_text

pytestmark = [pytest.mark.slow, pytest.mark.vllm]  # vLLM's import: about 15 s

TOKEN, TEXT = 77, " tok"
MASKED = 78  # a token the sampler picks while min_tokens hides the stop ids (its text is the same)


def vllm_stream(rule: StopRule, max_tokens: int) -> tuple[int, str, str, object, list[str]]:
    """vLLM's (tokens, text, finish_reason, stop_reason, streamed deltas) for the token stream."""
    from vllm.v1.core.sched.utils import check_stop
    from vllm.v1.engine.detokenizer import BaseIncrementalDetokenizer
    from vllm.v1.request import RequestStatus

    class Detokenizer(BaseIncrementalDetokenizer):
        def decode_next(self, next_token_id: int) -> str:
            return TEXT

    params = SimpleNamespace(stop=list(rule.strings), min_tokens=rule.min_tokens, stop_token_ids=list(rule.token_ids),
                             include_stop_str_in_output=rule.include_in_output, eos_token_id=None,
                             repetition_detection=None)
    detok = Detokenizer(SimpleNamespace(sampling_params=params))
    req = SimpleNamespace(output_token_ids=[], sampling_params=params, num_tokens=0, num_output_tokens=0,
                          max_tokens=max_tokens, status=None, stop_reason=None, pooling_params=None)
    deltas = []
    for k in range(1, max_tokens + 1):
        token = TOKEN if k > rule.min_tokens else MASKED
        req.output_token_ids.append(token)
        req.num_output_tokens, req.num_tokens = k, 3 + k
        finish = None
        if check_stop(req, max_model_len=1 << 30):
            finish = "stop" if req.status == RequestStatus.FINISHED_STOPPED else "length"
        found = detok.update([token], finish == "stop")
        stop_reason = found or req.stop_reason
        finish = "stop" if found else finish
        deltas.append(detok.get_next_output_text(finish is not None, True))
        if finish is not None:
            return k, detok.output_text, finish, stop_reason if finish == "stop" else None, deltas
    raise AssertionError("vLLM never ended the request")


def our_stream(rule: StopRule, max_tokens: int) -> tuple[int, str, str, object, list[str]]:
    """The same, from the simulator's plan and its stream's hold-back (``chunks.piece``)."""
    end = plan_ending(rule, max_tokens, TEXT, TOKEN)
    deltas, sent = [], 0
    for k in range(1, end.tokens + 1):
        upto = end.text_len if k == end.tokens else max(sent, k * len(TEXT) - rule.holds_back)
        deltas.append(repeated_text(TEXT, sent, upto))
        sent = max(sent, upto)
    return end.tokens, repeated_text(TEXT, 0, end.text_len), end.finish_reason, end.stop_reason, deltas


STRINGS = [(), ("ok",), (" tok",), ("tok tok",), ("k t",), ("xyz",), ("t", "ok"), ("ok to", "k"), (" tok tok tok",)]


@pytest.mark.parametrize("strings", STRINGS, ids=[repr(s) for s in STRINGS])
def test_the_stop_plan_is_vllms(strings):
    for token_ids, include, min_tokens, max_tokens in itertools.product(
            ((), (TOKEN,), (5,)), (False, True), (0, 1, 3), (1, 2, 4, 9)):
        if min_tokens > max_tokens:
            continue
        rule = StopRule(strings, token_ids, include, min_tokens)
        assert our_stream(rule, max_tokens) == vllm_stream(rule, max_tokens), (rule, max_tokens)


@pytest.mark.parametrize("rule", [StopRule(min_tokens=5), StopRule(("xyz",), (5,))])
def test_a_stop_that_never_comes_ends_at_max_tokens_without_building_the_text(rule):
    end = plan_ending(rule, 10**9, TEXT, TOKEN)
    assert (end.tokens, end.text_len, end.finish_reason, end.stop_reason) == (10**9, 4 * 10**9, "length", None)
    assert repeated_text(TEXT, 4 * 10**9 - 6, 4 * 10**9) == "ok tok"
