"""Progress of a running study, one line per finished trial, in the terminal and job logs.

Each line: trial count, the trial's status and parameters, its objectives, whether
it met the SLOs (and "harness-bound" when the serving path, not the engine, limited
the measurement: see orchestrator.measure.harness); then done / running / failed counts, the best feasible value of the
first objective so far and an ETA from the mean trial time. With ``search.fidelity: sim``, a line
before each trial runs with what the simulator predicts for it and the stated error of each
prediction, and after it a line with the prediction against the measurement
(:mod:`orchestrator.results.predictions`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Optional

import pandas as pd

from orchestrator.failures import TrialStatus, status_of, trial_lost
from orchestrator.results.outcomes import outcome_summary
from orchestrator.results.paired import EQUIVALENT, TIED, compare
from orchestrator.results.predictions import describe_check, describe_range, prediction_checks
from orchestrator.search.fidelity.margin import screening_rule
from orchestrator.search.fidelity.search import PREDICTED_KEY, PREDICTION_KEY
from orchestrator.search.optuna_search import TRIAL_NUMBER_KEY
from orchestrator.study.judge import feasible_mask
from orchestrator.study.spec import Study


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # NaN
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}"
    return str(v)


def _duration(s: float) -> str:
    s = int(max(0, s))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class ProgressPrinter:
    def __init__(self, study: Study, *, total: int, already_done: int = 0, quiet: bool = False, stream=None):
        self.study = study
        self.total = total
        self.done = already_done
        self.failed = 0
        self.feasible = 0
        self.running = 0
        self.best: Optional[float] = None
        # (the first objective's value, interval and paired draws; the configuration: a racing trial measures
        # one again)
        self.feasible_values: list[tuple[dict, str]] = []
        self.quiet = quiet
        self.stream = stream  # None: sys.stdout at print time (a stored stream may not pickle)
        self.t0 = time.monotonic()
        self.finished_here = 0
        self.screened_count = 0  # proposals the pre-flight turned away (no trial)
        self.concurrency = 1
        # A status line after this long without output, so that long trials still show in job logs.
        self.heartbeat_s = float(os.environ.get("ORCHESTRATOR_PROGRESS_INTERVAL_S", 60))
        self._last_print = self.t0
        self.run_id = ""  # the header's: names a trial before its row does

    def recorded(self, trials) -> None:
        """Count a resumed run's recorded trials (its ``trials`` rows): their failures and best value."""
        if trials is None or len(trials) == 0:
            return


        ok = feasible_mask(trials, self.study.constraints)
        self.failed += int((trials["status"] != TrialStatus.COMPLETED).sum())
        self.feasible += int(ok.sum())
        first = self.study.objectives[0]
        if ok.any() and first.metric in trials.columns:
            values = pd.to_numeric(trials.loc[ok, first.metric], errors="coerce").dropna()
            if len(values):
                self.best = float(values.max() if first.resolved_direction == "maximize" else values.min())
                keys = trials.loc[values.index, "params_json"] if "params_json" in trials else values.index.astype(str)
                for i, k in zip(values.index, keys):
                    row = trials.loc[i]
                    self.feasible_values.append(({c: row.get(c) for c in (first.metric, f"{first.metric}_low",
                                                                        f"{first.metric}_high", "draws_json")},
                                                 str(k)))

    def _print(self, text: str) -> None:
        self._last_print = time.monotonic()
        if not self.quiet:
            print(text, file=self.stream or sys.stdout, flush=True)

    def status_line(self, now: Optional[float] = None) -> str:
        """Counts, best so far, elapsed time and ETA (from the mean time per finished trial)."""
        elapsed = (time.monotonic() if now is None else now) - self.t0
        eta = _duration(elapsed / self.finished_here * (self.total - self.done)) if self.finished_here else "-"
        first = self.study.objectives[0]
        best = _fmt(self.best) if self.best is not None else "-"
        return (f"[{self.done}/{self.total}] done {self.done}, running {self.running}, not completed {self.failed} | "
                f"best {first.metric} {best} | elapsed {_duration(elapsed)}, ETA {eta}")

    def heartbeat(self, now: Optional[float] = None) -> None:
        """Print :meth:`status_line` when nothing was printed for ``heartbeat_s`` seconds (0: never)."""
        now = time.monotonic() if now is None else now
        if self.heartbeat_s > 0 and now - self._last_print >= self.heartbeat_s:
            self._print(self.status_line(now))

    def header(self, run_id: str, *, resumed: bool, stale: int, state_dir: str, recovered: int = 0) -> None:
        s = self.study
        self.run_id = run_id
        objs = ", ".join(f"{o.resolved_direction} {o.metric}" for o in s.objectives)
        slos = ", ".join(str(c) for c in s.constraints) or "none"
        sampler = s.search.sampler + (f", {len(s.search.stages)} stages" if s.search.stages else "")
        self._print(f"study {s.name}: engine {s.engine.kind}, model {s.model.name}, {s.hardware.gpu} "
                    f"x{s.hardware.total_gpus}, sampler {sampler}, {self.total} trials")
        self._print(f"  objectives: {objs}; SLOs: {slos}")
        self._print(f"  {s.price.describe()}")
        if resumed:
            self._print(f"  resuming run {run_id}: {self.done} trials already recorded"
                        + (f", {stale} interrupted trial(s) will be retried" if stale else "")
                        + (f", {recovered} finished trial(s) recovered from their rows" if recovered else ""))
        else:
            self._print(f"  run {run_id}; Optuna journal in {state_dir}"
                        + (f"; {stale} interrupted trial(s) of an earlier run will be retried" if stale else ""))

    def start(self, *, concurrency: int, cluster) -> None:
        self.concurrency = max(1, concurrency)
        self._print(f"  {cluster.total_units} {cluster.resource}(s) in the cluster; "
                    f"up to {concurrency} trial(s) at once")

    def trial_started(self, config: Optional[dict] = None) -> None:
        """A trial starts; with ``search.fidelity: sim``, what the simulator predicts for it, before it runs."""
        self.running += 1
        if config and config.get(PREDICTION_KEY):
            tid = f"{self.run_id}-{int(config[TRIAL_NUMBER_KEY]):04d}" if TRIAL_NUMBER_KEY in config else "?"
            self._print(f"  trial {tid}: {self.prediction_text(json.loads(config[PREDICTION_KEY]))}")

    def prediction_text(self, predicted: dict) -> str:
        """``the simulator predicts capacity_rps 47 (stated error 34.4–64.3), ...``: each of the study's
        metrics the prediction holds, with where the measurement should fall."""
        rule = screening_rule(self.study.hardware.gpu)
        said = []
        for metric, value in predicted.items():
            band = rule.band(metric, value)
            if band is not None:
                label = "stated error " if not said else ""
                said.append(f"{metric} {_fmt(float(value))} ({label}{describe_range(*band)})")
        return ("the simulator predicts " + ", ".join(said) if said else
                "the simulator predicts no number for it (it does not start this configuration there)")

    def note(self, text: str) -> None:
        self._print(f"  {text}")

    def screened(self, row: dict, params: dict) -> None:
        """A proposal the pre-flight turned away: recorded as pruned, no trial, no budget."""
        self.screened_count += 1
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in params.items() if not k.startswith("__"))
        reason = (row.get("failure_message") or "")[:160]
        self._print(f"  [pruned before start] {row.get('trial_id', '')} {shown}: {reason}")

    def trial_finished(self, result: dict, params: dict) -> None:
        self.running = max(0, self.running - 1)
        self.done += 1
        self.finished_here += 1
        status = result.get("status", "?")
        if status != TrialStatus.COMPLETED:
            self.failed += 1
        first = self.study.objectives[0]
        value = result.get(first.metric)
        if result.get("feasible"):
            self.feasible += 1
            if value is not None:
                low, high = result.get(f"{first.metric}_low"), result.get(f"{first.metric}_high")
                key = json.dumps({k: v for k, v in params.items() if not k.startswith("__")}, sort_keys=True,
                                 default=str)
                self.feasible_values.append(({first.metric: value, f"{first.metric}_low": low,
                                              f"{first.metric}_high": high, "draws_json": result.get("draws_json")},
                                             key))
                better = (self.best is None or (value > self.best if first.resolved_direction == "maximize"
                                                else value < self.best))
                if better:
                    self.best = value
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in params.items() if not k.startswith("__"))
        objs = "  ".join(f"{o.metric}={_fmt(result.get(o.metric))}" for o in self.study.objectives) \
            if status == TrialStatus.COMPLETED else (result.get("failure_kind") or "")
        slo = "" if status != TrialStatus.COMPLETED else ("  SLO ok" if result.get("feasible") else "  SLO missed")
        if status == TrialStatus.COMPLETED and result.get("harness_bound"):
            slo += "  harness-bound"
        elapsed = time.monotonic() - self.t0
        left = self.total - self.done
        eta = elapsed / self.finished_here * left / 1 if self.finished_here else 0
        best = _fmt(self.best) if self.best is not None else "-"
        tied, equivalent = self.standing_of_best()
        notes = ([f"not yet told apart from {tied}"] if tied else []) + ([f"equivalent to {equivalent}"]
                                                                          if equivalent else [])
        if notes:
            best += f" ({', '.join(notes)})"
        width = len(str(self.total))
        self._print(f"[{self.done:>{width}}/{self.total}] {result.get('tid', '')} {status:<10} {shown}")
        self._print(f"{'':>{2 * width + 4}}{objs}{slo} | done {self.done}, running {self.running}, "
                    f"not completed {self.failed} | best {first.metric} {best} | "
                    f"elapsed {_duration(elapsed)}, ETA {_duration(eta)}")
        checks = prediction_checks(json.loads(result[PREDICTED_KEY])) if result.get(PREDICTED_KEY) else []
        if status == TrialStatus.COMPLETED and checks:
            self._print(f"{'':>{2 * width + 4}}" + "; ".join(describe_check(c) for c in checks))

    def standing_of_best(self) -> tuple[int, int]:
        """``(not yet told apart, equivalent)``: other configurations compared with the best on the first
        objective by their paired difference (:mod:`orchestrator.results.paired`; each configuration's
        latest measurement)."""
        if self.best is None:
            return 0, 0
        first = self.study.objectives[0]
        latest = {key: row for row, key in self.feasible_values}
        best_key = next((key for row, key in self.feasible_values if row[first.metric] == self.best), None)
        tied = equivalent = 0
        for key, row in latest.items():
            if key == best_key:
                continue
            c = compare(row, latest[best_key], first.metric, first.resolved_direction,
                        margin=self.study.analysis.equivalence_margin)
            tied += c is not None and c.verdict == TIED
            equivalent += c is not None and c.verdict == EQUIVALENT
        return tied, equivalent

    def finish(self, trials) -> None:
        """The run's outcome in one line per status; why, if nothing completed."""
        self._print(outcome_summary(trials))

    def tune_callback(self):
        # deferred: ray.tune takes ~0.7 s to import; validate/show load this module
        from ray.tune import Callback

        printer = self

        class _Progress(Callback):
            def on_trial_start(self, iteration, trials, trial, **info):  # before Tune runs the trial's function
                printer.trial_started(trial.config or {})

            def on_step_end(self, iteration, trials, **info):
                printer.heartbeat()

            def on_trial_complete(self, iteration, trials, trial, **info):
                printer.trial_finished(trial.last_result or {}, trial.config or {})

            def on_trial_error(self, iteration, trials, trial, **info):
                lost = trial_lost(trial.trial_id)  # as the row it gets (search/tune.lost_trial_recorder)
                printer.trial_finished({"status": status_of(lost.kind).value, "tid": trial.trial_id,
                                        "failure_kind": lost.kind.value}, trial.config or {})

        return _Progress()

