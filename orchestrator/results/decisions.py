"""What a study decided: a winner, an equivalence class named with its margin, trade-offs, and the ties
left, from the front of decided comparisons (:func:`orchestrator.results.ties.front_with_ties`).

* **winner**: one configuration on the front, or every front configuration equivalent (within the
  study's ``analysis.equivalence_margin`` on every objective) to one another: a single class, of which
  :data:`PICK_RULE` picks one;
* **trade-offs**: classes that each beat another on some objective (a multi-objective front);
* **ties**: front pairs not yet told apart, their difference straddling the margin: what racing
  spends its re-measurements on.

The same summary is printed at the end of a run, by ``pareto`` and ``show``, and by the report; the
same rule picks among equivalent configurations in ``recommend`` (:func:`pick`). Pure functions of
frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import pandas as pd

from orchestrator.results.paired import DEFAULT_EQUIVALENCE_MARGIN, compare
from orchestrator.results.pareto import ConstraintLike, ObjectiveLike, normalize_objectives
from orchestrator.results.ties import front_with_ties

__all__ = ["FrontDecision", "PICK_RULE", "decide_front", "front_note", "pick", "pick_key"]

PICK_RULE = "fewer GPUs, then less GPU memory, then closer to vLLM's defaults"


def _number(row, name: str, default: float) -> float:
    v = row.get(name) if hasattr(row, "get") else None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return default
    return default if v != v else v


def pick_key(row, distance: int = 0) -> tuple:
    """The order :data:`PICK_RULE` sorts equivalent configurations in (``distance``: engine arguments
    that differ from vLLM's own choice on the hardware)."""
    gpus = _number(row, "gpus", 1.0)
    memory = gpus * _number(row, "gpu_memory_utilization", _number(row, "kv_cache_gib", 0.0))
    return gpus, memory, distance


def pick(rows: pd.DataFrame, distance=None) -> pd.Series:
    """The configuration :data:`PICK_RULE` picks among ``rows`` (equivalent ones); ``distance(row)``:
    how far a row is from vLLM's defaults (0 for all when not given). Ties keep ``rows``' order."""
    keyed = [(pick_key(r, distance(r) if distance else 0), i) for i, (_, r) in enumerate(rows.iterrows())]
    return rows.iloc[min(keyed)[1]]


def front_note(strict: bool, tied: int, equivalent: int) -> str:
    """A front row's standing in words (``strict_front``, ``tied_with``, ``equivalent_with`` of
    :func:`~orchestrator.results.ties.front_with_ties`): empty when every comparison with it is decided."""
    parts = []
    if not strict:
        parts.append("on the front only while a comparison is undecided")
    if equivalent:
        parts.append(f"equivalent to {equivalent} other{'s' if equivalent != 1 else ''}")
    if tied:
        parts.append(f"not yet told apart from {tied} other{'s' if tied != 1 else ''}")
    return "; ".join(parts)


@dataclass(frozen=True)
class FrontDecision:
    """The front (best first), its equivalence classes (trial ids, each class in front order), the trial
    :data:`PICK_RULE` picks in each, and the front pairs still tied."""

    front: pd.DataFrame
    objectives: tuple[tuple[str, str], ...]
    margin: float
    classes: tuple[tuple[str, ...], ...] = ()
    picked: tuple[str, ...] = ()
    ties: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def winner(self) -> Optional[str]:
        """The one configuration to deploy, when the front is one equivalence class with no tie left."""
        return self.picked[0] if len(self.classes) == 1 and not self.ties else None

    def _members(self) -> list[str]:
        out = []
        for members, chosen in zip(self.classes, self.picked):
            extra = f" (equivalent: {', '.join(m for m in members if m != chosen)})" if len(members) > 1 else ""
            out.append(f"  {chosen}{extra}")
        return out

    def lines(self) -> list[str]:
        """The decision in words: what the end of a run, ``pareto`` and the report print."""
        if self.front.empty:
            return []
        margin = f"±{self.margin:.0%}"
        out = []
        if len(self.classes) == 1:
            members = self.classes[0]
            if len(members) == 1:
                out.append(f"decision: trial {members[0]} is the best, every comparison decided "
                           f"(paired differences; equivalence margin {margin})")
            else:
                out.append(f"decision: {len(members)} trials are equivalent within {margin} on every objective "
                           f"({', '.join(members)}); picked {self.picked[0]} by {PICK_RULE}")
        elif not self.ties:
            out.append(f"decision: {len(self.classes)} trade-offs on the front, each better than every other on "
                       f"an objective beyond the noise (equivalence margin {margin}):")
            out.extend(self._members())
        else:
            trials = sum(len(c) for c in self.classes)  # ties are between trials, classes can hold several
            pairs = trials * (trials - 1) // 2
            out.append(f"no single decision yet: {len(self.classes)} configurations on the front, "
                       f"{pairs - len(self.ties)} of their {pairs} comparisons decided (equivalence margin {margin}):")
            out.extend(self._members())
        if self.ties:
            pairs = ", ".join(f"{a} vs {b}" for a, b in self.ties[:6]) + (" ..." if len(self.ties) > 6 else "")
            out.append(f"{len(self.ties)} front pair{'s' if len(self.ties) != 1 else ''} still tied (the difference "
                       f"straddles {margin}; more measurement decides them): {pairs}")
        out.extend(self.notes)
        return out


def decide_front(df: pd.DataFrame, objectives: Sequence[ObjectiveLike], constraints: Sequence[ConstraintLike] = (),
                 *, margin: float = DEFAULT_EQUIVALENCE_MARGIN, confidence: Optional[float] = None,
                 distance=None) -> FrontDecision:
    """The decision of a trials frame (see the module docstring)."""
    objs = tuple(normalize_objectives(objectives))
    kw = {"margin": margin} if confidence is None else {"margin": margin, "confidence": confidence}
    front = front_with_ties(df, objs, constraints, **kw)
    if front.empty:
        return FrontDecision(front, objs, margin)
    ids = [str(t) for t in front["trial_id"]]
    by_class: dict[int, list[int]] = {}
    for pos, c in enumerate(front["equivalence_class"]):
        by_class.setdefault(int(c), []).append(pos)
    classes, picked = [], []
    for positions in by_class.values():
        rows = front.iloc[positions]
        classes.append(tuple(ids[p] for p in positions))
        picked.append(str(pick(rows, distance)["trial_id"]))
    rows = front.to_dict("records")
    ties = []
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            if front["equivalence_class"].iloc[i] == front["equivalence_class"].iloc[j]:
                continue
            verdicts = [compare(rows[i], rows[j], m, d, **kw) for m, d in objs]
            decided = [v for v in verdicts if v is not None and v.verdict in ("better", "worse")]
            if not decided:
                ties.append((ids[i], ids[j]))
    notes = []
    if "capacity_conditioned" in front.columns and any(m == "capacity_rps" or m.startswith("capacity_rps")
                                                        for m, _ in objs):
        ill = front[front["capacity_conditioned"].astype("boolean").fillna(True) == False]  # noqa: E712
        for _, r in ill.iterrows():
            notes.append(f"trial {r['trial_id']}: its capacity is ill-conditioned ({r.get('capacity_binding')} "
                         f"hardly grows with the rate near its limit); compare it by its SLO margins at common "
                         f"rates (`orchestrator show`'s levels), not by capacity")
    return FrontDecision(front, objs, margin, tuple(classes), tuple(picked), tuple(ties), tuple(notes))
