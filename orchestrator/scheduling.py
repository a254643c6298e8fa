"""Which trial may deploy now: a ledger of the cluster's GPUs, node by node.

Serve replicas get their own placement groups, so a Tune trial cannot reserve the
GPUs its replica will use. Without bookkeeping, Tune would start more deployments
than fit and they would sit pending while their start timeout runs. The ledger
hands out GPUs per node (a TP group must fit in one node) before a trial deploys,
and takes them back after teardown. Ray still does the real placement and never
oversubscribes; the ledger only keeps trials from waiting inside a deployment.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class NodeCapacity:
    node_id: str
    total: int
    used: int = 0

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass
class Ledger:
    """First-fit allocation of ``amount`` units on one node (pure; no Ray)."""

    nodes: list[NodeCapacity]
    holdings: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(n.total for n in self.nodes)

    @property
    def largest_node(self) -> int:
        return max((n.total for n in self.nodes), default=0)

    def impossible(self, amount: int) -> Optional[str]:
        if amount > self.largest_node:
            return (f"needs {amount} accelerators on one node; the largest node has {self.largest_node} "
                    f"(cluster total {self.total})")
        return None

    def try_acquire(self, holder: str, amount: int) -> Optional[str]:
        """Node id on success, None if nothing fits now."""
        if holder in self.holdings:
            return self.holdings[holder][0]
        # Best fit: the node that leaves the least free room, so large requests still fit elsewhere.
        fits = [n for n in self.nodes if n.free >= amount]
        if not fits:
            return None
        node = min(fits, key=lambda n: (n.free - amount, n.node_id))
        node.used += amount
        self.holdings[holder] = (node.node_id, amount)
        return node.node_id

    def release(self, holder: str) -> None:
        held = self.holdings.pop(holder, None)
        if held is None:
            return
        for n in self.nodes:
            if n.node_id == held[0]:
                n.used -= held[1]


class GpuLedgerActor:
    """Ray actor around :class:`Ledger`: ``acquire`` waits until the units fit."""

    def __init__(self, resource: str, nodes: dict[str, int]):
        self.resource = resource
        self.ledger = Ledger([NodeCapacity(k, v) for k, v in sorted(nodes.items()) if v > 0])
        self.changed = asyncio.Condition()

    async def acquire(self, holder: str, resource: str, amount: int) -> Optional[str]:
        """Wait for room; return None on success or why it can never fit."""
        if amount <= 0:
            return None
        why = self.ledger.impossible(amount)
        if why:
            return why
        async with self.changed:
            while self.ledger.try_acquire(holder, amount) is None:
                await self.changed.wait()
        return None

    async def release(self, holder: str) -> None:
        async with self.changed:
            self.ledger.release(holder)
            self.changed.notify_all()

    def snapshot(self) -> dict:
        return {n.node_id: (n.used, n.total) for n in self.ledger.nodes}


def cluster_units(resource: str) -> dict[str, int]:
    """Units of ``resource`` per alive node (from Ray's view of the cluster)."""
    import ray

    out = {}
    for node in ray.nodes():
        if node.get("Alive") or node.get("alive"):
            amount = int(node.get("Resources", {}).get(resource, 0))
            if amount > 0:
                out[node["NodeID"]] = amount
    return out
