"""How the suite's modules are spread over the xdist workers (``./dev test``: four workers, two cores).

Two kinds of long module share the machine:
* the CPU vLLM modules (:data:`ENGINE_MODULES`) keep a core busy while they run (an engine
  start is ~20 s of imports; its worker process spins between steps). Two of them side by
  side each take twice as long, and time-sensitive checks (harness verdicts) start to fail;
* the served-simulator modules mostly wait: their engines answer in real time, so a study of
  90 s uses ~30 s of CPU.

So the engine modules are one unit of work (:data:`ENGINE_UNIT`), run one after another on
one worker, while the other workers take the rest, longest first, each module whole (its
module-scoped Ray cluster set up once). The served-simulator modules that each need nothing
but a local Ray with Serve are a unit too (:data:`SERVED_UNIT`): one after another on one
worker, on one cluster (conftest's ``shared_serve``) instead of one each, and so are the engine
unit's modules (conftest's ``engine_cluster``) and the in-process studies that need only a Ray for
Tune (:data:`RAY_UNIT`, conftest's ``unit_ray``). :data:`EXPECTED_S` holds rough wall
times measured in a three-worker run of a fresh clone; a module missing from it is short.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath

ENGINE_UNIT = "vllm-cpu-engines"
# In this order: the modules that judge latencies (test_vllm_cpu, test_vllm_cpu_sessions: SLOs on
# TTFT) where no :data:`BURSTY` module runs beside them (the probe's trained model runs second); all
# on one Ray (conftest's ``engine_cluster``).
ENGINE_MODULES = ("test_vllm_cpu.py", "test_vllm_cpu_trained.py", "test_vllm_cpu_sessions.py",
                  "test_engine_conformance.py", "test_vllm_cpu_serve_llm.py", "test_vllm_cpu_stop.py")

# The studies of the virtual simulator that need nothing but a local Ray for Tune, in process or as
# ``orchestrator run --address`` (conftest's ``unit_ray``): one Ray for all, one module after another.
RAY_UNIT = "local-ray-studies"
RAY_MODULES = ("test_search_fidelity.py", "test_unit_metrics.py", "test_nightly.py", "test_corrupt_results.py",
               "test_faults_disk.py", "test_preflight_default.py", "test_search_screening.py", "test_search_racing.py",
               "test_plan.py")

SERVED_UNIT = "served-simulator"
SERVED_MODULES = ("test_ties.py", "test_capacity_served.py", "test_harness_served.py", "test_warmup_served.py",
                  "test_sessions_served.py", "test_study_served.py", "test_sim_http.py", "test_decisions_served.py",
                  "test_stop_signals.py", "test_fuzz_runs.py")

EXPECTED_S = {
    "test_trained_model.py": 70, SERVED_UNIT: 380, RAY_UNIT: 400, "test_faults_cluster.py": 220,
    "test_study_e2e.py": 130, "test_jobs.py": 110, "test_resume_kill.py": 100,
    "test_study_inputs.py": 40, "test_damage_fuzz.py": 40,
    "test_query_docs.py": 20,
}


def unit_of(path: str) -> str:
    """The unit of work a test module belongs to: the engine unit, the served unit, the Ray unit, or the
    module itself."""
    name = PurePath(path).name
    if name in ENGINE_MODULES:
        return ENGINE_UNIT
    if name in RAY_MODULES:
        return RAY_UNIT
    return SERVED_UNIT if name in SERVED_MODULES else path


# Modules that make what the engine unit needs later: handed out first, so that another worker
# trains the probe's model (conftest's ``tiny_trained_model``) while the engine unit's first module runs.
EARLY = ("test_trained_model.py",)

# Modules that start many processes at once (a three-node cluster, five replicas starting together:
# ~40 CPU-s in as many seconds). Beside the engine unit's first module they starved its vLLM server
# for 5-15 s, and a trial's warm-up or a load level found the engine stalled (three failures of
# test_cpu_vllm_study, each while this module started its cluster). They are handed out once the
# other workers have been given about that module's time in longer modules (AFTER_S worker-seconds),
# beside the engine unit's second module, which judges no latency.
BURSTY = ("test_faults_cluster.py",)
AFTER_S = 3 * 150  # the three other workers x test_vllm_cpu.py's ~150 s


def _bursty_place() -> float:
    """The weight after which :data:`BURSTY` modules are handed out (see :data:`AFTER_S`)."""
    given = sum(EXPECTED_S.get(name, 0) for name in EARLY)  # handed out first
    for name, weight in sorted(EXPECTED_S.items(), key=lambda kv: -kv[1]):
        if name not in BURSTY and name not in EARLY:
            given += weight
            if given >= AFTER_S:
                return weight
    return 0.0


def order_key(path: str) -> tuple:
    """Collection order: the engine unit first, then :data:`EARLY`, then the other modules
    longest first, :data:`BURSTY` ones later (stable: modules of equal weight keep their order,
    the same on every worker as xdist requires)."""
    name = PurePath(path).name
    if name in ENGINE_MODULES:
        return (0, ENGINE_MODULES.index(name))
    if name in EARLY:
        return (1, EARLY.index(name))
    if name in SERVED_MODULES:  # the unit's modules side by side, in the unit's place
        return (2, -EXPECTED_S[SERVED_UNIT], SERVED_MODULES.index(name))
    if name in RAY_MODULES:
        return (2, -EXPECTED_S[RAY_UNIT], RAY_MODULES.index(name))
    if name in BURSTY:  # after every module of the weight it is placed at
        return (2, -_bursty_place(), len(SERVED_MODULES) + BURSTY.index(name))
    return (2, -EXPECTED_S.get(name, 0), 0)


def ray_workers_of_the_suite() -> None:
    """Every Ray cluster the suite starts runs its workers at the priority of the process that
    started it (``RAY_worker_niceness=0``; Ray's default adds 15), and starts none ahead.

    Ray's workers hold what a trial runs: the trial actor with its load generator, the Serve
    replicas, and the vLLM servers a replica starts (they inherit its niceness). At Ray's +15 the
    engine unit's vLLM server got 3.5% of a core while another worker's test process (nice 5)
    trained a model, and its load generator 2.6% beside busy loops: the unit took twice its time
    alone, and a trial once missed its TTFT SLO at every load level. With the offset gone the
    unit's whole chain is at nice 0 and the other workers' at 5 (:func:`give_way_to_the_engine_unit`)."""
    os.environ["RAY_worker_niceness"] = "0"
    # Nor start idle workers ahead for the first driver (one per CPU, ~0.5 CPU-s each, mostly never
    # used by a study's few actors): ``orchestrator run`` does the same for a Ray it starts.
    os.environ["RAY_prestart_worker_first_driver"] = "0"


# How far a worker outside the engine unit steps back (``os.nice``; CFS gives a nice-0 process
# about nine times the CPU of a nice-10 one). At 5 (three times) the unit's chain ran at ~0.7 of a
# core for ~540 s of a ~700 s run, the end of the run waiting on it.
OTHERS_NICE = 10
_gave_way = False


def give_way_to_the_engine_unit(path: str) -> None:
    """On an xdist worker, the first test outside the engine unit lowers that worker's priority,
    and so that of the Ray clusters, servers and ``orchestrator run`` processes it starts later.

    The engine unit is the suite's longest chain of work on one worker; on two busy cores it
    stretched from ~350 s alone to ~630 s and ended last, with the other workers done a
    hundred seconds before. With the other workers a step back it gets a core whenever it
    asks, and they take the rest. The worker that runs the unit runs it first (it is handed
    out first) and gives way after it. A run without xdist is left as it is."""
    global _gave_way
    if _gave_way or "PYTEST_XDIST_WORKER" not in os.environ or unit_of(path) == ENGINE_UNIT:
        return
    os.nice(OTHERS_NICE)
    if _autogroups():  # nice orders only the processes of one session: step back as a session too
        try:
            os.setsid()
        except OSError:
            pass  # already a process group's leader: it keeps the session it has
        else:
            step_back_session(os.getpid())
    _gave_way = True


AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _autogroups() -> bool:
    """Whether the kernel shares CPU time between sessions first (``CONFIG_SCHED_AUTOGROUP``, on):
    then a process's nice counts only against the processes of its own session, and each session
    weighs as one nice-0 process against the others, whatever its processes' nice. The vLLM
    servers of the engine unit are sessions of their own (vllm_process: a process group to stop),
    and so is clusters/local.sh's Ray head: beside them a nice-10 worker counted as much as the
    unit, and test_vllm_cpu.py ran at 0.46 of a core (277 s against 164 s) with four workers."""
    try:
        return AUTOGROUP.read_text().strip() == "1"
    except OSError:
        return False


def step_back_session(pid: int) -> None:
    """The session ``pid`` belongs to weighs as a nice-:data:`OTHERS_NICE` process against the
    others (``/proc/PID/autogroup``): this worker's own, or one it started (a Ray head started
    with ``setsid``). Nothing where sessions do not share time first, or outside a worker that
    gave way."""
    if not (_gave_way or pid == os.getpid()) or not _autogroups():
        return
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(OTHERS_NICE))
    except OSError:
        pass  # the process is gone, or the kernel refuses: its session keeps its weight


def full_weight(pid: int) -> None:
    """Nice 0 for a process a worker that stepped back has just started (its threads, made later,
    inherit it). Only where the process may raise priority (root): elsewhere it keeps the worker's."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 0)
    except OSError:
        pass


def make_scheduler(config, log):
    """xdist's module-at-a-time scheduler with the engine modules as one unit."""
    from xdist.scheduler import LoadFileScheduling

    class EngineUnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(super()._split_scope(nodeid))

    return EngineUnitScheduling(config, log)
