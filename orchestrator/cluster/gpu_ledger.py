"""Which trial may deploy now: a ledger of the cluster's GPUs, node by node.

Serve replicas get their own placement groups, so a Tune trial cannot reserve the
GPUs its replica will use. Without bookkeeping, Tune would start more deployments
than fit and they would sit pending while their start timeout runs. The ledger
hands out GPUs per node (a TP group must fit in one node) before a trial deploys,
and takes them back after teardown. Engines that can pin a replica to a node ask
:func:`leased_node` where their lease is, so Ray places the replica exactly where
the ledger counted it (without pinning, Ray's own placement could fragment nodes
differently and a TP=4 replica would wait although the ledger saw room).

The ledger follows the cluster: on every acquire, and every few seconds while a
trial waits, it re-reads the alive nodes. A node that dies takes its leases with
it (their trials are failing anyway); a node that joins adds room.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Optional

# Set in a trial's process: the named ledger actor of its run (see leased_node).
# How often a waiting acquire re-reads the cluster's nodes.
REFRESH_S = 2.0


@dataclass
class NodeCapacity:
    node_id: str
    total: int
    used: int = 0

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass(frozen=True)
class LedgerEvent:
    """One change of a node's use: ``used`` is the node's count after it."""

    t: float  # time.time()
    holder: str
    node_id: str
    delta: int
    used: int
    total: int


@dataclass
class Ledger:
    """Best-fit allocation of ``amount`` units on one node (pure; no Ray)."""

    nodes: list[NodeCapacity]
    holdings: dict[str, tuple[str, int]] = field(default_factory=dict)
    events: list[LedgerEvent] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(n.total for n in self.nodes)

    @property
    def largest_node(self) -> int:
        return max((n.total for n in self.nodes), default=0)

    def _node(self, node_id: str) -> Optional[NodeCapacity]:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def impossible(self, amount: int) -> Optional[str]:
        if amount > self.largest_node:
            return (f"needs {amount} accelerators on one node; the largest node has {self.largest_node} "
                    f"(cluster total {self.total})")
        return None

    def holding(self, holder: str) -> Optional[str]:
        held = self.holdings.get(holder)
        return held[0] if held else None

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
        self._log(holder, node, amount)
        return node.node_id

    def release(self, holder: str) -> None:
        held = self.holdings.pop(holder, None)
        if held is None:
            return
        node = self._node(held[0])
        if node is not None:
            node.used -= held[1]
            self._log(holder, node, -held[1])

    def update_nodes(self, alive: dict[str, int]) -> list[str]:
        """Follow the cluster: drop dead nodes (and their leases), add new ones; returns dropped holders."""
        dropped = [h for h, (nid, _) in self.holdings.items() if nid not in alive]
        for h in dropped:
            del self.holdings[h]
        kept = []
        for n in self.nodes:
            if n.node_id in alive:
                n.total = alive[n.node_id]
                kept.append(n)
        known = {n.node_id for n in kept}
        kept += [NodeCapacity(k, v) for k, v in sorted(alive.items()) if k not in known and v > 0]
        self.nodes = kept
        return dropped

    def peaks(self) -> dict[str, tuple[int, int]]:
        """Most units each node had leased at once, with its size: ``{node: (peak, total)}``."""
        out = {n.node_id: (0, n.total) for n in self.nodes}
        for e in self.events:
            peak, _ = out.get(e.node_id, (0, e.total))
            out[e.node_id] = (max(peak, e.used), e.total)
        return out

    def _log(self, holder: str, node: NodeCapacity, delta: int) -> None:
        self.events.append(LedgerEvent(time.time(), holder, node.node_id, delta, node.used, node.total))
        del self.events[:-100_000]  # bounded: a long study keeps its last 100k changes


def units_per_node(resource: str) -> dict[str, int]:
    """Units of ``resource`` an engine may use per alive node (from Ray's view of the cluster).

    A CPU engine replica takes one CPU bundle; one CPU per node is kept for the rest
    (trial actors, Serve's proxy).
    """
    # deferred: ray takes ~0.3 s to import; validate/show load this module
    import ray

    out = {}
    for node in ray.nodes():
        if node.get("Alive") or node.get("alive"):
            amount = int(node.get("Resources", {}).get(resource, 0))
            if resource == "CPU":
                amount = max(1, amount - 1)
            if amount > 0:
                out[node["NodeID"]] = amount
    return out


# Kept for callers of the old name.
cluster_units = units_per_node


class GpuLedgerActor:
    """Ray actor around :class:`Ledger`: ``acquire`` waits until the units fit."""

    def __init__(self, resource: str, nodes: dict[str, int], follow_cluster: bool = True):
        self.resource = resource
        self.follow = follow_cluster
        self.ledger = Ledger([NodeCapacity(k, v) for k, v in sorted(nodes.items()) if v > 0])
        self.changed = asyncio.Condition()

    def _refresh(self) -> None:
        if self.follow:
            try:
                self.ledger.update_nodes(units_per_node(self.resource))
            except Exception:  # noqa: BLE001 - the GCS may be busy; keep the last view
                pass

    async def acquire(self, holder: str, resource: str, amount: int) -> Optional[str]:
        """Wait for room; return None on success or why it can never fit."""
        if amount <= 0:
            return None
        async with self.changed:
            self._refresh()
            while self.ledger.try_acquire(holder, amount) is None:
                why = self.ledger.impossible(amount)
                if why:
                    return why
                try:
                    await asyncio.wait_for(self.changed.wait(), timeout=REFRESH_S)
                except asyncio.TimeoutError:
                    self._refresh()
        return None

    async def release(self, holder: str) -> None:
        async with self.changed:
            self.ledger.release(holder)
            self.changed.notify_all()

    def holding(self, holder: str) -> Optional[str]:
        return self.ledger.holding(holder)

    def snapshot(self) -> dict:
        return {n.node_id: (n.used, n.total) for n in self.ledger.nodes}

    def peaks(self) -> dict[str, tuple[int, int]]:
        return self.ledger.peaks()

    def events(self) -> list[LedgerEvent]:
        return list(self.ledger.events)


def leased_node(holder: str, ledger_name: Optional[str], namespace: str = "orchestrator") -> Optional[str]:
    """The node id of ``holder``'s lease in the run's ledger ``ledger_name``, or None (no ledger / no lease)."""
    if not ledger_name:
        return None
    # deferred: ray takes ~0.3 s to import; validate/show load this module
    import ray

    try:
        ledger = ray.get_actor(ledger_name, namespace=namespace)
        return ray.get(ledger.holding.remote(holder), timeout=30)
    except Exception:  # noqa: BLE001 - no pinning is still a valid (if less exact) placement
        return None


def max_concurrent_use(events: list[LedgerEvent]) -> dict[str, int]:
    """Most units in use per node, recomputed from the event log alone (pure; for checks)."""
    used: dict[str, int] = {}
    peak: dict[str, int] = {}
    for e in events:  # the log is in order; times may tie
        used[e.node_id] = used.get(e.node_id, 0) + e.delta
        peak[e.node_id] = max(peak.get(e.node_id, 0), used[e.node_id])
    return peak
