"""Pareto fronts: hand-made cases, directions, constraints, ties, and a brute-force property test."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from orchestrator.results import (dominated_mask, dominates, feasible_mask, is_dominated, knee_point,
                                  normalize_objectives, pareto_front, pareto_mask)
from orchestrator.results.pareto import _front_nd, to_losses
from orchestrator.study.spec import Constraint, Objective


def brute_force_mask(values: np.ndarray, directions: list[str]) -> np.ndarray:
    """O(n^2) reference: i is on the front unless some j is >= in all objectives and > in one."""
    sign = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    loss = np.asarray(values, dtype=float).reshape(-1, len(directions)) * sign
    at_least_as_good = (loss[:, None, :] <= loss[None, :, :]).all(axis=2)  # [j, i]
    strictly_better = (loss[:, None, :] < loss[None, :, :]).any(axis=2)
    return ~(at_least_as_good & strictly_better).any(axis=0)


def frame(values, names, **extra) -> pd.DataFrame:
    df = pd.DataFrame(np.asarray(values, dtype=float), columns=names)
    df.insert(0, "trial_id", [f"t{i}" for i in range(len(df))])
    df["status"] = extra.pop("status", ["completed"] * len(df))
    for k, v in extra.items():
        df[k] = v
    return df


def test_2d_throughput_vs_latency():
    # (output_throughput: maximize, ttft_p99_ms: minimize)
    pts = [(100, 50), (200, 80), (150, 90), (300, 200), (250, 200), (50, 40), (300, 250)]
    df = frame(pts, ["output_throughput", "ttft_p99_ms"])
    front = pareto_front(df, [Objective(metric="output_throughput"), Objective(metric="ttft_p99_ms")])
    expected = brute_force_mask(np.array(pts), ["maximize", "minimize"])
    assert set(front["trial_id"]) == set(df["trial_id"][expected])
    assert list(front["trial_id"]) == ["t3", "t1", "t0", "t5"]  # best throughput first
    assert front.index.tolist() == [3, 1, 0, 5]  # original index kept


def test_direction_changes_the_front():
    pts = [(1, 1), (2, 2), (1, 2), (2, 1)]
    df = frame(pts, ["a", "b"])
    cases = {
        ("minimize", "minimize"): ["t0"],
        ("maximize", "maximize"): ["t1"],
        ("minimize", "maximize"): ["t2"],
        ("maximize", "minimize"): ["t3"],
    }
    for (da, db), expected in cases.items():
        assert list(pareto_front(df, [("a", da), ("b", db)])["trial_id"]) == expected


def test_3d_known_front():
    pts = np.array([
        [1, 5, 5], [5, 1, 5], [5, 5, 1],  # extremes: on the front
        [3, 3, 3],  # balanced: on the front
        [4, 4, 4],  # dominated by (3,3,3)
        [1, 5, 6],  # dominated by (1,5,5)
        [2, 2, 6],  # on the front (nothing is <= in all three)
        [6, 6, 6],  # dominated
    ])
    df = frame(pts, ["x", "y", "z"])
    dirs = ["minimize"] * 3
    front = pareto_front(df, [("x", "minimize"), ("y", "minimize"), ("z", "minimize")])
    assert sorted(front["trial_id"]) == sorted(df["trial_id"][brute_force_mask(pts, dirs)])
    assert sorted(front["trial_id"]) == ["t0", "t1", "t2", "t3", "t6"]
    # sorted by x, ties by y then z
    assert list(front["trial_id"]) == ["t0", "t6", "t3", "t1", "t2"]


def test_3d_mixed_directions_match_brute_force():
    rng = np.random.default_rng(0)
    pts = rng.integers(0, 6, size=(60, 3)).astype(float)
    dirs = ["maximize", "minimize", "maximize"]
    df = frame(pts, ["a", "b", "c"])
    front = pareto_front(df, list(zip(["a", "b", "c"], dirs)))
    assert set(front["trial_id"]) == set(df["trial_id"][brute_force_mask(pts, dirs)])


def test_ties_are_all_kept():
    pts = [(10, 5), (10, 5), (8, 4), (10, 6), (10, 5)]
    df = frame(pts, ["output_throughput", "ttft_p99_ms"])
    front = pareto_front(df, [("output_throughput", "maximize"), ("ttft_p99_ms", "minimize")])
    assert list(front["trial_id"]) == ["t0", "t1", "t4", "t2"]


def test_only_completed_feasible_rows_with_values():
    pts = [(100, 5), (500, 1), (400, 40), (300, 20), (250, np.nan), (200, 300)]
    df = frame(pts, ["output_throughput", "ttft_p99_ms"],
               status=["completed", "failed", "completed", "completed", "completed", "completed"],
               gpu_mem_peak_gib=[10.0, 10.0, 90.0, 10.0, 10.0, None])
    objs = [("output_throughput", "maximize"), ("ttft_p99_ms", "minimize")]
    # t1 failed (would dominate everything); t4 lacks an objective
    assert list(pareto_front(df, objs)["trial_id"]) == ["t2", "t3", "t0"]
    # t2 breaks the memory constraint; t5 has no value for it, which never meets a constraint
    cs = [Constraint.model_validate("gpu_mem_peak_gib <= 80")]
    assert list(pareto_front(df, objs, cs)["trial_id"]) == ["t3", "t0"]
    assert list(pareto_front(df, objs, ["gpu_mem_peak_gib <= 80", "ttft_p99_ms < 10"])["trial_id"]) == ["t0"]
    assert pareto_front(df, objs, ["gpu_mem_peak_gib <= 1"]).empty
    assert feasible_mask(df, cs).tolist() == [True, False, False, True, True, False]


def test_feasible_mask_agrees_with_constraint_met():
    values = [None, np.nan, 99.0, 100.0, 101.0]
    df = pd.DataFrame({"ttft_p99_ms": values, "status": "completed"})
    for op in ("<=", "<", ">=", ">"):
        c = Constraint(metric="ttft_p99_ms", op=op, value=100)
        expected = [c.met(None if v is None or v != v else v) for v in values]
        assert feasible_mask(df, [c]).tolist() == expected, op


def test_objective_forms_and_errors():
    df = frame([(1, 1), (2, 2)], ["output_throughput", "ttft_p99_ms"])
    a = pareto_front(df, ["output_throughput", "ttft_p99_ms"])  # directions from HIGHER_IS_BETTER
    b = pareto_front(df, ["maximize output_throughput", "minimize ttft_p99_ms"])
    c = pareto_front(df, [Objective.model_validate("output_throughput"), Objective.model_validate("ttft_p99_ms")])
    assert list(a["trial_id"]) == list(b["trial_id"]) == list(c["trial_id"]) == ["t1", "t0"]
    with pytest.raises(KeyError, match="no_such"):
        pareto_front(df, [("no_such", "minimize")])
    with pytest.raises(ValueError, match="direction"):
        pareto_front(df, [("ttft_p99_ms", "lower")])
    with pytest.raises(ValueError, match="at most once"):
        pareto_front(df, [("ttft_p99_ms", "minimize"), ("ttft_p99_ms", "maximize")])


@pytest.mark.parametrize("text", ["maximize output_throughput", "minimize output_throughput", "output_throughput",
                                  "ttft_p99_ms", "  maximize   goodput  "])
def test_objective_strings_read_as_the_study_reads_them(text):
    study_objective = Objective.model_validate(text)
    assert normalize_objectives([text]) == [(study_objective.metric, study_objective.resolved_direction)]


def test_unreadable_objective_string():
    with pytest.raises(ValueError, match="cannot read objective"):
        normalize_objectives(["maximize two columns"])


def test_single_objective_front_is_the_best_value():
    df = frame([[3], [1], [1], [2]], ["ttft_p99_ms"])
    assert list(pareto_front(df, [("ttft_p99_ms", "minimize")])["trial_id"]) == ["t1", "t2"]


def test_empty_input():
    df = frame(np.zeros((0, 2)), ["a", "b"])
    assert pareto_front(df, [("a", "minimize"), ("b", "minimize")]).empty
    assert pareto_mask(np.zeros((0, 3)), ["minimize"] * 3).shape == (0,)


def test_dominance_helpers():
    dirs = ["maximize", "minimize"]
    assert dominates([2, 1], [1, 2], dirs)
    assert not dominates([1, 2], [2, 1], dirs)
    assert not dominates([1, 1], [1, 1], dirs)
    assert dominates([1, 1], [1, 2], dirs)
    others = np.array([[1, 5], [3, 3]])
    assert is_dominated([2, 4], others, dirs)
    assert not is_dominated([3, 3], others, dirs)
    assert not is_dominated([4, 4], others, dirs)
    assert dominated_mask(np.array([[1, 5], [3, 3], [2, 4], [3, 3]]), dirs).tolist() == [True, False, True, False]


def test_knee_point():
    # a convex front (min/min): (0,10) (1,4) (2,2) (4,1) (10,0); (2,2) is nearest the ideal after scaling
    pts = [(0, 10), (1, 4), (2, 2), (4, 1), (10, 0)]
    df = frame(pts, ["ttft_p99_ms", "e2el_p99_ms"])
    objs = [("ttft_p99_ms", "minimize"), ("e2el_p99_ms", "minimize")]
    front = pareto_front(df, objs)
    assert knee_point(front, objs)["trial_id"] == "t2"
    # maximize one axis: mirror the first coordinate
    df2 = frame([(10 - x, y) for x, y in pts], ["output_throughput", "e2el_p99_ms"])
    objs2 = [("output_throughput", "maximize"), ("e2el_p99_ms", "minimize")]
    assert knee_point(pareto_front(df2, objs2), objs2)["trial_id"] == "t2"
    # one point; constant objective
    assert knee_point(front.iloc[[0]], objs)["trial_id"] == "t0"
    flat = frame([(1, 5), (1, 3)], ["a", "b"])
    assert knee_point(flat, [("a", "minimize"), ("b", "minimize")])["trial_id"] == "t1"
    with pytest.raises(ValueError):
        knee_point(front.iloc[[]], objs)


def test_ten_thousand_rows_is_fast():
    rng = np.random.default_rng(1)
    for k in (2, 3, 4):
        # anti-correlated points: a large front, the slow case for the N-D loop
        pts = rng.random((10_000, k))
        pts[:, -1] = 1.0 - pts[:, :-1].mean(axis=1) + 0.01 * rng.random(10_000)
        start = time.perf_counter()
        mask = pareto_mask(pts, ["minimize"] * k)
        assert time.perf_counter() - start < 3
        assert mask.any()
    # checked against brute force on a slice
    sub = pts[:1500]
    assert (pareto_mask(sub, ["minimize"] * 4) == brute_force_mask(sub, ["minimize"] * 4)).all()


@st.composite
def problems(draw):
    k = draw(st.integers(1, 4))
    n = draw(st.integers(0, 60))
    # few distinct values: plenty of ties and equal coordinates
    cells = st.sampled_from([-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, np.inf, -np.inf])
    values = draw(hnp.arrays(np.float64, (n, k), elements=cells))
    directions = draw(st.lists(st.sampled_from(["minimize", "maximize"]), min_size=k, max_size=k))
    return values, directions


@settings(max_examples=300, deadline=None)
@given(problems())
def test_pareto_mask_matches_brute_force(problem):
    values, directions = problem
    expected = brute_force_mask(values, directions).tolist()
    assert pareto_mask(values, directions).tolist() == expected
    # the blocked N-D loop with tiny blocks and chunks (many iterations) agrees too
    if len(values) and values.shape[1] >= 2:
        unique, inverse = np.unique(to_losses(values, directions), axis=0, return_inverse=True)
        assert _front_nd(unique, block=3, chunk=4)[inverse.reshape(-1)].tolist() == expected


@settings(max_examples=100, deadline=None)
@given(problems(), st.lists(st.booleans(), min_size=60, max_size=60))
def test_pareto_front_matches_brute_force_on_completed_rows(problem, completed):
    values, directions = problem
    names = [f"m{j}" for j in range(values.shape[1])]
    ok = np.array(completed[:len(values)], dtype=bool)
    df = frame(values, names, status=np.where(ok, "completed", "failed"))
    front = pareto_front(df, list(zip(names, directions)))
    expected = df["trial_id"][ok][brute_force_mask(values[ok], directions)] if ok.any() else []
    assert sorted(front["trial_id"]) == sorted(expected)
    if len(front):
        first = front[names[0]].to_numpy()
        best_first = first if directions[0] == "minimize" else -first
        assert (best_first[:-1] <= best_first[1:]).all()


def test_agrees_with_optuna():
    from optuna.study import _multi_objective as mo  # the helper Optuna's own fronts use

    rng = np.random.default_rng(2)
    for k in (2, 3):
        pts = rng.integers(0, 8, size=(200, k)).astype(float)
        theirs = mo._is_pareto_front(pts, assume_unique_lexsorted=False)
        assert pareto_mask(pts, ["minimize"] * k).tolist() == theirs.tolist()
