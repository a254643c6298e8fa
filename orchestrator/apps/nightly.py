"""Nightly regression searches: run a study again, compare with the previous night, flag slowdowns.

A nightly run is an ordinary run of the study (its own ``run=<run_id>`` partition,
the study's budget) with two additions:

* **Re-measure first.** The previous night's front points are queued in the Optuna
  study before the search starts, so they are the first trials of the night and
  every night measures some configurations that the previous night measured too.
  The rest of the budget searches as usual; the sampler is warm, because every
  night's trials live in the same Optuna journal (same study fingerprint).
* **Compare.** Against the previous night: the latest earlier run of the study on
  the same workload with a completed trial (a nightly run, or the plain
  ``orchestrator run`` that set the baseline). Compared:
  the best capacity under the SLOs, and for each re-measured configuration its
  capacity, its p99 latencies and whether it still starts and meets the SLOs. A
  change for the worse is a regression only beyond the measurements' noise: the two
  nights' intervals of the metric (``<metric>_low`` / ``_high``) do not overlap, and
  the change is at least ``threshold`` (relative). A change inside the noise is
  reported as such, never flagged. Rows without intervals (written before they
  existed) are compared by ``threshold`` alone.

The verdict is written as JSON to ``<output>/<study>/_nightly/<run_id>.json`` (the
report's nightly section reads these); ``orchestrator nightly`` exits 3 on a
regression so a scheduler can alert on the exit code alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Mapping, Optional, Sequence

import pandas as pd
import pyarrow.fs as pafs
from pydantic import ValidationError

from orchestrator.failures import TrialStatus
from orchestrator.measure.metrics import default_direction
from orchestrator.results.analysis import best_under_slos, config_key
from orchestrator.results.paired import EQUIVALENT, WORSE, compare
from orchestrator.results.pareto import pareto_front
from orchestrator.results.query import resolve_location
from orchestrator.study.spec import Study
from orchestrator.workload.spec import WorkloadSpec

log = logging.getLogger(__name__)

NIGHTLY_DIR = "_nightly"
SUMMARY_VERSION = 1


@dataclass(frozen=True)
class NightlyPolicy:
    """What counts as a regression, and how much of the budget re-measures last night's front."""

    threshold: float = 0.03  # smallest change for the worse worth flagging (0.03 = 3 %), beyond the noise
    latency_metrics: tuple[str, ...] = ("ttft_p99_ms", "tpot_p99_ms")
    capacity_metric: Optional[str] = None  # None: capacity_rps when measured, else the first maximised objective
    remeasure: Optional[int] = None  # front points re-measured first; None: up to half the budget (at least 1)

    def __post_init__(self):
        if not 0 < self.threshold < 10:
            raise ValueError(f"threshold must be a relative change in (0, 10), got {self.threshold}")
        if self.remeasure is not None and self.remeasure < 0:
            raise ValueError(f"remeasure must be >= 0, got {self.remeasure}")

    def remeasure_limit(self, budget: int) -> int:
        return self.remeasure if self.remeasure is not None else max(1, budget // 2)


@dataclass(frozen=True)
class Change:
    """One comparison with the previous night. ``change`` > 0 is worse (relative), whatever the metric's direction."""

    what: str  # "best under SLOs" or the configuration's parameters
    metric: str
    previous: Optional[float]
    current: Optional[float]
    previous_trial: Optional[str]
    current_trial: Optional[str]
    change: Optional[float]
    regression: bool
    note: str = ""


@dataclass
class NightlySummary:
    """The JSON a scheduler alerts on (``regression``), one file per nightly run."""

    study: str
    night: str  # UTC date of the run
    run_id: str
    created_at: str
    previous_run_id: Optional[str]
    workload_hash: str
    fingerprint: str
    capacity_metric: str
    best_capacity: Optional[float]
    best_trial: Optional[str]
    threshold: float
    regression: bool
    reasons: list[str]
    changes: list[Change]
    remeasured: int
    trials: dict[str, int]
    versions: dict[str, Any] = field(default_factory=dict)  # {"previous": {...}, "current": {...}}
    summary_version: int = SUMMARY_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False, default=str)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NightlySummary":
        """Raises TypeError or ValueError for a summary that is not one (a damaged or hand-edited file)."""
        data = dict(data)
        data["changes"] = [Change(**c) for c in data.get("changes", [])]
        known = set(cls.__dataclass_fields__)
        summary = cls(**{k: v for k, v in data.items() if k in known})
        for obj in (summary, *summary.changes):
            for key, want in _TYPES.items():
                if hasattr(obj, key) and not isinstance(getattr(obj, key), want):
                    raise TypeError(f"{key}: {getattr(obj, key)!r} is not a {want}")
        return summary

    def headline(self) -> str:
        best = "-" if self.best_capacity is None else f"{self.best_capacity:,.4g}"
        text = f"best {self.capacity_metric} {best}"
        if self.previous_run_id is None:
            return text + "; first nightly run on this workload: nothing to compare with"
        text += (f"; compared with run {self.previous_run_id} (a regression: worse beyond the noise, "
                 f"by {self.threshold:.0%} or more)")
        prev, cur = self.versions.get("previous") or {}, self.versions.get("current") or {}
        moved = [f"{k} {prev.get(k)} -> {cur.get(k)}" for k in ("vllm", "ray", "torch", "orchestrator")
                 if prev.get(k) != cur.get(k)]
        return text + (f"; versions changed: {', '.join(moved)}" if moved else "")

    def changes_frame(self) -> pd.DataFrame:
        rows = [{"what": c.what, "metric": c.metric, "previous": c.previous, "current": c.current,
                 "change": None if c.change is None else f"{c.change:+.1%} (worse)" if c.change > 0
                 else f"{c.change:+.1%}",
                 "verdict": "REGRESSION" if c.regression else (c.note or "ok")} for c in self.changes]
        return pd.DataFrame(rows, columns=["what", "metric", "previous", "current", "change", "verdict"])


