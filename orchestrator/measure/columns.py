"""Groups of a trials row's columns, each with a declared vocabulary: a name outside it is an error
where the group is made, not a silent extra column (or a missing one) in the row.

A group is read-only and behaves as a mapping of column name to value, the shape the row and
the judge read (:meth:`orchestrator.trial.result.TrialResult.measured`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, Iterator, Mapping

from orchestrator.measure.metrics import (ENGINE_METRIC_NAMES, ENGINE_WINDOW_METRIC_NAMES, PROBE_METRIC_NAMES,
                                          SESSION_METRIC_NAMES, TELEMETRY_METRIC_NAMES)

__all__ = ["Columns", "EngineColumns", "ProbeColumns", "SessionColumns"]


class Columns(Mapping[str, Any]):
    """Column name -> value, names from :attr:`NAMES` only."""

    NAMES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, values: Mapping[str, Any] = MappingProxyType({})):
        unknown = sorted(set(values) - self.NAMES)
        if unknown:
            raise KeyError(f"{type(self).__name__}: no such column {', '.join(unknown)}; allowed: "
                           f"{', '.join(sorted(self.NAMES))}")
        self._values = MappingProxyType(dict(values))

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self._values)!r})"

    def __reduce__(self):  # picklable (results cross Ray's object store)
        return (type(self), (dict(self._values),))


class EngineColumns(Columns):
    """The engine's side of the measured window: its gauges and counters (peak, mean, increase),
    NVML, its own histograms over the measured requests (``engine_*``) and its start facts."""

    NAMES = frozenset(TELEMETRY_METRIC_NAMES + ENGINE_WINDOW_METRIC_NAMES + ENGINE_METRIC_NAMES)


class ProbeColumns(Columns):
    """The reference-agreement probe's columns (:mod:`orchestrator.trial.probe`)."""

    NAMES = frozenset(PROBE_METRIC_NAMES + ("probe_reference", "probe_baseline"))


class SessionColumns(Columns):
    """A multi-turn workload's session columns (:mod:`orchestrator.measure.session_metrics`)."""

    NAMES = frozenset(SESSION_METRIC_NAMES)
