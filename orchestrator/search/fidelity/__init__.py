"""``search.fidelity: sim``: the simulator screens, real trials confirm. :mod:`.search` (the
search), :mod:`.part` (it as a part of the run's search, :mod:`orchestrator.search.parts`),
:mod:`.model` (its arithmetic: calibration, residual model, expected gain), :mod:`.scoring`
(configurations scored in virtual time), :mod:`.margin` (how far the simulator is trusted on a GPU,
and how many real trials confirm it), :mod:`.replay` and :mod:`.error` (the simulator's
out-of-sample error on the recorded real datasets, which the margins come from)."""