_NUMBER = (int, float, type(None))
_TYPES = {"night": str, "run_id": str, "created_at": str, "capacity_metric": str, "regression": bool, "reasons": list,
          "trials": dict, "versions": dict, "best_capacity": _NUMBER, "threshold": (int, float), "previous": _NUMBER,
          "current": _NUMBER, "change": _NUMBER, "what": str, "metric": str}


# ------------------------------------------------------------------ pure parts
def workload_hash(study: Study) -> str:
    return hashlib.sha256(study.workload.model_dump_json().encode()).hexdigest()[:16]


def capacity_metric_of(study: Study, trials: pd.DataFrame, policy: NightlyPolicy) -> str:
    if policy.capacity_metric:
        return policy.capacity_metric
    if "capacity_rps" in trials.columns and pd.to_numeric(trials["capacity_rps"], errors="coerce").notna().any():
        return "capacity_rps"
    maximised = [o.metric for o in study.objectives if o.resolved_direction == "maximize"]
    return maximised[0] if maximised else "output_throughput_per_gpu"


def _same_workload(study: Study):
    """A predicate on a row's ``workload_json``: the study's workload, as this version of the tuner reads both.

    Re-reading the stored JSON fills fields added since it was written with their
    defaults, so a tuner upgrade alone does not start a new series.
    """
    mine = study.workload.model_dump_json()

    @lru_cache(maxsize=None)
    def same(text: object) -> bool:
        if not isinstance(text, str):
            return False
        try:
            return WorkloadSpec.model_validate_json(text).model_dump_json() == mine
        except ValidationError:
            return False

    return same


def previous_run(trials: pd.DataFrame, study: Study, *, before: Optional[str] = None) -> Optional[str]:
    """The latest run (by its first trial's start) on the study's workload with a completed trial.

    ``before``: ignore this run and any run that started after it (tonight's).
    """
    if trials.empty:
        return None
    same = trials[trials["workload_json"].map(_same_workload(study))]
    runs = same.groupby("run_id").agg(start=("started_at", "min"),
                                      completed=("status", lambda s: (s == TrialStatus.COMPLETED).any()))
    runs = runs[runs["completed"]]
    if before is not None and before in set(trials["run_id"]):
        cutoff = trials.loc[trials["run_id"] == before, "started_at"].min()
        runs = runs[(runs.index != before) & (runs["start"] < cutoff)]
    return str(runs["start"].idxmax()) if len(runs) else None


def front_points(trials: pd.DataFrame, study: Study, limit: int) -> list[dict[str, Any]]:
    """The searched parameters of a night's front (under the SLOs; without them if none met them), best first."""
    if trials.empty or limit <= 0:
        return []
    front = pareto_front(trials, study.objectives, study.constraints)
    if front.empty:
        front = pareto_front(trials, study.objectives)
    points, seen = [], set()
    for key, raw in zip(config_key(front), front["params_json"]):
        if key in seen:
            continue
        seen.add(key)
        params = json.loads(raw)
        points.append({k: v for k, v in params.items() if k in study.space.params})
    return points[:limit]


