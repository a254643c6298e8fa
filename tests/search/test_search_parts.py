"""The search's parts behind one interface (search/parts.py): the proposal loop calls every part's
hooks in turn; the first part to queue a trial has it proposed, a proposal a part turns away takes
no trial and every part observes it, and the grid's end says when nothing new is left (real Optuna,
the real racing, staged search and grid)."""

from __future__ import annotations

import optuna

from conftest import sim_study
from orchestrator.search import parts as search_parts
from orchestrator.search.optuna_search import propose, tell
from orchestrator.search.parts import FinishedGrid, Outcome, SearchPart
from orchestrator.search.racing import REMEASURE_ATTR, REMEASURE_KEY, Racer, RacingPart
from orchestrator.search.samplers import make_sampler
from orchestrator.search.stages import DUPLICATE_ATTR, StagedSearch

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {"max_num_seqs": [16, 64, 256], "max_num_batched_tokens": [2048, 8192]}


def _ask(ostudy, space):
    def ask():
        trial = ostudy.ask()
        return trial, space.suggest(trial)

    return ask


class TurnAway(SearchPart):
    """Turns away one value of ``max_num_seqs`` (as the pre-flight does: told first, then turned away)
    and keeps every outcome it observes."""

    def __init__(self, seqs: int):
        self.seqs, self.seen = seqs, []

    def turned_away(self, trial, params) -> bool:
        if params["max_num_seqs"] != self.seqs:
            return False
        trial.set_constraint("engine_started", 1.0)
        tell(trial.study, trial, [0.0])
        return True

    def observe(self, params, outcome: Outcome) -> None:
        self.seen.append((dict(params), outcome.screened))


def test_the_first_part_to_queue_is_proposed_first_and_adds_its_keys():
    study = sim_study(space=SPACE, objectives=["maximize goodput"], budget={"trials": 8},
                      search={"stages": [{"params": ["max_num_seqs"], "trials": 4},
                                         {"params": ["max_num_batched_tokens"]}]})
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study))
    leader, runner_up = {"max_num_seqs": 64, "max_num_batched_tokens": 8192}, \
        {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    racer = Racer("goodput", True, left=1, reserve=1)
    racer.observe(leader, True, 100.0, 90.0, 110.0)
    racer.observe(runner_up, True, 99.0, 85.0, 115.0)  # not told apart from the leader
    parts = [RacingPart(racer), StagedSearch(study)]

    trial, params = propose(ostudy, _ask(ostudy, study.space), parts)
    assert params == leader and trial.user_attrs[REMEASURE_ATTR] == 1
    assert "stage" not in trial.user_attrs  # racing queued first: the stage did not queue a second trial
    assert search_parts.started(parts, trial, params) == {REMEASURE_KEY: 1}
    assert racer.left == 0  # racing's trials are spent: the stage's turn
    tell(ostudy, trial, [1.0])
    trial, params = propose(ostudy, _ask(ostudy, study.space), parts)
    assert trial.user_attrs["stage"] == "stage 1" and REMEASURE_ATTR not in trial.user_attrs
    assert search_parts.started(parts, trial, params) == {}


def test_a_proposal_turned_away_takes_no_trial_and_every_part_observes_it():
    study = sim_study(space=SPACE, objectives=["maximize goodput"], search={"sampler": "random", "seed": 1})
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study))
    screen, racer = TurnAway(16), Racer("goodput", True, left=10, reserve=1)
    parts = [RacingPart(racer), screen]
    proposed = []
    for _ in range(4):
        trial, params = propose(ostudy, _ask(ostudy, study.space), parts)
        proposed.append((params["max_num_seqs"], params["max_num_batched_tokens"]))
        tell(ostudy, trial, [1.0])
    assert sorted(proposed) == [(64, 2048), (64, 8192), (256, 2048), (256, 8192)]  # every point that may start
    assert screen.seen and all(p["max_num_seqs"] == 16 and screened for p, screened in screen.seen)
    assert racer.params == {}  # racing keeps only what was measured
    # The sampler was told each one infeasible (and its repeats answered from it), and none took a trial.
    turned = [t for t in ostudy.trials if t.params["max_num_seqs"] == 16]
    assert turned and all(t.constraints == {"engine_started": 1.0} for t in turned)
    assert len([t for t in turned if DUPLICATE_ATTR not in t.user_attrs]) == len(screen.seen)


def test_the_grid_is_finished_once_every_point_is_measured_or_running():
    study = sim_study(space=SPACE, objectives=["maximize goodput"], search={"sampler": "grid"})
    ostudy = optuna.create_study(directions=study.directions, sampler=make_sampler(study))
    parts = [FinishedGrid(study.space)]
    for i in range(6):
        assert not search_parts.finished(parts, ostudy)
        trial, _ = propose(ostudy, _ask(ostudy, study.space), parts)
        if i < 5:
            tell(ostudy, trial, [1.0])
    assert search_parts.finished(parts, ostudy)  # the last point is running: nothing new to propose
    assert not search_parts.last_call(parts, ostudy) and search_parts.stop_reason(parts) is None
