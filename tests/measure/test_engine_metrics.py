"""The engine's own numbers: vLLM histograms over a window, and the harness-bound rule.

Pure functions against hand-computed Prometheus text; the simulated engine's
histograms against vLLM's own bucket bounds (read from the installed vLLM's source).
The served path (sim behind HTTP, a throttled ingress) is in test_harness_served.py.
"""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.engines.sim.metrics import HISTOGRAMS as SIM_HISTOGRAMS
from orchestrator.engines.sim.metrics import SimRequestMetrics
from orchestrator.measure.engine_window import EngineSnapshot, Histogram, engine_snapshot, engine_window_metrics
from orchestrator.measure.harness import CLIENT_LAG_MS, TTFT_FLOOR_MS, harness_bound_mask, harness_verdict
from orchestrator.measure.metrics import ENGINE_WINDOW_METRIC_NAMES, known_metric_names
from orchestrator.measure.prometheus_text import iter_samples, parse_prometheus
from orchestrator.sim.core import TokenOutput

LABELS = 'model_name="m",engine="{e}"'


def hist_text(prefix: str, name: str, buckets: dict[str, float], total_sum: float, engine: str = "0",
              model: str = "m") -> str:
    """Prometheus text of one histogram series as prometheus_client writes it (cumulative buckets)."""
    lab = f'model_name="{model}",engine="{engine}"'
    lines = [f"# TYPE {prefix}{name} histogram", f"{prefix}{name}_sum{{{lab}}} {total_sum}"]
    lines += [f'{prefix}{name}_bucket{{{lab},le="{le}"}} {c}' for le, c in buckets.items()]
    lines += [f"{prefix}{name}_count{{{lab}}} {buckets['+Inf']}", f"{prefix}{name}_created{{{lab}}} 1.7e9"]
    return "\n".join(lines) + "\n"


def snap(text: str, t: float, prefix: str = "vllm:", labels=None) -> EngineSnapshot:
    return engine_snapshot(iter_samples(text, labels or {"model_name": "m"}, prefix), prefix, t)


# ------------------------------------------------------------------ parsing, difference, quantiles
START = hist_text("vllm:", "time_to_first_token_seconds", {"0.1": 1, "0.25": 1, "0.5": 2, "+Inf": 2}, 0.5)
END = hist_text("vllm:", "time_to_first_token_seconds", {"0.1": 2, "0.25": 6, "0.5": 10, "+Inf": 10}, 2.9)


def test_histogram_buckets_are_kept_per_le_and_summed_over_engines():
    two = END + hist_text("vllm:", "time_to_first_token_seconds", {"0.1": 1, "0.25": 1, "0.5": 1, "+Inf": 3},
                          9.0, engine="1")
    other_model = hist_text("vllm:", "time_to_first_token_seconds", {"0.1": 5, "0.25": 5, "0.5": 5, "+Inf": 5},
                            1.0, model="other")
    h = snap(two + other_model, 0.0).histograms["ttft"]
    assert h.buckets == ((0.1, 3), (0.25, 7), (0.5, 11), (math.inf, 13))
    assert (h.sum, h.count) == (11.9, 13)
    # parse_prometheus (gauges, counters) still sums every sample of a name, le or not.
    assert parse_prometheus(END, {"model_name": "m"})["vllm:time_to_first_token_seconds_count"] == 10


def test_window_difference_and_histogram_quantile():
    d = snap(END, 1.0).histograms["ttft"].minus(snap(START, 0.0).histograms["ttft"])
    assert d.buckets == ((0.1, 1), (0.25, 5), (0.5, 8), (math.inf, 8)) and d.count == 8
    assert d.mean == pytest.approx((2.9 - 0.5) / 8)
    # Prometheus' histogram_quantile: rank q * 8 inside its bucket, linearly.
    assert d.quantile(0.5) == pytest.approx(0.1 + 0.15 * (4 - 1) / 4)      # 0.2125
    assert d.quantile(0.9) == pytest.approx(0.25 + 0.25 * (7.2 - 5) / 3)   # 0.4333
    assert d.quantile(0.99) == pytest.approx(0.25 + 0.25 * (7.92 - 5) / 3)
    assert d.quantile(0.1) == pytest.approx(0.0 + 0.1 * 0.8 / 1)            # the first bucket starts at 0
    assert d.quantile_upper(0.5) == 0.25
    # A rank in the +Inf bucket answers the largest finite bound; no observations: no quantile.
    tail = Histogram(((0.1, 1), (0.5, 2), (math.inf, 10)), 30.0, 10)
    assert tail.quantile(0.99) == 0.5 and tail.quantile_upper(0.99) == math.inf
    empty = Histogram(((0.1, 0), (math.inf, 0)), 0.0, 0)
    assert empty.quantile(0.5) is None and empty.mean is None


