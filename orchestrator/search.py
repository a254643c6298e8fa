"""The study driver: Ray Tune runs trials, an Optuna sampler proposes them.

Optuna's study lives in a ``JournalStorage`` file next to the results, so a study
killed mid-run continues where it stopped (finished trials are in the journal
and in Parquet; trials left RUNNING are marked failed and tried again), and
optuna-dashboard can open it. Constraint values reach the sampler through
``Trial.set_constraint`` before the trial is told, so it learns where the
infeasible region is.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from orchestrator.study import Study
from orchestrator.trial import TrialContext, execute_trial, optuna_values

log = logging.getLogger(__name__)

TRIAL_NUMBER_KEY = "__trial_number"
CONSTRAINT_PREFIX = "constraint__"


# ------------------------------------------------------------------ samplers
def make_sampler(study: Study):
    import optuna

    s = study.search
    seed = study.seed
    concurrent = study.budget.max_concurrent_trials > 1
    startup = s.n_startup_trials
    if startup is None:
        startup = max(4, min(10, study.budget.trials // 4))
    if s.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True,
                                          constant_liar=concurrent)
    if s.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, study.budget.trials // 4)))
    if s.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.sampler == "grid":
        return optuna.samplers.BruteForceSampler(seed=seed)
    raise ValueError(f"unknown sampler {s.sampler!r}")


def _searcher_class():
    from ray.tune.search.optuna import OptunaSearch

    class ConstrainedOptunaSearch(OptunaSearch):
        """OptunaSearch that passes the trial number down and constraint values up."""

        def suggest(self, trial_id: str):
            config = super().suggest(trial_id)
            if config is None:
                return None
            return {**config, TRIAL_NUMBER_KEY: self._ot_trials[trial_id].number}

        def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False):
            ot_trial = self._ot_trials.get(trial_id)
            if ot_trial is not None and result:
                for key, value in result.items():
                    if key.startswith(CONSTRAINT_PREFIX):
                        ot_trial.set_constraint(key[len(CONSTRAINT_PREFIX):], float(value))
            super().on_trial_complete(trial_id, result=result, error=error)

    return ConstrainedOptunaSearch


# ------------------------------------------------------------------ run state
@dataclass
class RunState:
    """``<output>/<study>/_runs/<run_id>.json``: lets a killed run resume under the same id."""

    run_id: str
    status: str  # running | finished
    started_at: str
    budget_trials: int
    fingerprint: str

    @staticmethod
    def path(study_dir: Path, run_id: str) -> Path:
        return study_dir / "_runs" / f"{run_id}.json"

    def save(self, study_dir: Path) -> None:
        p = self.path(study_dir, self.run_id)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name("." + p.name + ".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2))
        os.replace(tmp, p)

    @classmethod
    def latest_unfinished(cls, study_dir: Path, fingerprint: str) -> Optional["RunState"]:
        runs = []
        for p in sorted((study_dir / "_runs").glob("*.json")):
            try:
                st = cls(**json.loads(p.read_text()))
            except Exception:  # noqa: BLE001 - a damaged state file just is not resumed
                continue
            if st.status == "running" and st.fingerprint == fingerprint:
                runs.append(st)
        return runs[-1] if runs else None


def new_run_id(study: Study) -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4]


def local_state_dir(study: Study) -> Path:
    """Where the Optuna journal and Tune's experiment live (a local path, even for s3:// output)."""
    if "://" in study.output and not study.output.startswith("file://"):
        base = Path(os.environ.get("ORCHESTRATOR_STATE_DIR", Path.home() / ".cache" / "orchestrator"))
    else:
        base = Path(study.output.removeprefix("file://"))
    return (base / study.name).resolve()


def optuna_storage(state_dir: Path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    state_dir.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(state_dir / "optuna.journal")))


def optuna_study_name(study: Study) -> str:
    return f"{study.name}-{study.fingerprint()}"


