"""The simulated scheduler's view of one request (mutable, like vLLM's ``Request``)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["SchedRequest"]


class SchedRequest:
    """The scheduler's view of one request (mutable, like vLLM's ``Request``)."""

    __slots__ = ("request_id", "uid", "prompt", "num_prompt_tokens", "max_tokens", "num_tokens",
                 "num_delivered", "num_computed", "blocks", "block_hashes", "num_cached_blocks", "priority",
                 "arrival", "num_preemptions", "num_cached_tokens", "finished", "mark")

    def __init__(self, request_id: str, uid: int, prompt: Sequence[int], max_tokens: int,
                 priority: int = 0, arrival: float = 0.0):
        self.request_id = request_id
        self.uid = uid
        self.prompt = tuple(prompt)
        self.num_prompt_tokens = len(self.prompt)
        self.max_tokens = max_tokens
        # Like vLLM, state advances when a step is *scheduled*: a row that reaches the
        # sequence end adds a placeholder token at once (its value is never needed);
        # the token is delivered when the step's output is processed.
        self.num_tokens = self.num_prompt_tokens  # prompt + generated (placeholders included)
        self.num_delivered = 0  # tokens returned by processed steps
        self.num_computed = 0
        self.blocks: list[int] = []
        self.block_hashes: list[int] = []  # hashes of full blocks known so far
        self.num_cached_blocks = 0  # leading blocks registered in the prefix cache
        self.priority = priority
        self.arrival = arrival
        self.num_preemptions = 0
        self.num_cached_tokens = -1  # prefix-cache hit at first admission (-1: not yet)
        self.finished = False
        # Decode fast path: while num_tokens < mark, the next step is a plain decode that
        # needs no new block, fills no block and is not the last token. 0: take the slow path.
        self.mark = 0

    @property
    def num_output(self) -> int:
        """Tokens generated or scheduled to be (placeholders included)."""
        return self.num_tokens - self.num_prompt_tokens
