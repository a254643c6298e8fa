"""Where the probe's answers live, and which trial's answers are the reference.

Layout, beside the tables (``<output>/<study>/``)::

    probe/<probe set>/<trial_id>.json   every trial's answers (params, engine arguments, tokens, logprobs)
    probe/<probe set>/baseline.json     the reference: the first baseline trial whose probe fully answered

``<probe set>`` is :func:`orchestrator.trial.probe.probe_fingerprint`: answers to another probe set
(other prompts, lengths or seed) are never compared. Files are written whole or not at all
(:meth:`ResultsStore.put_file`). The baseline is claimed once and then only read, so a
resumed run and every later trial compare against the same reference. The run's results
writer owns the store (one process writes), which makes "claim if absent" race-free.

A trial probed while no baseline exists yet (the baseline configuration has not run, or
its probe failed) gets null agreement columns; its answers are kept, so they can be
compared once a baseline exists (:func:`orchestrator.trial.probe.compare` over the two files).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from orchestrator.results.store import ResultsStore


class ProbeStore:
    def __init__(self, output: str, study_name: str):
        self.store = ResultsStore(output, study_name)

    def baseline(self, probe_set: str) -> Optional[dict]:
        """The baseline's record, or None while no trial has claimed it."""
        raw = self.store.get_file(f"probe/{probe_set}/baseline.json")
        return None if raw is None else json.loads(raw)

    def keep(self, probe_set: str, trial_id: str, record: dict[str, Any], eligible: bool) -> Optional[dict]:
        """Store this trial's answers; return the baseline's record (this one's if it becomes the baseline)."""
        data = json.dumps(record, default=str).encode()
        self.store.put_file(f"probe/{probe_set}/{trial_id}.json", data)
        claimed = self.baseline(probe_set)
        if claimed is not None:
            return claimed
        if not eligible:
            return None
        self.store.put_file(f"probe/{probe_set}/baseline.json", data)
        return record

    def answers(self, probe_set: str, trial_id: str) -> Optional[dict]:
        raw = self.store.get_file(f"probe/{probe_set}/{trial_id}.json")
        return None if raw is None else json.loads(raw)
