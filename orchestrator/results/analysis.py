"""Questions users ask of a trials DataFrame (what :func:`~orchestrator.results.query.load_trials`
returns): the best trials under SLOs, the best per GPU type, one configuration's history
across nights, capacity by night, and which parameter matters most. Pure functions of the
frame; see docs/querying.md.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence, Union

import numpy as np
import pandas as pd

from orchestrator.measure.confidence import DEFAULT_CONFIDENCE
from orchestrator.results.paired import DEFAULT_EQUIVALENCE_MARGIN, EQUIVALENT, TIED, compare
from orchestrator.results.pareto import ConstraintLike, _candidates, feasible_mask, normalize_objectives, to_losses

__all__ = ["best_per_gpu", "best_under_slos", "capacity_by_night", "config_history", "config_key", "param_importance"]


def best_under_slos(df: pd.DataFrame, objective: str, direction: str,
                    constraints: Sequence[ConstraintLike] = (), *, margin: float = DEFAULT_EQUIVALENCE_MARGIN,
                    confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Completed rows that meet every constraint, best ``objective`` first.

    Rows with a missing objective value are dropped; ``.iloc[0]`` is the best trial
    (an empty frame when none qualifies). Equal values keep their order in ``df``.
    Each row compared with the best by their paired difference (:mod:`orchestrator.results.paired`):
    ``equivalent_to_best`` (within ``margin``), ``tied_with_best`` (not decided worse: equivalent, or
    its difference straddles the margin).
    """
    objs = normalize_objectives([(objective, direction)])
    cand, values = _candidates(df, objs, constraints)
    losses = to_losses(values, [direction])[:, 0]
    ranked = cand.iloc[np.argsort(losses, kind="stable")]
    if ranked.empty:
        return ranked.assign(tied_with_best=np.zeros(0, dtype=bool), equivalent_to_best=np.zeros(0, dtype=bool))
    rows = ranked.to_dict("records")
    verdicts = [EQUIVALENT] + [getattr(compare(r, rows[0], objective, direction, margin=margin, confidence=confidence),
                                       "verdict", TIED) for r in rows[1:]]
    return ranked.assign(tied_with_best=[v in (EQUIVALENT, TIED) for v in verdicts],
                         equivalent_to_best=[v == EQUIVALENT for v in verdicts])


def config_key(df: pd.DataFrame) -> pd.Series:
    """One string per row naming its configuration: the searched parameters as sorted JSON.

    Floats are written with 12 significant digits, so a configuration re-measured on
    another night (same parameters, maybe another trial id) has the same key.
    """

    def canonical(text: object) -> Optional[str]:
        if not isinstance(text, str):
            return None
        params = json.loads(text)
        return json.dumps({k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in params.items()},
                          sort_keys=True)

    if "params_json" not in df.columns:
        raise KeyError("no column 'params_json' in the trials frame")
    return df["params_json"].map(canonical).rename("config")


def best_per_gpu(df: pd.DataFrame, objective: str = "output_throughput_per_gpu", direction: Optional[str] = None,
                 constraints: Sequence[ConstraintLike] = ()) -> pd.DataFrame:
    """The best completed trial per GPU type that meets every constraint, one row per ``gpu``.

    ``direction`` defaults to the metric's natural one (higher is better for
    throughputs). GPU types where no trial qualifies are absent. The index is the GPU type.
    """
    (name, resolved), = normalize_objectives([objective if direction is None else (objective, direction)])
    if "gpu" not in df.columns:
        raise KeyError("no column 'gpu' in the trials frame")
    best = []
    for _, group in df.groupby("gpu", sort=True):
        ranked = best_under_slos(group, name, resolved, constraints)
        if len(ranked):
            best.append(ranked.iloc[0])
    if not best:
        return df.iloc[0:0].set_index("gpu")
    return pd.DataFrame(best).set_index("gpu")


def config_history(df: pd.DataFrame, config: Union[str, dict], metrics: Sequence[str] = (
        "output_throughput_per_gpu", "ttft_p99_ms", "tpot_p99_ms")) -> pd.DataFrame:
    """Every measurement of one configuration across runs (nights), oldest first.

    ``config``: a trial id (its configuration is looked up) or a dict of the searched
    parameters. Returns ``date``, ``run_id``, ``trial_id``, ``status`` and ``metrics``.
    """
    keys = config_key(df)
    if isinstance(config, str):
        match = df.index[df["trial_id"] == config]
        if len(match) == 0:
            raise KeyError(f"no trial {config!r} in the frame")
        wanted = keys.loc[match[0]]
    else:
        wanted = config_key(pd.DataFrame({"params_json": [json.dumps(config)]})).iloc[0]
    rows = df[keys == wanted]
    cols = [c for c in ("date", "run_id", "trial_id", "status") if c in df.columns]
    cols += [m for m in metrics if m in df.columns and m not in cols]
    return rows.sort_values("started_at", kind="stable")[cols].reset_index(drop=True)


