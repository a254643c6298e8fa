"""The decision's words count what they say: comparisons decided are the front's pairs of trials less those
still tied, whatever the equivalence classes group together."""

from __future__ import annotations

import re

import pandas as pd

from orchestrator.results.decisions import FrontDecision


def test_a_front_with_ties_counts_decided_pairs_of_trials():
    front = pd.DataFrame({"trial_id": ["a", "b", "c"]})
    # Two classes (a and b equivalent; c apart) and two pairs still tied: a-c and b-c.
    decision = FrontDecision(front, (("capacity_rps", "maximize"),), 0.05, classes=(("a", "b"), ("c",)),
                             picked=("a", "c"), ties=(("a", "c"), ("b", "c")))
    head = decision.lines()[0]
    decided, pairs = map(int, re.search(r"(-?\d+) of their (\d+) comparisons decided", head).groups())
    assert (decided, pairs) == (1, 3), head
    assert decision.winner is None