def recover_stale_trials(storage, study_name: str) -> int:
    """Trials left RUNNING by a killed driver: mark them failed and queue their parameters again."""
    import optuna
    from optuna.trial import TrialState

    try:
        ostudy = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0
    stale = [t for t in ostudy.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    for t in stale:
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # noqa: SLF001 - no public API for this
        if t.params:
            ostudy.enqueue_trial(t.params, skip_if_exists=False)
    return len(stale)


# ------------------------------------------------------------------ the trainable
def tune_trainable(config: dict, *, study: Study, ctx: TrialContext) -> None:
    """Runs inside a Tune trial actor: execute, write the rows, report to Tune/Optuna."""
    import ray
    from ray import tune

    from orchestrator.engines.serve_app import SERVE_PORT_ENV

    os.environ[SERVE_PORT_ENV] = str(ctx.serve_port)  # this trial actor's Serve proxy port
    number = int(config[TRIAL_NUMBER_KEY])
    params = {k: v for k, v in config.items() if k != TRIAL_NUMBER_KEY}
    trial_id = f"{ctx.run_id}-{number:04d}"
    outcome = execute_trial(study, params, trial_id=trial_id, trial_number=number, ctx=ctx)
    if ctx.sink_name:
        sink = ray.get_actor(ctx.sink_name, namespace=ctx.namespace)
        from orchestrator.results.schema import requests_to_table

        table = requests_to_table(outcome.records, study=study.name, run_id=ctx.run_id, trial_id=trial_id)
        ray.get(sink.write.remote(outcome.row, table))
    tune.report(tune_metrics(study, outcome.row))


def tune_metrics(study: Study, row: dict) -> dict[str, Any]:
    values, constraints = optuna_values(study, row)
    out: dict[str, Any] = {o.metric: v for o, v in zip(study.objectives, values)}
    out.update({CONSTRAINT_PREFIX + k: v for k, v in constraints.items()})
    out["status"] = row["status"]
    out["tid"] = row["trial_id"]  # Tune owns the key "trial_id"
    out["feasible"] = bool(row.get("feasible"))
    out["failure_kind"] = row.get("failure_kind") or ""
    for c in study.constraints:
        v = row.get(c.metric)
        out["m__" + c.metric] = float(v) if v is not None else float("nan")
    return out


class ResultsSinkActor:
    """The single writer of a run's Parquet files, on the driver's node."""

    def __init__(self, output: str, study_name: str, param_types: dict[str, str]):
        from orchestrator.results.store import ResultsStore

        self.store = ResultsStore(output, study_name)
        self.param_types = param_types

    def write(self, row: dict, requests_table) -> None:
        self.store.write_trial(row, requests_table, param_types=self.param_types)


# ------------------------------------------------------------------ the driver
@dataclass
class StudyRun:
    run_id: str
    study_dir: str
    trials_dir: str
    requests_dir: str
    resumed: bool
    trials_run: int
    elapsed_s: float


def run_study(study: Study, *, address: Optional[str] = None, serve_port: int = 8000, resume: bool = True,
              quiet: bool = False, max_trials: Optional[int] = None) -> StudyRun:
    """Run (or resume) the study; returns where the results are."""
    import ray
    from ray import tune

    from orchestrator.engines.base import create_engine
    from orchestrator.progress import ProgressPrinter
    from orchestrator.results.store import ResultsStore
    from orchestrator.runtime import NAMESPACE, cluster_info, ensure_ray, start_serve
    from orchestrator.scheduling import GpuLedgerActor

    t_start = time.monotonic()
    state_dir = local_state_dir(study)
    store = ResultsStore(study.output, study.name)
    fingerprint = study.fingerprint()

    previous = RunState.latest_unfinished(state_dir, fingerprint) if resume else None
    if previous is not None:
        run = previous
    else:
        run = RunState(new_run_id(study), "running", datetime.now(timezone.utc).isoformat(),
                       study.budget.trials, fingerprint)
    run.save(state_dir)
    done_ids = store.trial_ids(run_id=run.run_id)
    remaining = run.budget_trials - len(done_ids)
    if max_trials is not None:
        remaining = min(remaining, max_trials)

    storage = optuna_storage(state_dir)
    ostudy_name = optuna_study_name(study)
    stale = recover_stale_trials(storage, ostudy_name)
    printer = ProgressPrinter(study, total=run.budget_trials, already_done=len(done_ids), quiet=quiet)
    printer.header(run.run_id, resumed=previous is not None, stale=stale, state_dir=str(state_dir))

    if remaining <= 0:
        run.status = "finished"
        run.save(state_dir)
        return _summary(study, store, run, previous is not None, 0, t_start)

    engine = create_engine(study)
    started_here = ensure_ray(study, address=address)
    info = cluster_info(study, started_locally=started_here, serve_port=serve_port)
    if engine.serves_http:
        serve_port = start_serve(serve_port)

    suffix = run.run_id.replace("-", "")[-10:]
    ledger_name = sink_name = None
    ledger = sink = None
    node_id = ray.get_runtime_context().get_node_id()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sink_name = f"results-sink-{study.name}-{suffix}"
    sink = ray.remote(ResultsSinkActor).options(
        name=sink_name, namespace=NAMESPACE, num_cpus=0, lifetime=None,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(study.output, study.name, study.space.column_types())
    if engine.serves_http and info.total_units > 0:
        ledger_name = f"gpu-ledger-{study.name}-{suffix}"
        ledger = ray.remote(GpuLedgerActor).options(
            name=ledger_name, namespace=NAMESPACE, num_cpus=0, max_concurrency=1000,
        ).remote(info.resource, info.units_per_node)

    ctx = TrialContext(run_id=run.run_id, namespace=NAMESPACE, ledger_name=ledger_name, sink_name=sink_name,
                       cluster_units=info.total_units if engine.serves_http else None,
                       units_per_node=info.largest_node if engine.serves_http else None,
                       serve_port=serve_port)
    concurrency = study.budget.max_concurrent_trials
    if engine.serves_http and info.total_units > 0:
        concurrency = min(concurrency, info.total_units)

    searcher = _searcher_class()(
        space=study.space.suggest, metric=[o.metric for o in study.objectives],
        mode=["max" if d == "maximize" else "min" for d in study.directions],
        sampler=make_sampler(study), study_name=ostudy_name, storage=storage,
    )
    _enqueue_warm_start(study, searcher, storage, ostudy_name)
    _enqueue_initial_points(study, searcher, resumed=previous is not None)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our progress lines replace Tune's tables
    trainable = tune.with_resources(tune.with_parameters(tune_trainable, study=study, ctx=ctx), {"cpu": 0.25})
    tune_dir = state_dir / "_tune"
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=remaining, max_concurrent_trials=concurrency,
                                    time_budget_s=study.budget.wall_time_s, reuse_actors=False),
        run_config=tune.RunConfig(name=f"{run.run_id}", storage_path=str(tune_dir), verbose=0,
                                  callbacks=[printer.tune_callback()], log_to_file=True),
    )
    printer.start(concurrency=concurrency, cluster=info)
    try:
        tuner.fit()
    finally:
        _cleanup_apps(run.run_id)
        for actor in (ledger, sink):
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001
                    pass
    n_done = len(store.trial_ids(run_id=run.run_id))
    if n_done >= run.budget_trials or max_trials is None:
        run.status = "finished"
        run.save(state_dir)
    result = _summary(study, store, run, previous is not None, n_done - len(done_ids), t_start)
    if started_here:
        ray.shutdown()  # takes Serve and every replica with it
    return result


