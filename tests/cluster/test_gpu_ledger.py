"""The GPU ledger (pure): best fit per node, following node loss, and its own record of use."""

from __future__ import annotations

import random

from orchestrator.cluster.gpu_ledger import Ledger, NodeCapacity, max_concurrent_use


def ledger(**nodes) -> Ledger:
    return Ledger([NodeCapacity(k, v) for k, v in nodes.items()])


def test_best_fit_keeps_room_for_large_groups():
    lg = ledger(a=4, b=4)
    assert lg.try_acquire("tp2", 2) == "a"
    assert lg.try_acquire("tp1", 1) == "a"  # fills the half-used node, not the empty one
    assert lg.try_acquire("tp4", 4) == "b"
    assert lg.try_acquire("tp2b", 2) is None  # 1 free on a, 0 on b
    assert lg.impossible(8) and not lg.impossible(4)
    lg.release("tp2")
    assert lg.try_acquire("tp2b", 2) == "a"


def test_node_loss_drops_its_leases_and_joins_add_room():
    lg = ledger(a=4, b=4)
    lg.try_acquire("x", 4)
    lg.try_acquire("y", 2)
    assert lg.holding("x") == "a" and lg.holding("y") == "b"
    assert lg.update_nodes({"b": 4, "c": 8}) == ["x"]
    assert lg.holding("x") is None and lg.total == 12
    lg.release("x")  # a lease on a dead node is gone already: no error, no negative count
    assert lg.try_acquire("z", 8) == "c"


def test_random_schedules_never_oversubscribe_a_node():
    rng = random.Random(0)
    lg = ledger(a=4, b=4)
    held = []
    for step in range(2000):
        if held and rng.random() < 0.45:
            lg.release(held.pop(rng.randrange(len(held))))
        else:
            holder = f"t{step}"
            if lg.try_acquire(holder, rng.choice([1, 2, 4])) is not None:
                held.append(holder)
        assert all(0 <= n.used <= n.total for n in lg.nodes)
    peaks = max_concurrent_use(lg.events)
    assert peaks == {k: v[0] for k, v in lg.peaks().items()}
    assert all(peak <= 4 for peak in peaks.values()) and max(peaks.values()) == 4
