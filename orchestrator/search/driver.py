"""The study driver: Ray Tune runs trials, an Optuna sampler proposes them.

Before anything starts, the pre-flight model surveys the whole space: a study none of
whose configurations can start stops with a report of why (:class:`StudyStopped`).
Optuna's study lives in a ``JournalStorage`` file next to the results, so a study
killed mid-run continues where it stopped (see :mod:`orchestrator.search.resume`: rows are
the record, the journal is brought in line with them, interrupted trials run again,
left-over Ray processes and Serve apps are removed). Constraint values reach the
sampler through ``Trial.set_constraint`` before the trial is told
(:mod:`orchestrator.search.optuna_search`), so it learns where the infeasible region is.

Faults end a study cleanly: a trial whose process is lost (a node died) is run again
up to ``budget.trial_retries`` times, then recorded as an ``error`` row; a result that
cannot be written (disk full) stops the study with a message, keeping everything
recorded so far for the next start.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Optional

from orchestrator.cluster.connect import NAMESPACE, cluster_info, engine_resource, ensure_ray, local_ray, start_serve
from orchestrator.cluster.gpu_ledger import GpuLedgerActor
from orchestrator.failures import TrialStatus, root_message, storage_problem
from orchestrator.results.store import ResultsStore
from orchestrator.search import best_capacity, feasibility
from orchestrator.search.fidelity.part import FidelityPart, PredictionWriter
from orchestrator.search.fidelity.search import FidelitySearch, study_metrics
from orchestrator.search.first_points import enqueue_initial_points, enqueue_probe_baseline, enqueue_warm_start
from orchestrator.search.optuna_search import searcher_class
from orchestrator.search.progress import ProgressPrinter
from orchestrator.search.parts import FinishedGrid, SearchPart
from orchestrator.search.racing import Racer, RacingPart
from orchestrator.search.stop_signals import StudyInterrupted, ending, rearm
from orchestrator.search.stop_signals import check as check_stop  # the driver's checkpoints
from orchestrator.search.reconcile import reconcile
from orchestrator.search.resume import (RunInProgress, RunLock, RunState, RunStatus, check_state, cleanup_apps,
                                        dead_run_ids, drop_orphan_requests, end_run_now, process_identity,
                                        stop_orphans)
from orchestrator.search.samplers import make_sampler
from orchestrator.search.screening import PreflightScreen, trimmed_space
from orchestrator.search.stages import StagedSearch
from orchestrator.search.state import local_state_dir, new_run_id, optuna_storage, optuna_study_name
from orchestrator.search.trial_plan import engine_for
from orchestrator.search.tune import (ResultsSinkActor, filter_tune_logs, lost_trial_recorder, tune_trainable,
                                     write_failure_stopper)
from orchestrator.study.spec import Study
from orchestrator.trial.run import TrialContext

log = logging.getLogger(__name__)

EXIT_STOPPED = 1


class StudyStopped(Exception):
    """The study cannot go on; ``str(e)`` says why and what to do (no traceback needed)."""

    def __init__(self, message: str, exit_code: int = EXIT_STOPPED):
        super().__init__(message)
        self.exit_code = exit_code


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
    retried: list[int] = field(default_factory=list)  # Optuna trial numbers interrupted before and queued again
    planned: int = 0  # trials this run set out to run (0: the budget was already spent)
    lost: int = 0  # trials whose process was lost for good (recorded as error rows)
    gpu_peaks: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (most leased at once, size)


def run_study(study: Study, *, address: Optional[str] = None, serve_port: int = 8000, resume: bool = True,
              quiet: bool = False, max_trials: Optional[int] = None) -> StudyRun:
    """Run (or resume) the study; returns where the results are. Raises :class:`StudyStopped`."""

    t_start = time.monotonic()
    survey_text = None
    drop: dict = {}
    if feasibility.survey_applies(study):
        cpu = study.on_cpu
        found = feasibility.survey(study, cluster_units=None if cpu else study.hardware.total_gpus,
                                   units_per_node=None if cpu else study.hardware.gpus_per_node)
        if found.all_infeasible:
            raise StudyStopped(f"study {study.name}: " + found.report())
        drop = found.droppable() if feasibility.preflight_on(study) else {}  # switched off: the engine's start decides
        survey_text = found.report(trimmed=bool(drop)) if found.never else None
    state_dir = local_state_dir(study)
    check_state(state_dir)  # raises DamagedState: a file where a folder belongs, or the reverse
    stop_orphans(state_dir)
    fingerprint = study.fingerprint()
    previous = RunState.latest_unfinished(state_dir, fingerprint) if resume else None
    run = previous or RunState(new_run_id(study), RunStatus.RUNNING, datetime.now(timezone.utc).isoformat(),
                               study.budget.trials, fingerprint)
    try:
        lock = RunLock(state_dir, run.run_id).acquire()
    except RunInProgress:
        raise StudyStopped(f"run {run.run_id} of study {study.name} is being run by another process; wait for it, "
                           "or start a separate run with --new-run") from None
    try:
        return _drive(study, run, resumed=previous is not None, state_dir=state_dir, address=address,
                      survey_text=survey_text, drop=drop,
                      serve_port=serve_port, quiet=quiet, max_trials=max_trials, t_start=t_start)
    finally:
        lock.release()


def _drive(study: Study, run: RunState, *, resumed: bool, state_dir: Path, address: Optional[str],
           survey_text: Optional[str] = None, drop: Optional[dict] = None,
           serve_port: int, quiet: bool, max_trials: Optional[int], t_start: float) -> StudyRun:
    import ray

    store = ResultsStore(study.output, study.name)
    run.driver_pid = os.getpid()
    run.save(state_dir)
    storage = optuna_storage(state_dir)
    ostudy_name = optuna_study_name(study)
    fixed = reconcile(study, storage, ostudy_name, store.read_trials())
    drop_orphan_requests(store, run.run_id)
    done = _budget_used(store, run.run_id)
    remaining = run.budget_trials - done
    if max_trials is not None:
        remaining = min(remaining, max_trials)
    printer = ProgressPrinter(study.without_secrets(), total=run.budget_trials, already_done=done, quiet=quiet)
    if done:
        printer.recorded(store.read_trials(run_id=run.run_id))
    printer.header(run.run_id, resumed=resumed, stale=len(fixed.retried), state_dir=str(state_dir),
                   recovered=len(fixed.told_from_rows))
    if survey_text:
        printer.note(survey_text)
    if remaining <= 0:
        run.status = RunStatus.FINISHED
        run.save(state_dir)
        return _summary(store, run, resumed, 0, t_start, retried=fixed.retried)

    engine = engine_for(study)
    try:
        started_here = ensure_ray(study.engine.kind, gpus_per_node=study.hardware.gpus_per_node,
                                  max_concurrent_trials=study.budget.max_concurrent_trials, address=address)
    except Exception as e:  # noqa: BLE001 - an environment problem, not a bug: say so in one line
        raise StudyStopped(f"study {study.name} stopped: could not start or reach Ray ({root_message(e)}).\n"
                           "  Nothing was lost; run the same command again to resume.") from None
    rearm()  # Ray's own SIGTERM handler would abort the driver: a stop goes through the study's instead
    check_stop()
    if started_here:
        mine = local_ray()
        if mine is not None:
            run.ray_session = mine.session_dir
            run.ray_procs = [ident for pid in mine.pids if (ident := process_identity(pid)) is not None]
            run.save(state_dir)
    try:
        outcome = _tune(study, run, engine, store, state_dir, storage, ostudy_name, printer,
                        space=trimmed_space(study, drop or {}, storage, ostudy_name),
                        serve_port=serve_port, remaining=remaining, started_here=started_here, resumed=resumed)
    except StudyInterrupted as e:
        e.running = printer.running  # the trials stopped in flight: marked interrupted, they run again on resume
        try:
            reconcile(study, storage, ostudy_name, store.read_trials())
        except Exception as problem:  # noqa: BLE001 - the next run marks them; the stop still ends in one line
            log.warning("the trials in flight are marked at the next run: %s", root_message(problem))
        raise
    finally:
        if started_here:
            ray.shutdown()  # takes Serve and every replica with it
            run.ray_procs = []
    n_done = _budget_used(store, run.run_id)
    if outcome.stop_message:
        run.save(state_dir, must=False)  # still RUNNING: the same command resumes
        raise StudyStopped(outcome.stop_message)
    if n_done >= run.budget_trials or max_trials is None:
        run.status = RunStatus.FINISHED
    run.save(state_dir)
    printer.finish(store.read_trials(run_id=run.run_id))
    result = _summary(store, run, resumed, n_done - done, t_start, retried=fixed.retried)
    result.lost, result.gpu_peaks, result.planned = outcome.lost, outcome.gpu_peaks, remaining
    return result


@dataclass
class _TuneOutcome:
    stop_message: Optional[str] = None
    lost: int = 0
    gpu_peaks: dict[str, tuple[int, int]] = field(default_factory=dict)


def _tune(study: Study, run: RunState, engine, store, state_dir: Path, storage, ostudy_name: str, printer, *,
          space, serve_port: int, remaining: int, started_here: bool, resumed: bool) -> _TuneOutcome:
    info = cluster_info(engine_resource(study.engine.kind, study.on_cpu), started_locally=started_here,
                        serve_port=serve_port)
    if engine.serves_http:
        _check_cluster_fits(study, engine, info)
    if engine.deploys_on_serve:
        serve_port = start_serve(serve_port)
        # Left by killed drivers on a cluster that outlived them, this run's own included when it resumes one
        # (no trial of it runs yet: an application of it is a dead driver's, and its engine is still up).
        cleanup_apps(dead_run_ids(state_dir, run.run_id))
    sink, ledger, ctx = _run_actors(study, run, engine, info, serve_port)
    concurrency = study.budget.max_concurrent_trials
    if engine.serves_http and info.total_units > 0:
        concurrency = min(concurrency, info.total_units)

    # What Tune pickles into its experiment (searcher, callbacks) gets the study without its secrets.
    recorded = study.without_secrets()
    searcher = searcher_class()(
        space=space.suggest, metric=[o.metric for o in study.objectives],
        mode=["max" if d == "maximize" else "min" for d in study.directions],
        sampler=make_sampler(recorded), study_name=ostudy_name, storage=storage,
        parts=_search_parts(recorded, store, space, remaining, printer, sink, ctx),
    )
    enqueue_probe_baseline(study, searcher, resumed=resumed)
    enqueue_initial_points(study, searcher, resumed=resumed)
    enqueue_warm_start(study, searcher)
    stopper = write_failure_stopper()
    recorder = lost_trial_recorder(recorded, run.run_id, ctx.sink_name, NAMESPACE)
    tuner = _tuner(study, run, state_dir, ctx, searcher, remaining=remaining, concurrency=concurrency,
                   stopper=stopper, callbacks=[printer.tune_callback(), recorder])
    printer.start(concurrency=concurrency, cluster=info)
    filter_tune_logs()
    out = _TuneOutcome()
    # A stop signal ends the run's engines at once, whatever becomes of the driver next (stop_signals.ending).
    stop_ends = ending(partial(end_run_now, run.run_id, sink)) if engine.deploys_on_serve else nullcontext()
    try:
        with stop_ends:
            tuner.fit()
        check_stop()  # a stop signal ended Tune's loop (its stopper): the run stops here
    except Exception as e:  # noqa: BLE001 - a full disk ends the study with a message, anything else is a bug
        problem = storage_problem(e)
        if problem is None:
            raise
        out.stop_message = _stopped_text(study, store, run, f"cannot write the study's state ({problem})")
    finally:
        out.gpu_peaks = _end_run_actors(run, engine, sink, ledger)
    out.lost = recorder.lost
    if stopper.message and out.stop_message is None:
        out.stop_message = _stopped_text(study, store, run, f"results could not be written ({stopper.message})")
    return out


def _run_actors(study: Study, run: RunState, engine, info, serve_port: int):
    """The run's writer and (for engines that lease GPUs) its GPU ledger, both on the driver's node, and
    the context every trial gets: ``(sink, ledger or None, TrialContext)``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    suffix = run.run_id.replace("-", "")[-10:]
    node_id = ray.get_runtime_context().get_node_id()
    sink_name = f"results-sink-{study.name}-{suffix}"
    sink = ray.remote(ResultsSinkActor).options(
        name=sink_name, namespace=NAMESPACE, num_cpus=0, lifetime=None,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote(study.output, study.name, study.space.column_types(),
             tuple(study_metrics(study)) if study.search.fidelity == "sim" else ())
    ledger_name = ledger = None
    if engine.serves_http and info.total_units > 0:
        ledger_name = f"gpu-ledger-{study.name}-{suffix}"
        ledger = ray.remote(GpuLedgerActor).options(
            name=ledger_name, namespace=NAMESPACE, num_cpus=0, max_concurrency=1000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(info.resource, info.units_per_node)
    ctx = TrialContext(run_id=run.run_id, namespace=NAMESPACE, ledger_name=ledger_name, sink_name=sink_name,
                       cluster_units=info.total_units if engine.serves_http else None,
                       units_per_node=info.largest_node if engine.serves_http else None,
                       serve_port=serve_port)
    return sink, ledger, ctx


def _end_run_actors(run: RunState, engine, sink, ledger) -> dict[str, tuple[int, int]]:
    """The run's applications deleted, its writer and ledger ended; the ledger's GPU peaks (empty without one)."""
    import ray

    peaks: dict[str, tuple[int, int]] = {}
    if ledger is not None:
        try:
            peaks = ray.get(ledger.peaks.remote(), timeout=30)
        except Exception:  # noqa: BLE001
            pass
    if engine.deploys_on_serve:
        cleanup_apps([run.run_id])
    for actor in (ledger, sink):
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
    return peaks


def _tuner(study: Study, run: RunState, state_dir: Path, ctx: TrialContext, searcher, *, remaining: int,
           concurrency: int, stopper, callbacks: list):
    from ray import tune

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our progress lines replace Tune's tables
    # The study's rows are its results: Tune's own per-trial CSV, JSON and TensorBoard files would be
    # written on every report and never read, and its TensorBoard logger imports torch (~2 CPU-s a run).
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    trainable = tune.with_resources(tune.with_parameters(tune_trainable, study=study, ctx=ctx), {"cpu": 0.25})
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=remaining, max_concurrent_trials=concurrency,
                                    # A reused trial process keeps its imports and request set: one
                                    # process start per trial less (the replica is new every trial).
                                    time_budget_s=study.budget.wall_time_s, reuse_actors=True),
        run_config=tune.RunConfig(name=f"{run.run_id}-{int(time.time())}", storage_path=str(state_dir / "_tune"),
                                  verbose=0, stop=stopper, log_to_file=True,
                                  failure_config=tune.FailureConfig(max_failures=study.budget.trial_retries),
                                  callbacks=callbacks),
    )


