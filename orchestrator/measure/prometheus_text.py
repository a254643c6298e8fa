"""The Prometheus text format: fetch a ``/metrics`` page and read its samples.

Only what the tuner needs: sample lines (``name{labels} value``), label matching, and a
metric summed over its label sets. Comments (``# HELP``, ``# TYPE``) and timestamps are
ignored; a value that is not a number is skipped.
"""

from __future__ import annotations

import re
import urllib.request
from typing import Iterable, Mapping, Optional

__all__ = ["fetch_metrics_text", "iter_samples", "parse_labels", "parse_prometheus"]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNaN]+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def fetch_metrics_text(url: str) -> str:
    """The text of a ``/metrics`` page (5 s timeout)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode("utf-8", "replace")


def parse_labels(text: Optional[str]) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def iter_samples(text: str, labels: Optional[Mapping[str, str]] = None,
                 prefix: str = "") -> Iterable[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of every sample whose name starts with ``prefix`` and whose
    labels include ``labels``."""
    for line in text.splitlines():
        if not line or line[0] == "#" or not line.startswith(prefix):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        have = parse_labels(m.group(2))
        if labels and any(have.get(k) != v for k, v in labels.items()):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        yield m.group(1), have, v


def parse_prometheus(text: str, labels: Optional[dict[str, str]] = None) -> dict[str, float]:
    """Sum each metric over its label sets (several engines or label values add up),
    keeping only samples whose labels include ``labels``."""
    out: dict[str, float] = {}
    for name, _, v in iter_samples(text, labels):
        out[name] = out.get(name, 0.0) + v
    return out