def capacity_by_night(df: pd.DataFrame, metric: str = "output_throughput_per_gpu",
                      constraints: Sequence[ConstraintLike] = (), by: str = "date") -> pd.DataFrame:
    """A configuration-by-night table of ``metric`` for configurations measured on two or more nights.

    Rows: configurations (their parameters as JSON, see :func:`config_key`); columns:
    the values of ``by`` (``date`` or ``run``), oldest first; a cell is the best value
    that night among completed trials meeting ``constraints`` (NaN where none did).
    """
    if by not in df.columns:
        raise KeyError(f"no column {by!r} in the trials frame")
    ok = df[feasible_mask(df, constraints)].copy()
    ok["config"] = config_key(ok)
    ok[metric] = pd.to_numeric(ok[metric], errors="coerce")
    (_, direction), = normalize_objectives([metric])
    agg = "max" if direction == "maximize" else "min"
    table = ok.pivot_table(index="config", columns=by, values=metric, aggfunc=agg)
    table = table[sorted(table.columns)]
    return table[table.notna().sum(axis=1) >= 2]


def param_importance(df: pd.DataFrame, objective: str, direction: Optional[str] = None, *,
                     params: Optional[Sequence[str]] = None, constraints: Sequence[ConstraintLike] = (),
                     space=None, evaluator=None) -> pd.Series:
    """Which parameter matters most for ``objective``: Optuna's importance, largest first (sums to 1).

    An Optuna study is rebuilt from the completed rows (meeting ``constraints``), with
    the objective as a loss (smaller is better), and handed to
    :func:`optuna.importance.get_param_importances`. The default evaluator is Optuna's
    PED-ANOVA (numpy only): how much each parameter matters for reaching the best
    ``target_quantile`` of trials, a quantile chosen so that about five trials are in it
    (between 10% and 50%). ``evaluator=optuna.importance.FanovaImportanceEvaluator()``
    works too where scikit-learn is installed. Parameter distributions come from
    ``space`` (a :class:`~orchestrator.study.space.SearchSpace`, e.g. ``study.space``) or,
    without it, from the values seen. Fixed parameters and parameters with one value
    are left out. Raises ``ValueError`` with fewer than two usable trials.
    """
    # deferred: optuna is slow to import; only this question needs it (validate/show load this module)
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    (name, resolved), = normalize_objectives([objective if direction is None else (objective, direction)])
    cand, values = _candidates(df, [(name, resolved)], constraints)
    keep = cand["params_json"].map(lambda p: isinstance(p, str)).to_numpy(dtype=bool)  # a damaged row has none
    cand, values = cand[keep], values[keep]
    trial_params = [json.loads(p) for p in cand["params_json"]]
    names = list(params) if params is not None else sorted({k for p in trial_params for k in p})

    def distribution(param: str):
        seen = [p[param] for p in trial_params if param in p]
        if space is not None:
            spec = space.params.get(param)
            kind = getattr(spec, "type", None)
            if kind == "int":
                return IntDistribution(spec.low, spec.high, log=spec.log, step=spec.step)
            if kind == "float":
                return FloatDistribution(spec.low, spec.high, log=spec.log, step=spec.step)
            if kind == "categorical":
                return CategoricalDistribution(spec.choices)
            return None  # fixed or unknown: nothing to attribute
        distinct = sorted(set(seen), key=repr)
        if len(distinct) < 2:
            return None
        if all(isinstance(v, int) and not isinstance(v, bool) for v in seen):
            return IntDistribution(min(seen), max(seen))
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen):
            return FloatDistribution(float(min(seen)), float(max(seen)))
        return CategoricalDistribution(distinct)

    dists = {n: d for n in names if (d := distribution(n)) is not None}
    if len(cand) < 2 or not dists:
        raise ValueError(f"parameter importance needs at least two completed trials with a varied parameter "
                         f"(got {len(cand)} trial(s), parameters: {sorted(dists) or 'none'})")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rebuilt = optuna.create_study(direction="minimize")
    for p, loss in zip(trial_params, to_losses(values, [resolved])[:, 0]):
        present = {k: v for k, v in p.items() if k in dists}
        rebuilt.add_trial(optuna.trial.create_trial(
            params=present, distributions={k: dists[k] for k in present}, value=float(loss)))
    if evaluator is None:
        quantile = min(0.5, max(0.1, 5 / len(cand)))
        evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    scores = optuna.importance.get_param_importances(rebuilt, evaluator=evaluator)
    return pd.Series(scores, name=f"importance for {resolved} {name}", dtype=float).sort_values(ascending=False)
