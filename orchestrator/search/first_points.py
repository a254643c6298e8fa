"""The points a study tries before its sampler draws: the probe's baseline, the study's
``search.initial_points`` and the best points of earlier results (``search.warm_start``).

Each is enqueued on the searcher's Optuna study, which hands them out first, in order.
"""

from __future__ import annotations

from orchestrator.search.warm_start import load_frames, warm_start_points
from orchestrator.study.spec import Study


def enqueue_probe_baseline(study: Study, searcher, *, resumed: bool) -> None:
    """With a probe, the baseline configuration runs first, so later trials have a reference
    (its searched engine arguments fixed, the other parameters drawn as usual)."""
    if resumed or study.probe is None or study.search.sampler == "grid" or study.search.stages:
        return
    point = {k: v for k, v in study.probe.reference().items()
             if k in study.space.params and study.space.params[k].allows(v)}
    if point:
        searcher._ot_study.enqueue_trial(baseline_point(study, point), skip_if_exists=True)  # noqa: SLF001


def baseline_point(study: Study, point: dict) -> dict:
    """The first of ``search.initial_points`` that is the baseline (the same value for every
    sampled argument of ``point``), else ``point``: an initial point that names the baseline runs
    first as it is, and no second baseline with the other parameters drawn at random runs before it
    (``enqueue_initial_points`` then skips it as already enqueued)."""
    sampled_names = set(study.space.sampled_names())
    sampled = [k for k in point if k in sampled_names]
    for p in study.search.initial_points or ():
        if all(k in p and p[k] == point[k] for k in sampled):
            return dict(p)
    return point


def enqueue_initial_points(study: Study, searcher, *, resumed: bool) -> None:
    """``search.initial_points``: tried first, in order (once per study: not again on resume)."""
    if resumed or not study.search.initial_points:
        return
    ostudy = searcher._ot_study  # noqa: SLF001 - OptunaSearch keeps it there
    for point in study.search.initial_points:
        ostudy.enqueue_trial(dict(point), skip_if_exists=True)


def enqueue_warm_start(study: Study, searcher) -> int:
    """``search.warm_start``: earlier results' best points, mapped into this space, tried first."""
    if not study.search.warm_start:
        return 0
    # deferred: optuna is slow to import; validate/show load this module
    from optuna.trial import TrialState

    ostudy = searcher._ot_study  # noqa: SLF001 - OptunaSearch keeps it there
    existing = [t.system_attrs.get("fixed_params", t.params) for t in ostudy.get_trials(deepcopy=False)
                if t.state != TrialState.FAIL]
    points = warm_start_points(study, load_frames(study.search.warm_start), existing)
    for p in points:
        ostudy.enqueue_trial(p, user_attrs={"warm_start": True}, skip_if_exists=False)
    return len(points)
