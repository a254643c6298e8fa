"""Window noise (orchestrator.doc_tables.window_noise): what windows at one rate disagree by beyond their intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.doc_tables.window_noise import estimate_window_noise
from orchestrator.measure.confidence import z_of


def windows(between_sd: float, within_sd: float, groups: int = 400, per_group: int = 2, seed: int = 0):
    """Groups of windows whose log values scatter by ``between_sd`` and whose 90% intervals each say
    ``within_sd``."""
    rng = np.random.default_rng(seed)
    half = z_of(0.9) * within_sd
    rows = []
    for g in range(groups):
        center = rng.normal(5.0, 1.0)  # groups at other rates: only the spread inside a group counts
        for w in range(per_group):
            v = math.exp(center + rng.normal(0.0, between_sd))
            rows.append({"source": "s", "group": g, "window": w, "ttft_p99_ms": v,
                         "ttft_p99_ms_low": v * math.exp(-half), "ttft_p99_ms_high": v * math.exp(half)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("between, within, noise", [(0.35, 0.2, math.sqrt(0.35**2 - 0.2**2)), (0.2, 0.3, 0.0)])
def test_the_noise_is_the_spread_between_windows_less_what_their_intervals_explain(between, within, noise):
    r = estimate_window_noise(windows(between, within), "ttft_p99_ms")
    assert r["groups"] == 400 and r["windows"] == 800
    assert r["between"] == pytest.approx(between, rel=0.08) and r["within"] == pytest.approx(within, rel=1e-9)
    assert r["noise"] == pytest.approx(noise, abs=0.03)


def test_a_group_of_one_window_says_nothing():
    one = windows(0.3, 0.1, groups=5, per_group=1)
    r = estimate_window_noise(one, "ttft_p99_ms")
    assert r["groups"] == 0 and math.isnan(r["noise"])
