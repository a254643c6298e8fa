"""One scheduled step: its rows (:class:`SchedulerOutput`) and what they compute (:class:`BatchShape`).

:class:`BatchShape` is what the step-time predictor (:mod:`orchestrator.sim.cost`) prices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BatchShape", "SchedulerOutput"]


@dataclass(slots=True)
class BatchShape:
    """What one forward pass computes: the step-time predictor's only input."""

    num_tokens: int = 0  # scheduled tokens (rows of the linear layers)
    num_reqs: int = 0
    num_decodes: int = 0  # one-token rows continuing a generation
    decode_context: int = 0  # KV tokens the decode rows attend to (sum of contexts)
    prefill_tokens: int = 0  # prompt / recompute tokens
    prefill_attn_pairs: int = 0  # causal (query, key) pairs of the prefill chunks
    prefill_context: int = 0  # KV tokens the prefill chunks read (cached prefix + chunk)
    num_sampled: int = 0  # rows that reach the sequence end and sample a token

    @property
    def is_uniform_decode(self) -> bool:
        return self.prefill_tokens == 0 and self.num_decodes > 0


@dataclass
class SchedulerOutput:
    """One step's rows: plain decodes (1 row, samples) apart from every other chunk, for speed."""

    decodes: list  # [SchedRequest]
    chunks: list  # [(SchedRequest, num_new_tokens, samples_a_token)]
    shape: BatchShape
    preempted: list = field(default_factory=list)  # SchedRequests preempted this step

    @property
    def scheduled(self) -> list:
        """[(request, num_new_tokens, samples_a_token)]: decodes first, then chunks in batch order."""
        return [(r, 1, True) for r in self.decodes] + self.chunks

    def __len__(self) -> int:
        return len(self.decodes) + len(self.chunks)