def test_engine_window_columns_from_snapshots():
    counters0 = 'vllm:generation_tokens_total{model_name="m",engine="0"} 1000\n' \
                'vllm:request_success_total{model_name="m",engine="0",finished_reason="length"} 10\n'
    counters1 = 'vllm:generation_tokens_total{model_name="m",engine="0"} 2000\n' \
                'vllm:request_success_total{model_name="m",engine="0",finished_reason="length"} 16\n' \
                'vllm:request_success_total{model_name="m",engine="0",finished_reason="stop"} 2\n' \
                'vllm:request_success_total{model_name="m",engine="0",finished_reason="abort"} 5\n'
    start, end = snap(START + counters0, 100.0), snap(END + counters1, 103.0)
    # Periodic scrapes of the token counter: the engine was done by t=101.0.
    series = [(99.5, 900), (100.5, 1500), (101.0, 2000), (101.5, 2000), (102.5, 2000)]
    cols = engine_window_metrics(start, end, series, first_send_t=100.2)
    assert set(cols) == set(ENGINE_WINDOW_METRIC_NAMES)
    assert cols["engine_ttft_p50_ms"] == pytest.approx(212.5)
    assert cols["engine_ttft_p50_upper_ms"] == 250.0
    assert cols["engine_ttft_mean_ms"] == pytest.approx(300.0)
    assert cols["engine_ttft_p99_ms"] == pytest.approx(1000 * (0.25 + 0.25 * 2.92 / 3))
    assert cols["engine_output_throughput"] == pytest.approx(1000 / 0.8)  # active 100.2 .. 101.0
    assert cols["engine_request_throughput"] == pytest.approx(8 / 0.8)  # aborted requests do not count
    # Histograms the engine does not export stay null: never invented.
    assert cols["engine_itl_p50_ms"] is None and cols["engine_queue_mean_ms"] is None
    # No snapshot (no metrics endpoint, failed scrape): every column null.
    assert set(engine_window_metrics(None, end).values()) == {None}


def test_engine_restart_and_lazily_exported_series():
    # A counter that went down means the engine restarted in the window: no difference, null.
    assert engine_window_metrics(snap(END, 0.0), snap(START, 1.0))["engine_ttft_p50_ms"] is None
    # Ray exports ray_vllm_* series only once they moved: absent at the start means zero there.
    ray_end = hist_text("ray_vllm_", "time_to_first_token_seconds", {"0.1": 2, "0.25": 6, "0.5": 10, "+Inf": 10},
                        2.9) + 'ray_vllm_generation_tokens_total{model_name="m",WorkerId="w"} 500\n'
    cols = engine_window_metrics(snap("", 0.0, "ray_vllm_"), snap(ray_end, 2.0, "ray_vllm_"), first_send_t=0.0)
    assert cols["engine_ttft_mean_ms"] == pytest.approx(290.0)
    assert cols["engine_output_throughput"] == pytest.approx(250.0)
    assert cols["engine_request_throughput"] is None  # the counter was never exported
    # Ray's agent re-records histograms at bucket midpoints: its _sum gives no exact mean.
    approx = engine_window_metrics(snap("", 0.0, "ray_vllm_"), snap(ray_end, 2.0, "ray_vllm_"), exact_sums=False)
    assert approx["engine_ttft_mean_ms"] is None and approx["engine_ttft_p50_ms"] == pytest.approx(212.5)


def test_older_vllm_itl_name_is_read():
    text = hist_text("vllm:", "time_per_output_token_seconds", {"0.01": 0, "0.025": 4, "+Inf": 4}, 0.08)
    assert engine_window_metrics(snap("", 0.0), snap(text, 1.0))["engine_itl_mean_ms"] == pytest.approx(20.0)


