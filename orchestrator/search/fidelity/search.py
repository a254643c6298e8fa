"""``search.fidelity: sim``: the simulator screens, real trials confirm.

Before the first real trial, every configuration of the space (or a seeded sample of
``search.fidelity_candidates``) is scored in virtual time on the study's model, GPU and
workload (:class:`SimScorer`: the trial path with ``engine.mode: virtual``). Each real
trial is then the configuration with the largest expected gain
(:func:`~orchestrator.search.fidelity.model.expected_gain`: first the best predicted under
the SLOs, later the most promising where the simulator is least certain). After every real
trial the calibration is fitted again to all real trials, the shortlist is scored again
and re-ranked. The search stops when no configuration is predicted to gain more than
``search.fidelity_min_gain`` of the best, or when the budget is spent; not before as many real
trials as the simulator's measured error on the study's GPU asks for
(:func:`~orchestrator.search.fidelity.margin.screening_rule`, which also sets how far each
prediction is trusted before any real trial).

Every real trial carries the prediction it was picked on (the calibrated simulator's
numbers, :func:`prediction_columns`); the scores of all candidates are written apart from
the trials (``predictions/<run>.parquet``), so nothing predicted enters the Pareto front
or ``recommend``. The judge (:func:`orchestrator.study.judge.judge`) decides what a prediction
is worth exactly as it decides what a measurement is worth.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa

from orchestrator.failures import TrialStatus
from orchestrator.measure.confidence import DEFAULT_CONFIDENCE, z_of
from orchestrator.numbers import finite_float
from orchestrator.search.fidelity import model as fm
from orchestrator.search.fidelity.margin import screening_rule
from orchestrator.search.feasibility import space_points
from orchestrator.search.fidelity.scoring import (Scorer, SimScorer, fidelity_metrics, fit_levels, noise_columns,
                                                  score_in_simulator, study_metrics)
from orchestrator.study.judge import judge

__all__ = ["PREDICTION_KEY", "MEASURED_KEY", "PREDICTED_KEY", "PICK_ATTR", "FidelitySearch", "Pick", "prediction_columns",
           "point_key", "fidelity_metrics", "fit_levels", "noise_columns", "score_in_simulator", "SimScorer"]

PREDICTION_KEY = "__prediction"  # in a trial's config: the prediction it was picked on (JSON)
MEASURED_KEY = "fidelity_measured"  # in a Tune result: the metrics the calibration is fitted to (JSON)
PREDICTED_KEY = "fidelity_predicted"  # in a Tune result: the row's prediction columns and measurements (JSON)
PICK_ATTR = "fidelity_pick"  # on the Optuna trial: why it was picked (best, information)
# Candidates scored again after a refit, best expected gain first: the shortlist, and a longer one
# when a multiplier moved by more than RESCORE_SHIFT (log) since the last long rescoring.
RESCORE_TOP = 32
RESCORE_LONG = 160
RESCORE_SHIFT = 0.1
def prediction_columns(study, predicted: Optional[Mapping[str, Any]], row: Mapping[str, Any]) -> dict[str, Any]:
    """A real trial's ``predicted_<m>``, its stated error ``predicted_<m>_low`` .. ``predicted_<m>_high``
    (where the measurement should fall, :meth:`~orchestrator.search.fidelity.margin.ScreeningRule.band`)
    and ``prediction_error_<m>`` ((measured - predicted) / predicted)."""
    out: dict[str, Any] = {}
    rule = screening_rule(study.hardware.gpu)
    for m in study_metrics(study):
        p = (predicted or {}).get(m)
        y = row.get(m)
        out[f"predicted_{m}"] = p
        out[f"predicted_{m}_low"], out[f"predicted_{m}_high"] = rule.band(m, p) or (None, None)
        ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (p, y)) and p not in (0, 0.0)
        out[f"prediction_error_{m}"] = (y - p) / abs(p) if ok else None
    return out


def point_key(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, round(v, 9) if isinstance(v, float) else v) for k, v in params.items()))


@dataclass
class Pick:
    params: dict[str, Any]
    predicted: dict[str, Any]  # the calibrated simulator's numbers for the study's metrics
    reason: str  # best: the best predicted under the SLOs; information: where the simulator is least sure
    gain: float


@dataclass
class _Candidate:
    params: dict[str, Any]
    status: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    theta: Optional[np.ndarray] = None  # the calibration it was scored under


class FidelitySearch:
    """Picks the real trials of a ``search.fidelity: sim`` study (see the module's text)."""

    def __init__(self, study, *, scorer: Optional[Scorer] = None, note: Callable[[str], None] = print,
                 record: Optional[Callable[[Any], None]] = None):
        self.study, self.note, self.record = study, note, record
        self.scorer = scorer or SimScorer(study)
        self.metrics = study_metrics(study)
        self.fit_metrics = fidelity_metrics(study)
        self.theta = np.zeros(len(fm.CAL_FIELDS))
        self.theta_full = self.theta.copy()  # the calibration of the last long rescoring
        self.candidates: dict[tuple, _Candidate] = {}
        self.measured: dict[tuple, tuple[dict, str, dict]] = {}  # key -> (params, status, metrics)
        self.fit_rms: Optional[float] = None
        self.stop_reason: Optional[str] = None
        # A real measurement's interval is at the capacity search's confidence (or the default).
        self.z = z_of(study.capacity.confidence if study.capacity is not None else DEFAULT_CONFIDENCE)
        self.scored = 0  # simulations run
        # How far the simulator is trusted on this GPU, and the real trials before the stop rule may end the
        # search: from its out-of-sample error measured there, wider on a GPU never measured (.margin).
        self.rule = screening_rule(study.hardware.gpu)
        self.confirmations = self.rule.confirmations(study.objectives[0].metric)
        self._encode = None
        self._ranked: list[tuple[float, tuple, Pick]] = []

    # ---------------------------------------------------------------- calibration and scoring
    def calibration(self, theta: Optional[np.ndarray] = None) -> dict[str, float]:
        return fm.calibration(self.theta if theta is None else theta)

    def _score(self, points: Sequence[Mapping[str, Any]], theta: np.ndarray, *, over_cluster: bool = False,
               rates: Optional[Sequence[Optional[float]]] = None) -> list[tuple[str, dict]]:
        self.scored += len(points)
        score = getattr(self.scorer, "over_cluster", self.scorer) if over_cluster else self.scorer
        if rates is not None and any(r is not None for r in rates):
            return score(points, self.calibration(theta), rates)
        return score(points, self.calibration(theta))

    def prepare(self) -> None:
        """Score the candidates (the whole space, or a seeded sample of it)."""
        t0 = time.monotonic()
        points, size = space_points(self.study.space, self.study.seed,
                                    max_points=self.study.search.fidelity_candidates)
        self._encode = fm.Encoder(self.study.space, points)
        for p, (status, metrics) in zip(points, self._score(points, self.theta, over_cluster=True)):
            self.candidates[point_key(p)] = _Candidate(dict(p), status, metrics, self.theta.copy())
        if self.measured:  # a resumed run's real trials: as many iterations as their fits had, from none
            self.refit(over_cluster=True, iterations=fm.FIT_ITERATIONS * len(self.measured))
            self.note(f"fidelity sim: {len(self.measured)} real trial(s) recorded before; {self.describe_calibration()}")
        starts = sum(c.status == TrialStatus.COMPLETED for c in self.candidates.values())
        feasible = sum(self._feasible(c) for c in self.candidates.values())
        self.note(f"fidelity sim: {self.rule.describe(self.study.objectives[0].metric)}")
        self.note(f"fidelity sim: scored {len(points)} of {size} configurations in the simulator in "
                  f"{time.monotonic() - t0:.1f} s; {starts} start, {feasible} predicted to meet the SLOs")
        self._record()

    def _record(self) -> None:
        if self.record is not None:
            self.record(self.predictions_table())

    def _feasible(self, c: _Candidate) -> bool:
        return judge(self.study, c.metrics, c.status).feasible

    def prediction_for(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The calibrated simulator's numbers for any configuration (scored now if it is no candidate)."""
        c = self.candidates.get(point_key(params))
        if c is None or c.theta is None or not np.allclose(c.theta, self.theta):
            status, metrics = self._score([params], self.theta)[0]
            c = self.candidates.setdefault(point_key(params), _Candidate(dict(params)))
            c.status, c.metrics, c.theta = status, metrics, self.theta.copy()
        return {m: c.metrics.get(m) for m in self.metrics}

    # ---------------------------------------------------------------- real results
    def observe(self, params: Mapping[str, Any], status: str, metrics: Mapping[str, Any], *,
                refit: bool = True, cluster_idle: bool = False) -> None:
        """A real trial's outcome: fit the calibration again and re-rank (the shortlist scored over
        the cluster when ``cluster_idle``: no trial is running)."""
        self.measured[point_key(params)] = (dict(params), str(status), dict(metrics))
        if refit and self.candidates:
            self.refit(over_cluster=cluster_idle)
            self.note(f"fidelity sim: {len(self.measured)} real trial(s); {self.describe_calibration()}")
            self._record()

    def observe_rows(self, frame, levels=None) -> None:
        """Real trials recorded earlier (a resumed run), with their load levels (a capacity
        study's ``levels`` table): taken in without a fit each."""
        if frame is None or len(frame) == 0 or "params_json" not in frame.columns:
            return
        by_trial: dict[str, list[dict]] = {}
        if self.study.capacity is not None and levels is not None and len(levels):
            for row in levels.to_dict("records"):
                by_trial.setdefault(row["trial_id"], []).append(row)
        for _, row in frame.iterrows():
            if row.get("fidelity", "real") == "sim":
                continue
            params = json.loads(row["params_json"])
            measured = {m: row.get(m) for m in self.fit_metrics + noise_columns(self.study)}
            if row["trial_id"] in by_trial:
                measured["levels"] = fit_levels(self.study, by_trial[row["trial_id"]])
            self.observe(params, row["status"], measured, refit=False)

    def _fit_set(self) -> tuple[list[dict], list[Optional[float]], list[dict]]:
        """What the calibration is fitted to: configurations, the rate each is simulated at (None:
        as the study runs it) and the measured metrics. A capacity trial with levels counts as its
        levels (:func:`fit_levels`), any other real trial as its own metrics."""
        configs, rates, measured = [], [], []
        for p, s, m in self.measured.values():
            if s != TrialStatus.COMPLETED:
                continue
            levels = m.get("levels") if self.study.capacity is not None else None
            for lv in levels or [None]:
                configs.append(p)
                rates.append(None if lv is None else lv["rate"])
                measured.append(m if lv is None else lv)
        return configs, rates, measured

    def refit(self, over_cluster: bool = False, iterations: int = fm.FIT_ITERATIONS) -> None:
        """Fit the calibration to every real trial so far, then score the shortlist again under it."""
        configs, rates, measured = self._fit_set()
        if configs:
            try:
                self.theta, self.fit_rms = fm.fit_calibration(
                    lambda th: [mm for _, mm in self._score(configs, th, rates=rates, over_cluster=over_cluster)],
                    measured, self.fit_metrics, self.theta, iterations)
            except Exception as e:  # noqa: BLE001 - a failed fit must not end the study: keep the last one
                self.note(f"fidelity sim: calibration fit failed ({type(e).__name__}: {e}); keeping the last one")
        shift = float(np.max(np.abs(self.theta - self.theta_full)))
        top = RESCORE_TOP
        if shift > RESCORE_SHIFT:
            self.theta_full, top = self.theta.copy(), RESCORE_LONG
        todo = [k for _, k, _ in self._rank()[:top]]  # and the real trials (their errors under this calibration)
        for p, s, _ in self.measured.values():
            k = point_key(p)
            if s == TrialStatus.COMPLETED and k not in todo:
                self.candidates.setdefault(k, _Candidate(dict(p)))
                todo.append(k)
        scores = self._score([self.candidates[k].params for k in todo], self.theta, over_cluster=over_cluster)
        for k, (status, metrics) in zip(todo, scores):
            c = self.candidates[k]
            c.status, c.metrics, c.theta = status, metrics, self.theta.copy()
        self._ranked = []

    # ---------------------------------------------------------------- ranking and picking
    def _best_real(self) -> Optional[float]:
        maximize = self.study.objectives[0].resolved_direction == "maximize"
        vals = [j.objectives[0] for p, s, m in self.measured.values()
                if (j := judge(self.study, m, s)).feasible and j.objectives[0] is not None]
        if not vals:
            return None
        return max(vals) if maximize else min(vals)

    def _best_noise(self) -> float:
        """The relative sd of the best real trial's first objective (its interval; else the default)."""
        metric = self.study.objectives[0].metric
        maximize = self.study.objectives[0].resolved_direction == "maximize"
        feasible = [(j.objectives[0], m) for p, s, m in self.measured.values()
                    if (j := judge(self.study, m, s)).feasible and j.objectives[0] is not None]
        if not feasible:
            return 0.0
        _, m = (max if maximize else min)(feasible, key=lambda vm: vm[0])
        return math.exp(fm.noise_log_sd(m, metric, self.z)) - 1.0

    def _rank(self, exclude: Sequence[tuple] = ()) -> list[tuple[float, tuple, Pick]]:
        """Unmeasured candidates that start, by expected gain (largest first)."""
        keys = [k for k, c in self.candidates.items() if k not in self.measured and k not in exclude
                and c.status == TrialStatus.COMPLETED]
        if not keys:
            return []
        xs = np.array([self._encode(self.candidates[k].params) for k in keys])
        real = [(p, m) for p, s, m in self.measured.values() if s == TrialStatus.COMPLETED]
        xr = np.array([self._encode(p) for p, _ in real]) if real else np.zeros((0, xs.shape[1]))

        def corrected(metric: str) -> tuple[np.ndarray, np.ndarray]:
            errs, rows, noise = [], [], []
            for i, (p, m) in enumerate(real):
                c = self.candidates.get(point_key(p))
                ly, lp = fm.log_value(m.get(metric)), fm.log_value(c.metrics.get(metric) if c else None)
                if ly is not None and lp is not None:
                    errs.append(ly - lp)
                    rows.append(i)
                    noise.append(fm.noise_log_sd(m, metric, self.z))  # each measurement's own noise
            model = fm.Residuals.fit(xr[rows], np.array(errs), self.rule.sd(metric), np.array(noise))
            mean, sd = model.predict(xs)
            lp = np.array([fm.log_value(self.candidates[k].metrics.get(metric)) or np.nan for k in keys])
            return lp + mean, sd

        study = self.study
        chance = np.ones(len(keys))
        for con in study.constraints:
            mu, sd = corrected(con.metric)
            chance *= fm.chance_met(con.op, con.value, mu, sd)
        obj = study.objectives[0]
        maximize = obj.resolved_direction == "maximize"
        mu, sd = corrected(obj.metric)
        mu = np.where(np.isnan(mu), -np.inf if maximize else np.inf, mu)
        gain = chance * fm.expected_gain(mu, sd, self._best_real(), maximize)
        order = np.argsort(-gain, kind="stable")
        likely = chance >= 0.5
        # "best": predicted as good as any configuration likely to meet the SLOs (ties included:
        # the capacity search's levels make many configurations predict the same capacity).
        top = None
        if likely.any():
            top = float(mu[likely].max() if maximize else mu[likely].min())
            top = top if math.isfinite(top) else None
        out = []
        for i in order:
            k = keys[i]
            c = self.candidates[k]
            reason = "best" if top is not None and likely[i] and abs(mu[i] - top) <= 1e-9 else "information"
            out.append((float(gain[i]), k, Pick(dict(c.params), {m: c.metrics.get(m) for m in self.metrics},
                                                reason, float(gain[i]))))
        return out

    def next_pick(self, pending: Sequence[Mapping[str, Any]] = ()) -> Optional[Pick]:
        """The next configuration to measure for real; None (and :attr:`stop_reason`) to stop."""
        said = self.stop_reason
        pick = self._next_pick(pending)
        if pick is None and self.stop_reason != said:
            self.note(f"fidelity sim: stop: {self.stop_reason}")
        return pick

    def _next_pick(self, pending: Sequence[Mapping[str, Any]]) -> Optional[Pick]:
        ranked = self._rank(exclude=[point_key(p) for p in pending])
        self._ranked = ranked
        if not ranked:
            self.stop_reason = "every configuration the simulator says can start was measured"
            return None
        gain, _, pick = ranked[0]
        if len(self.measured) + len(pending) < self.confirmations:  # too few real trials to trust the ranking
            self.stop_reason = None
            return pick
        best = self._best_real()
        min_gain = self.study.search.fidelity_min_gain
        # A gain inside the best's own measurement noise would not be told apart from it.
        noise = self._best_noise()
        if best is not None and gain < max(min_gain, noise) * abs(best):
            why = (f"search.fidelity_min_gain {min_gain:.2%}" if min_gain >= noise else
                   f"the best's own measurement noise ({noise:.2%})")
            self.stop_reason = (f"the largest predicted gain of another real trial is {gain / abs(best):.2%} of the "
                                f"best ({best:.4g}), below {why}")
            return None
        if best is None and gain <= 0:
            self.stop_reason = "no configuration left is predicted to meet the SLOs"
            return None
        self.stop_reason = None
        return pick

    # ---------------------------------------------------------------- the record
    def predictions_table(self):
        """Every scored configuration with its prediction (``fidelity`` sim), for ``predictions/``."""
        rows = []
        for k, c in self.candidates.items():
            j = judge(self.study, c.metrics, c.status)
            row = {"fidelity": "sim", "params_json": json.dumps(c.params, sort_keys=True, default=str),
                   "status": c.status, "feasible": j.feasible, "constraint_violation": j.constraint_violation,
                   "measured": k in self.measured}
            row.update({f"predicted_{m}": finite_float(c.metrics.get(m)) for m in self.metrics})
            row["calibration_json"] = json.dumps(self.calibration(c.theta) if c.theta is not None else None)
            rows.append(row)
        return pa.Table.from_pylist(rows)

    def describe_calibration(self) -> str:
        cal = self.calibration()
        rms = f", RMS log error {self.fit_rms:.3f}" if self.fit_rms is not None else ""
        return "calibration " + ", ".join(f"{k} {v:.3g}" for k, v in cal.items()) + rms
