"""``search.fidelity: sim``: the simulator screens, real trials confirm. :mod:`.search` (the
search), :mod:`.model` (its arithmetic: calibration, residual model, expected gain), :mod:`.scoring`
(configurations scored in virtual time)."""