def _search_parts(study: Study, store, space, remaining: int, printer, sink, ctx: TrialContext) -> list[SearchPart]:
    """The parts of the run's search (:mod:`orchestrator.search.parts`), in the order they queue trials (the
    first to queue has its trial measured first): racing's turn, a stage's held parameters, the fidelity
    search's pick. Each has taken in the rows a resumed run recorded before."""
    parts: list[SearchPart] = []
    if study.search.sampler == "grid":
        parts.append(FinishedGrid(space))
    racer = Racer.for_study(study, remaining)  # search.remeasure
    if racer is not None:
        parts.append(RacingPart(racer))
    if study.search.stages:
        parts.append(StagedSearch(study))
    if feasibility.preflight_on(study):
        parts.append(PreflightScreen(study, engine_for(study), ctx.run_id, sink, printer,
                                     cluster_units=ctx.cluster_units, units_per_node=ctx.units_per_node))
    fidelity = None
    if study.search.fidelity == "sim":
        fidelity = FidelitySearch(study, note=printer.note, record=PredictionWriter(sink, ctx.run_id))
        parts.append(FidelityPart(fidelity))
    if best_capacity.applies(study):  # capacity.stop_below_best
        parts.append(best_capacity.BestCapacity(study))
    # Only the calibration fits a capacity trial's levels.
    levels = store.read_levels() if fidelity is not None and study.capacity is not None else None
    trials = store.read_trials()
    for part in parts:
        part.observe_rows(trials, levels)
    if fidelity is not None:
        _prepare_fidelity(study, fidelity)
    return parts