def _cleanup_apps(run_id: str) -> None:
    """Delete Serve apps of this run that a killed trial left behind."""
    try:
        from ray import serve

        from orchestrator.engines.serve_app import delete_app

        for name in list(serve.status().applications):
            if name.startswith(f"tune-{run_id}"):
                delete_app(name, timeout_s=60)
    except Exception as e:  # noqa: BLE001
        log.warning("could not clean up Serve applications: %s", e)


def _enqueue_initial_points(study: Study, searcher, *, resumed: bool) -> None:
    """``search.initial_points``: tried first, in order (once per study: not again on resume)."""
    if resumed or not study.search.initial_points:
        return
    ostudy = searcher._ot_study  # noqa: SLF001 - OptunaSearch keeps it there
    for point in study.search.initial_points:
        ostudy.enqueue_trial(dict(point), skip_if_exists=True)


def _enqueue_warm_start(study: Study, searcher, storage, ostudy_name: str) -> None:
    """Try the best points of earlier result datasets first (search.warm_start)."""
    if not study.search.warm_start:
        return
    from orchestrator.results import load_trials, pareto_front

    points = []
    for path in study.search.warm_start:
        try:
            df = load_trials(path)
        except Exception as e:  # noqa: BLE001
            log.warning("warm start: cannot read %s: %s", path, e)
            continue
        front = pareto_front(df, study.objectives, study.constraints)
        for _, r in front.iterrows():
            params = json.loads(r["params_json"])
            points.append({k: v for k, v in params.items() if k in study.space.params})
    ostudy = searcher._ot_study  # noqa: SLF001 - OptunaSearch keeps it there
    for p in points[: max(1, study.budget.trials // 2)]:
        ostudy.enqueue_trial(p, skip_if_exists=True)


def _summary(study: Study, store, run: RunState, resumed: bool, n: int, t_start: float) -> StudyRun:
    study_dir = store.study_path
    return StudyRun(run_id=run.run_id, study_dir=study_dir, trials_dir=f"{study_dir}/trials",
                    requests_dir=f"{study_dir}/requests", resumed=resumed, trials_run=n,
                    elapsed_s=time.monotonic() - t_start)