# ------------------------------------------------------------------ the simulated engine's histograms
def vllm_bucket_bounds() -> dict[str, tuple[float, ...]]:
    """Histogram name -> bucket bounds, read from the installed vLLM's PrometheusStatLogger source."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "vLLM must be installed (see README)"
    tree = ast.parse((Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text())
    names = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.List)}
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        if isinstance(kw.get("name"), ast.Constant) and "buckets" in kw:
            b = kw["buckets"]
            b = names.get(b.id, b) if isinstance(b, ast.Name) else b
            if isinstance(b, ast.List):
                out[kw["name"].value] = tuple(float(x) for x in ast.literal_eval(b))
    return out


def test_sim_histograms_have_vllms_names_and_buckets():
    theirs = vllm_bucket_bounds()
    for name, bounds, _ in SIM_HISTOGRAMS:
        assert theirs.get(name) == bounds, name


def test_sim_records_vllms_request_intervals():
    m = SimRequestMetrics()
    # Arrives at 0, queued at 1 ms, first scheduled in the step starting at 2 ms (a partial prefill),
    # first token at 30 ms, then two more tokens; a second request is aborted: no observation.
    m.add("a", 0.0, 0.001)
    m.add("b", 0.0, 0.001)
    m.step([TokenOutput("a", 0, False, 64, 0), TokenOutput("b", 0, False, 8, 0)], 0.002, 0.010)
    m.abort("b")
    m.step([TokenOutput("a", 1, False, 64, 0)], 0.010, 0.030)
    m.step([TokenOutput("a", 1, False, 64, 0)], 0.030, 0.045)
    m.step([TokenOutput("a", 1, True, 64, 0)], 0.045, 0.070)
    h = snap("\n".join(m.exposition('model_name="m",engine="0"')), 1.0).histograms
    exact = {"ttft": 0.030, "itl": (0.015 + 0.025) / 2, "tpot": 0.040 / 2, "e2el": 0.070, "queue": 0.001,
             "prefill": 0.028, "decode": 0.040}
    for fam, mean in exact.items():
        assert h[fam].mean == pytest.approx(mean), fam
    assert h["ttft"].count == 1 and h["itl"].count == 2 and h["e2el"].count == 1
    assert h["ttft"].quantile_upper(0.5) == 0.04  # 30 ms lies in vLLM's (0.02, 0.04] bucket


# ------------------------------------------------------------------ the harness-bound rule
def test_harness_bound_on_ttft():
    v = harness_verdict({"ttft_p50_ms": 412.0, "engine_ttft_p50_ms": 95.0, "engine_ttft_p50_upper_ms": 100.0})
    assert v.bound is True
    assert v.reason == "client TTFT p50 412 ms vs engine 95 ms (at most 100 ms): the serving path adds 317 ms"
    # Within 10 %, or above it but under the floor: HTTP + detokenisation, not a bottleneck.
    assert harness_verdict({"ttft_p50_ms": 105.0, "engine_ttft_p50_ms": 100.0}).bound is False
    assert harness_verdict({"ttft_p50_ms": 30.0 + TTFT_FLOOR_MS - 1, "engine_ttft_p50_ms": 30.0}).bound is False
    assert harness_verdict({"ttft_p50_ms": 30.0 + TTFT_FLOOR_MS + 1, "engine_ttft_p50_ms": 30.0}).bound is True
    # The engine's median is somewhere in its bucket: judged against the bucket's top.
    assert harness_verdict({"ttft_p50_ms": 240.0, "engine_ttft_p50_ms": 175.0,
                            "engine_ttft_p50_upper_ms": 250.0}).bound is False
    # A client faster than the engine is a window mismatch, not a harness limit.
    assert harness_verdict({"ttft_p50_ms": 50.0, "engine_ttft_p50_ms": 400.0}).bound is False


def test_harness_bound_on_throughput():
    base = {"completed": 100, "failed": 0}
    v = harness_verdict({**base, "output_throughput": 600.0, "engine_output_throughput": 1000.0})
    assert v.bound is True and v.reason.startswith("client throughput 0.60x engine's (600 vs 1,000 tok/s)")
    assert harness_verdict({**base, "output_throughput": 950.0, "engine_output_throughput": 1000.0}).bound is False
    # Failed requests: the engine counted tokens the client never received; not judged.
    assert harness_verdict({"completed": 90, "failed": 10, "output_throughput": 600.0,
                            "engine_output_throughput": 1000.0}).bound is None
    both = harness_verdict({**base, "output_throughput": 500.0, "engine_output_throughput": 1000.0,
                            "ttft_p50_ms": 900.0, "engine_ttft_p50_ms": 90.0})
    assert both.bound and both.reason.count(";") == 1


def test_a_lagging_load_generator_is_named_next_to_the_verdict():
    # Measured on a 2-core machine under load: the client's loop stalled ~0.7 s, its sends ran late
    # and its first-token reads with them; the excess over the engine is then partly the client's.
    lagging = {"ttft_p50_ms": 1219.0, "engine_ttft_p50_ms": 212.0, "engine_ttft_p50_upper_ms": 250.0,
               "sched_lag_p99_ms": 904.0}
    v = harness_verdict(lagging)
    assert v.bound is True
    assert v.reason.startswith("client TTFT p50 1,219 ms vs engine 212 ms (at most 250 ms)")
    assert v.reason.endswith("the load generator lagged too (p99 send lag 904 ms): part of it is the client's "
                             "own CPU, not the path")
    # A lag at or under the floor, or a row not flagged, says nothing about the client.
    assert "lagged" not in harness_verdict({**lagging, "sched_lag_p99_ms": CLIENT_LAG_MS}).reason
    assert harness_verdict({"ttft_p50_ms": 30.0, "engine_ttft_p50_ms": 30.0, "sched_lag_p99_ms": 900.0}).reason is None


def test_not_judged_without_engine_numbers():
    v = harness_verdict({"ttft_p50_ms": 400.0, "output_throughput": 10.0, "engine_ttft_p50_ms": None,
                         "engine_output_throughput": float("nan")})
    assert v.bound is None and v.reason is None
    assert v.columns() == {"harness_bound": None, "harness_bound_reason": None}


# ------------------------------------------------------------------ results tables
def test_columns_in_the_schemas_and_old_files_read_as_null(tmp_path):
    import pandas as pd

    from orchestrator.results.levels import LEVELS_SCHEMA, levels_to_table, load_levels
    from orchestrator.results.schema import trials_schema

    schema = trials_schema({})
    assert schema.field("harness_bound").type == pa.bool_()
    assert schema.field("harness_bound_reason").type == pa.string()
    for name in ENGINE_WINDOW_METRIC_NAMES + ("num_requests_running_mean", "num_requests_waiting_mean"):
        assert name in known_metric_names() and schema.field(name).type == pa.float64()

    # A levels file from before the engine columns, beside a new one: the old reads them as null.
    new = levels_to_table([{"level": 0, "rate": 2.0, "engine_ttft_p50_ms": 12.5, "harness_bound": True,
                            "harness_bound_reason": "r"}], study="s", run_id="r1", trial_id="t2")
    old_schema = pa.schema([f for f in LEVELS_SCHEMA if not f.name.startswith(("engine_", "harness_"))],
                           metadata=LEVELS_SCHEMA.metadata)
    old = pa.Table.from_pylist([{"schema_version": 1, "study": "s", "run_id": "r0", "trial_id": "t1",
                                 "level": 0, "rate": 1.0}], schema=old_schema)
    for table, run, trial in ((old, "r0", "t1"), (new, "r1", "t2")):
        d = tmp_path / "levels" / "date=2026-01-01" / f"run={run}"
        d.mkdir(parents=True)
        pq.write_table(table, d / f"{trial}.parquet")
    levels = load_levels(tmp_path)
    assert levels["engine_ttft_p50_ms"].tolist()[1] == 12.5 and pd.isna(levels["engine_ttft_p50_ms"].iloc[0])
    assert harness_bound_mask(levels).tolist() == [False, True]


def test_progress_line_shows_the_flag(study_doc):
    import io

    from orchestrator.search.progress import ProgressPrinter
    from orchestrator.study.spec import parse_study

    out = io.StringIO()
    p = ProgressPrinter(parse_study(study_doc), total=2, stream=out)
    p.trial_finished({"status": "completed", "tid": "t0", "feasible": True, "harness_bound": True,
                      "output_throughput_per_gpu": 100.0, "ttft_p99_ms": 50.0}, {"max_num_seqs": 8})
    p.trial_finished({"status": "completed", "tid": "t1", "feasible": True, "harness_bound": False,
                      "output_throughput_per_gpu": 90.0, "ttft_p99_ms": 40.0}, {"max_num_seqs": 16})
    lines = out.getvalue().splitlines()
    assert "SLO ok  harness-bound |" in lines[1] and "harness-bound" not in lines[3]


def test_a_level_measured_again_adds_its_windows_and_a_failed_scrape_gives_none():
    from orchestrator.measure.engine_window import Histogram, engine_segments_metrics

    def snap(t, ttft_counts, tokens):
        h = Histogram(((0.05, ttft_counts[0]), (0.1, ttft_counts[1]), (float("inf"), ttft_counts[1])),
                      sum=0.04 * ttft_counts[1], count=ttft_counts[1])
        return EngineSnapshot(t, {"ttft": h}, {"generation_tokens": tokens, "request_success": ttft_counts[1]})

    first = (snap(0.0, (0, 0), 0), snap(10.0, (8, 10), 500), 0.0)
    again = (snap(20.0, (8, 10), 500), snap(30.0, (16, 20), 1000), 20.0)
    both = engine_segments_metrics([first, again])
    assert both["engine_ttft_mean_ms"] == pytest.approx(40.0)
    assert both["engine_output_throughput"] == pytest.approx(1000 / 20.0)  # the pause between is not counted
    assert both["engine_request_throughput"] == pytest.approx(20 / 20.0)
    assert engine_segments_metrics([first, (None, None, 20.0)])["engine_ttft_mean_ms"] is None
