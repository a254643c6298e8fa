"""Running a study: the driver, Tune's side, the Optuna searcher, and where state lives.

* :mod:`.driver`: :func:`run_study`, one run from survey to summary;
* :mod:`.tune`: the trainable every trial runs, the results writer, Tune's hooks;
* :mod:`.optuna_search`: :func:`~.optuna_search.propose` and :func:`~.optuna_search.tell_report`,
  the one path between trials and Optuna, and Tune's searcher built on them;
* :mod:`.samplers` and :mod:`.stages`: the sampler a study names, staged search;
* :mod:`.state`: run ids, the state folder, the Optuna journal.
"""

from orchestrator.search.driver import StudyRun, StudyStopped, run_study
from orchestrator.search.state import local_state_dir, new_run_id, optuna_storage, optuna_study_name
from orchestrator.search.tune import ResultsSinkActor

__all__ = ["ResultsSinkActor", "StudyRun", "StudyStopped", "local_state_dir", "new_run_id", "optuna_storage",
           "optuna_study_name", "run_study"]