def _prepare_fidelity(study: Study, fidelity: FidelitySearch) -> None:
    """``search.fidelity: sim``: the space scored by the simulator before the first real trial."""
    try:
        fidelity.prepare()
    except (KeyError, FileNotFoundError, ValueError) as e:
        raise StudyStopped(f"study {study.name}: search.fidelity sim: the simulator cannot score this study "
                           f"({root_message(e)}); use search.fidelity: real") from None


def _check_cluster_fits(study: Study, engine, info) -> None:
    """Stop before the first trial when no configuration of the space could ever be placed on this
    cluster (no GPUs at all, or TP x PP larger than every node): each trial would only wait out its
    start timeout."""
    needs = []
    for params in feasibility.space_points(study.space, study.seed, max_points=512)[0]:
        try:
            req = engine.resources(engine.resolve(study.engine_args(params)))
        except (ValueError, TypeError):
            continue
        needs.append(req.amount)
    needs = [n for n in needs if n > 0]
    if not needs or min(needs) <= info.largest_node:
        return
    have = (f"its largest node has {info.largest_node} {info.resource}" if info.largest_node
            else f"Ray sees no {info.resource} in it")
    advice = ("start one whose nodes have enough: `ray start --head --num-gpus N` on a GPU machine, or for the "
              "simulated engine logical GPUs: `NUM_GPUS=N clusters/local.sh start`"
              if info.resource == "GPU" else "give its nodes more CPUs (`ray start --num-cpus N`)")
    if info.resource == "GPU" and study.engine.kind == "vllm":
        advice += "; or, for vLLM's CPU build, `hardware.gpu: CPU`"
    raise StudyStopped(f"study {study.name} stopped before any trial: every configuration needs at least "
                       f"{min(needs)} {info.resource} on one node, but {have}.\n  Nothing was run; {advice}, "
                       "then run the same command again.")


def _budget_used(store, run_id: str) -> int:
    """Trials of the run that count against its budget: every row but the pruned (a configuration
    the pre-flight turned away never started, and took no trial)."""
    rows = store.read_trials(run_id=run_id)
    return int((rows["status"] != TrialStatus.PRUNED).sum()) if len(rows) else 0


def _stopped_text(study: Study, store, run: RunState, why: str) -> str:
    try:
        n = len(store.trial_ids(run_id=run.run_id))
    except Exception:  # noqa: BLE001
        n = "?"
    return (f"study {study.name} stopped: {why}.\n"
            f"  {n} of {run.budget_trials} trials of run {run.run_id} are recorded; trials that were running "
            "will run again.\n  Free space (or fix the output location) and run the same command again to resume.")


def _summary(store, run: RunState, resumed: bool, n: int, t_start: float, *, retried: list[int]) -> StudyRun:
    study_dir = store.study_path
    return StudyRun(run_id=run.run_id, study_dir=study_dir, trials_dir=f"{study_dir}/trials",
                    requests_dir=f"{study_dir}/requests", resumed=resumed, trials_run=n,
                    elapsed_s=time.monotonic() - t_start, retried=list(retried))
