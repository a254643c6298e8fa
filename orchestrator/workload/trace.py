"""JSONL traces: one request per line, replayed with time scaling and a time window.

A line is a JSON object with these keys::

    {"timestamp": 12.5, "input_len": 812, "output_len": 128, "prefix_group": 3, "prefix_len": 512}
    {"timestamp": 12.9, "prompt": "Summarise: ...", "output_len": 256}

* ``timestamp``: when the request arrived (seconds, or milliseconds with
  ``time_unit: ms``); any origin, the first request of the replay window is due at 0;
* ``prompt`` (text, sent as is) **or** ``input_len`` (tokens; the prompt is drawn
  from the seed like a synthetic workload's);
* ``output_len``: tokens to generate (sent as ``max_tokens``, with ``ignore_eos``);
* ``prefix_group`` (optional, >= 0): requests of one group share their first
  ``prefix_len`` tokens (the line's own ``prefix_len``, else the trace spec's) —
  a system prompt or a RAG context; the group's prefix is drawn once per seed.

Blank lines are skipped; every other problem raises :class:`TraceError` naming the
file and the line. Lines are replayed in timestamp order (a stable sort: equal
timestamps keep the file's order).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

__all__ = ["TraceEntry", "TraceError", "read_trace", "select_window", "write_trace", "resolve_workload_file",
           "trace_dirs", "TRACE_KEYS"]

TRACE_KEYS = ("timestamp", "prompt", "input_len", "output_len", "prefix_group", "prefix_len")


class TraceError(ValueError):
    """A trace or dataset file that cannot be used; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class TraceEntry:
    """One request of a trace or dataset file (lengths in tokens, times in seconds)."""

    output_len: int
    timestamp: Optional[float] = None
    prompt: Optional[str] = None
    input_len: Optional[int] = None
    prefix_group: Optional[int] = None
    prefix_len: Optional[int] = None
    line: int = 0  # 1-based line (or entry) number in its file, for messages


# ---------------------------------------------------------------- locating files
def trace_dirs() -> list[Path]:
    """Where bare trace names are looked up: ./search_spaces/traces, then the repository's."""
    return [Path.cwd() / "search_spaces" / "traces", Path(__file__).resolve().parents[2] / "search_spaces" / "traces"]


def resolve_workload_file(path: str, base_dir: Optional[Union[str, Path]] = None) -> Path:
    """A trace/dataset path: relative to ``base_dir`` (the study file's folder), the working
    directory, or a shipped trace's name (``chat`` -> ``search_spaces/traces/chat.jsonl``)."""
    p = Path(path).expanduser()
    candidates = []
    if base_dir is not None and not p.is_absolute():
        candidates.append(Path(base_dir) / p)
    candidates.append(p)
    for d in trace_dirs():
        candidates += [d / path, d / f"{path}.jsonl"]
    for c in candidates:
        if c.is_file():
            return c
    names = sorted({f.stem for d in trace_dirs() if d.is_dir() for f in d.glob("*.jsonl")})
    raise TraceError(f"{path}: file not found (shipped traces: {', '.join(names) or 'none'})")


# ---------------------------------------------------------------- reading
def _int(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ValueError(f"{key} must be an integer >= {minimum} (got {value!r})")
    if value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum} (got {value!r})")
    return int(value)


def parse_entry(obj: Any, *, line: int, time_unit: str = "s", need_timestamp: bool = True) -> TraceEntry:
    """One trace line (already JSON-decoded); raises ``ValueError`` with what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in TRACE_KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), TRACE_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown key {unknown[0]!r}{hint}; allowed: {', '.join(TRACE_KEYS)}")
    ts = obj.get("timestamp")
    if ts is None:
        if need_timestamp:
            raise ValueError("timestamp is missing")
    else:
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise ValueError(f"timestamp must be a number >= 0 (got {ts!r})")
        ts = float(ts) / (1000.0 if time_unit == "ms" else 1.0)
    prompt, input_len = obj.get("prompt"), obj.get("input_len")
    if (prompt is None) == (input_len is None):
        raise ValueError("give exactly one of prompt (text) and input_len (tokens)")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise ValueError(f"prompt must be a non-empty string (got {prompt!r:.60})")
    if input_len is not None:
        input_len = _int(input_len, "input_len", 1)
    if "output_len" not in obj:
        raise ValueError("output_len is missing")
    output_len = _int(obj["output_len"], "output_len", 1)
    group = obj.get("prefix_group")
    group = None if group is None else _int(group, "prefix_group", 0)
    plen = obj.get("prefix_len")
    if plen is not None:
        plen = _int(plen, "prefix_len", 1)
        if group is None:
            raise ValueError("prefix_len needs a prefix_group")
    return TraceEntry(output_len=output_len, timestamp=ts, prompt=prompt, input_len=input_len,
                      prefix_group=group, prefix_len=plen, line=line)


def read_trace(path: Union[str, os.PathLike], *, time_unit: str = "s",
               need_timestamp: bool = True) -> list[TraceEntry]:
    """Every entry of a JSONL trace, in file order; :class:`TraceError` on the first bad line."""
    entries = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    with f:
        try:
            for n, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    entries.append(parse_entry(json.loads(text), line=n, time_unit=time_unit,
                                               need_timestamp=need_timestamp))
                except json.JSONDecodeError as e:
                    raise TraceError(f"{path}:{n}: not valid JSON: {e.msg} (column {e.colno})") from None
                except ValueError as e:
                    raise TraceError(f"{path}:{n}: {e}") from None
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not a UTF-8 text file") from None
    if not entries:
        raise TraceError(f"{path}: no requests in the file")
    return entries


def select_window(entries: Sequence[TraceEntry], *, start_s: float = 0.0, end_s: Optional[float] = None,
                  time_scale: float = 1.0, max_requests: Optional[int] = None
                  ) -> tuple[list[TraceEntry], np.ndarray]:
    """The entries replayed and their due times.

    Entries are ordered by timestamp; the window keeps those with
    ``start_s <= timestamp - first timestamp < end_s``, at most ``max_requests``; due
    times are the gaps from the first kept entry times ``time_scale``.
    """
    timed = sorted(entries, key=lambda e: e.timestamp)  # stable: ties keep the file's order
    t0 = timed[0].timestamp
    rel = np.array([e.timestamp - t0 for e in timed])
    keep = rel >= start_s
    if end_s is not None:
        keep &= rel < end_s
    idx = np.flatnonzero(keep)
    if max_requests is not None:
        idx = idx[:max_requests]
    chosen = [timed[i] for i in idx]
    if not chosen:
        end = "end of trace" if end_s is None else f"{end_s:g} s"
        raise TraceError(f"no request between {start_s:g} s and {end} (the trace spans {rel[-1]:g} s)")
    due = (rel[idx] - rel[idx[0]]) * time_scale
    return chosen, due


# ---------------------------------------------------------------- writing
def entry_to_json(e: TraceEntry) -> dict:
    out: dict[str, Any] = {}
    if e.timestamp is not None:
        out["timestamp"] = round(e.timestamp, 6)
    if e.prompt is not None:
        out["prompt"] = e.prompt
    else:
        out["input_len"] = e.input_len
    out["output_len"] = e.output_len
    if e.prefix_group is not None:
        out["prefix_group"] = e.prefix_group
    if e.prefix_len is not None:
        out["prefix_len"] = e.prefix_len
    return out


def write_trace(path: Union[str, os.PathLike], entries: Iterable[TraceEntry]) -> int:
    """Write entries as JSONL (atomically: temp file, then rename); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(entry_to_json(e), separators=(", ", ": ")) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