def _label(params_json: str, study: Study) -> str:
    params = json.loads(params_json)
    return " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in params.items() if k in study.space.sampled_names())


def _worse(metric: str, previous: Optional[float], current: Optional[float]) -> Optional[float]:
    if previous is None or current is None or pd.isna(previous) or pd.isna(current) or previous == 0:
        return None
    if default_direction(metric) == "maximize":
        return (previous - current) / abs(previous)
    return (current - previous) / abs(previous)


def _beyond_noise(metric: str, previous: Optional[pd.Series], current: Optional[pd.Series]):
    """The paired comparison of ``current`` against ``previous`` (:mod:`orchestrator.results.paired`: two
    nights of one study replay the same requests), or None when neither row has an interval of ``metric``."""
    if previous is None or current is None:
        return None
    both = pd.DataFrame([previous, current])
    if not any(f"{metric}_{end}" in both and both[f"{metric}_{end}"].notna().any() for end in ("low", "high")) \
            and not both.get("draws_json", pd.Series(dtype=object)).notna().any():
        return None
    return compare(current.to_dict(), previous.to_dict(), metric, default_direction(metric))


def _regression(metric: str, worse: Optional[float], previous, current, policy: NightlyPolicy) -> tuple[bool, str]:
    """(flagged, note): worse by at least the threshold, and decided worse by the paired comparison where
    one is known."""
    if worse is None or worse <= policy.threshold:
        return False, ""
    c = _beyond_noise(metric, previous, current)
    if c is not None and c.verdict != WORSE:
        return False, (f"{worse:+.1%} worse, within the noise (the paired difference {c.describe()} is "
                       f"{'within the equivalence margin' if c.verdict == EQUIVALENT else 'not decided'})")
    return True, ""


def _value(row: Optional[pd.Series], metric: str) -> Optional[float]:
    if row is None or metric not in row or pd.isna(row[metric]):
        return None
    return float(row[metric])


def compare_nights(previous: pd.DataFrame, current: pd.DataFrame, study: Study, policy: NightlyPolicy,
                   configs: Sequence[Mapping[str, Any]]) -> tuple[list[Change], list[str]]:
    """Changes from ``previous`` to ``current`` (two nights' trials) and the regressions among them, in words.

    ``configs``: the previous night's front points (what tonight re-measured first).
    """
    cap = capacity_metric_of(study, pd.concat([previous, current]), policy)
    changes: list[Change] = []
    reasons: list[str] = []

    def add(change: Change) -> None:
        changes.append(change)
        if change.regression:
            reasons.append(f"{change.what}: {change.metric} " + (
                f"{change.previous:,.4g} -> {change.current:,.4g} ({change.change:+.1%} worse)"
                if change.change is not None else change.note))

    best_prev = best_under_slos(previous, cap, default_direction(cap), study.constraints)
    best_cur = best_under_slos(current, cap, default_direction(cap), study.constraints)
    p_row = best_prev.iloc[0] if len(best_prev) else None
    c_row = best_cur.iloc[0] if len(best_cur) else None
    if p_row is not None:
        worse = _worse(cap, _value(p_row, cap), _value(c_row, cap))
        lost = c_row is None
        flagged, note = _regression(cap, worse, p_row, c_row, policy)
        add(Change("best under SLOs", cap, _value(p_row, cap), _value(c_row, cap), p_row["trial_id"],
                   None if c_row is None else c_row["trial_id"], worse, regression=lost or flagged,
                   note="no trial met the SLOs tonight" if lost else note))

    keys_prev, keys_cur = config_key(previous), config_key(current)
    wanted = config_key(pd.DataFrame({"params_json": [json.dumps(dict(c)) for c in configs]}))
    for key in dict.fromkeys(wanted):
        before = previous[keys_prev == key].sort_values("started_at")
        after = current[keys_cur == key].sort_values("started_at")
        if before.empty:
            continue
        what = _label(before["params_json"].iloc[-1], study)
        b = _first_draw(before)
        if after.empty:
            add(Change(what, "status", None, None, b["trial_id"], None, None, False, note="not re-measured"))
            continue
        a = _first_draw(after)
        if a["status"] != TrialStatus.COMPLETED:
            add(Change(what, "status", None, None, b["trial_id"], a["trial_id"], None, regression=True,
                       note=f"was {b['status']}, now {a['status']} ({a.get('failure_kind')})"))
            continue
        if bool(b.get("feasible")) and not bool(a.get("feasible")):
            add(Change(what, "SLOs", None, None, b["trial_id"], a["trial_id"], None, regression=True,
                       note="met every SLO last time, misses one now"))
        for metric in dict.fromkeys([cap, *policy.latency_metrics]):
            worse = _worse(metric, _value(b, metric), _value(a, metric))
            flagged, note = _regression(metric, worse, b, a, policy)
            add(Change(what, metric, _value(b, metric), _value(a, metric), b["trial_id"], a["trial_id"], worse,
                       regression=flagged, note=note))
    return changes, reasons


