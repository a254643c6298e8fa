"""Running a study: the driver, Tune's side, the Optuna searcher, and where state lives.

* :mod:`.driver`: :func:`~.driver.run_study`, one run from survey to summary;
* :mod:`.tune`: the trainable every trial runs, the results writer, Tune's hooks;
* :mod:`.optuna_search`: :func:`~.optuna_search.propose` and :func:`~.optuna_search.tell_report`,
  the one path between trials and Optuna, and Tune's searcher built on them;
* :mod:`.parts`: the interface of the search's optional parts (racing, stages, the pre-flight
  screen, the fidelity search, the grid's end), which the proposal loop calls in turn;
* :mod:`.samplers` and :mod:`.stages`: the sampler a study names, staged search;
* :mod:`.state`: run ids, the state folder, the Optuna journal.

Nothing is imported here: importing one module of the package (the pre-flight,
:mod:`.feasibility`) does not pull in the driver and Tune, and a module of the package that
imports from it (``from orchestrator.search import feasibility``) closes no circle through
this file. Import from the modules themselves.
"""