def _first_draw(rows: pd.DataFrame) -> pd.Series:
    """A night's row of one configuration to compare: its latest measurement with the study's own
    workload seed (``measurement`` 0), which every night draws alike; else its latest row (a
    racing measurement again has a draw of its own)."""
    if "measurement" in rows.columns:
        own = rows[pd.to_numeric(rows["measurement"], errors="coerce").fillna(0) == 0]
        if len(own):
            return own.iloc[-1]
    return rows.iloc[-1]


def _versions(trials: pd.DataFrame) -> dict[str, Any]:
    raw = next((v for v in trials.get("versions_json", pd.Series(dtype=object)) if isinstance(v, str)), None)
    return json.loads(raw) if raw else {}


def summarise_night(study: Study, *, run_id: str, current: pd.DataFrame, previous: Optional[pd.DataFrame],
                    previous_run_id: Optional[str], configs: Sequence[Mapping[str, Any]], policy: NightlyPolicy,
                    now: Optional[datetime] = None) -> NightlySummary:
    """The night's verdict from its trials and the previous night's (pure)."""
    now = now or datetime.now(timezone.utc)
    cap = capacity_metric_of(study, current, policy)
    best = best_under_slos(current, cap, default_direction(cap), study.constraints)
    changes, reasons = ([], []) if previous is None else compare_nights(previous, current, study, policy, configs)
    return NightlySummary(
        study=study.name, night=now.date().isoformat(), run_id=run_id, created_at=now.isoformat(),
        previous_run_id=previous_run_id, workload_hash=workload_hash(study), fingerprint=study.fingerprint(),
        capacity_metric=cap, best_capacity=_value(best.iloc[0], cap) if len(best) else None,
        best_trial=str(best.iloc[0]["trial_id"]) if len(best) else None, threshold=policy.threshold,
        regression=bool(reasons), reasons=reasons, changes=changes, remeasured=len(configs),
        trials={str(k): int(v) for k, v in current["status"].value_counts().items()},
        versions={"previous": _versions(previous) if previous is not None else {}, "current": _versions(current)})


# ------------------------------------------------------------------ I/O
def load_summaries(study_dir: str, *, filesystem=None) -> list[NightlySummary]:
    """Every nightly summary of a study (``<output>/<study>``, local or URI), oldest first."""
    fs, root = resolve_location(study_dir, filesystem)
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/{NIGHTLY_DIR}", allow_not_found=True))
    except OSError as e:  # a file where the folder belongs: the summaries are a record, not the data
        log.warning("nightly: skipping %s/%s: %s", root, NIGHTLY_DIR, " ".join(str(e).split()))
        return []
    out = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as f:
                out.append(NightlySummary.from_dict(json.loads(f.read())))
        except (ValueError, TypeError, OSError) as e:
            log.warning("nightly: skipping unreadable summary %s: %s", info.path, e)
    return sorted(out, key=lambda s: s.created_at)


def write_summary(study_dir: str, summary: NightlySummary) -> str:
    """Write the summary (temp file then rename where the filesystem can; a PUT on object stores)."""
    fs, root = resolve_location(study_dir)
    folder = f"{root}/{NIGHTLY_DIR}"
    fs.create_dir(folder, recursive=True)
    final = f"{folder}/{summary.run_id}.json"
    data = summary.to_json().encode()
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{folder}/.{summary.run_id}.json.tmp"
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, final)
    else:
        with fs.open_output_stream(final) as f:
            f.write(data)
    return final
