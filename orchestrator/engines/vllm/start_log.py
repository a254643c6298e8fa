"""Where a vLLM start went, read from the engine's own log: pure functions over its text.

vLLM logs each step of a start with a timestamp (``INFO 12-07 10:51:49``: month-day and whole
seconds, local time) and, for most steps, its own duration. The phases, in the order they
happen (each is NaN in the row when it did not happen or could not be read):

* ``import``: from the server process's start to the engine starting to load weights: Python
  imports of the API server and the engine core, configuration, the engine-core process, device
  set-up. Needs the process's start time: the ``# started`` line the replica writes before it
  starts the server (:func:`mark_line`), or ``started_at`` (``ray.serve.llm``: the deploy).
* ``load``: weights ("Model loading took ... seconds" on GPUs, "Loading weights took" on CPUs).
* ``compile``: torch.compile ("torch.compile took X s in total"; on CPUs, which do not log it, from
  the warm-up for the compilation to the compiled function saved or loaded). ``compile_cached``:
  True when every compiled graph came from vLLM's cache, False when one was compiled.
* ``graphs``: CUDA graph capture ("Graph capturing finished in N secs", whole seconds).
* ``profile``: the rest of vLLM's "init engine (profile, create kv cache, warmup model)": memory
  profiling, the KV cache, the warm-up.
* ``ready``: from the engine core ready to the server answering ``/health`` (the ``# ready`` line
  the replica writes, or ``ready_at``; else vLLM's "Starting vLLM server on" line).

Timestamps have whole seconds, so ``import`` and ``ready`` (and ``compile`` on CPUs) are good to
about a second; the others are vLLM's own measurements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Optional

from orchestrator.measure.metrics import START_PHASE_NAMES

START_MARK, READY_MARK = "started", "ready"
_MARK = re.compile(r"^# (started|ready) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\s*$")
_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)\b")
_LOAD_BEGINS = re.compile(r"Starting to load model|Loading model from scratch")
_MODEL_LOADING = re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds")
_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")
_COMPILE_TOTAL = re.compile(r"torch\.compile (?:and initial profiling/warmup run together )?(?:took|takes) "
                            r"([\d.]+) s in total")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
                   r"(?: \(compilation: ([\d.]+) s)?")
_CPU_COMPILE_BEGINS = re.compile(r"Warming up model for the compilation")
_CPU_COMPILE_ENDS = re.compile(r"saved AOT compiled function|Directly load AOT compilation|"
                               r"unable to save AOT compiled function|Initial profiling/warmup run took")
_COMPILED = re.compile(r"Compiling a graph for compile range|Compiling model again due to a load failure|"
                       r"saved AOT compiled function")
_FROM_CACHE = re.compile(r"Directly load the compiled graph|Directly load AOT compilation")
_GRAPHS = re.compile(r"Graph capturing finished in ([\d.]+) secs?")
_SERVER_UP = re.compile(r"Starting vLLM (?:API )?server|Application startup complete")
# What a phase line says: a filter for logs read through Ray, which keeps only some lines.
_PHASE_LINE = re.compile("|".join(p.pattern for p in (
    _LOAD_BEGINS, _MODEL_LOADING, _WEIGHTS, _COMPILE_TOTAL, _INIT, _CPU_COMPILE_BEGINS, _CPU_COMPILE_ENDS,
    _COMPILED, _FROM_CACHE, _GRAPHS, _SERVER_UP)))
_HALF = timedelta(seconds=0.5)  # a whole-second stamp stands for the middle of its second
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class StartPhases:
    """Seconds of each phase of one engine start (None: did not happen, or not in the log)."""

    import_s: Optional[float] = None
    load_s: Optional[float] = None
    compile_s: Optional[float] = None
    graphs_s: Optional[float] = None
    profile_s: Optional[float] = None
    ready_s: Optional[float] = None
    compile_cached: Optional[bool] = None

    def columns(self) -> dict[str, object]:
        """The trials row's ``start_*`` columns."""
        values = (self.import_s, self.load_s, self.compile_s, self.graphs_s, self.profile_s, self.ready_s)
        return {**dict(zip(START_PHASE_NAMES, values)), "start_compile_cached": self.compile_cached}


def mark_line(what: str, when: datetime) -> str:
    """A line the replica writes into the server's log: ``# started ...`` before the server starts,
    ``# ready ...`` once it answers (local time, as vLLM stamps its lines)."""
    return f"# {what} {when:%Y-%m-%d %H:%M:%S.%f}\n"


def is_phase_line(line: str) -> bool:
    """Whether ``line`` says something :func:`start_phases` reads."""
    return bool(_PHASE_LINE.search(line) or _MARK.match(line))


@dataclass(frozen=True)
class _Line:
    text: str
    at: Optional[datetime]  # None: the line has no timestamp


def _last_start(lines: list[str]) -> list[str]:
    """The lines of the last start in a log that may hold several (a server started again)."""
    starts = [i for i, ln in enumerate(lines) if (m := _MARK.match(ln)) and m.group(1) == START_MARK]
    return lines[starts[-1]:] if starts else lines


def _stamped(lines: Iterable[str], since: Optional[datetime]) -> list[_Line]:
    """Each line with its time. vLLM's stamps have no year: that of ``since`` (the start), or of the
    line before, and the next one past New Year."""
    out, last = [], since
    year = since.year if since is not None else 2000
    for text in lines:
        at = None
        if m := _STAMP.search(text):
            try:
                at = datetime.strptime(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S") + _HALF
            except ValueError:  # 02-29 in a year without it
                at = None
            if at is not None and last is not None and at < last - timedelta(days=180):
                year += 1
                at = at.replace(year=year)
            last = at or last
        out.append(_Line(text, at))
    return out


def _first(lines: list[_Line], pattern: re.Pattern, after: Optional[datetime] = None) -> Optional[_Line]:
    return next((ln for ln in lines if pattern.search(ln.text) and ln.at is not None
                 and (after is None or ln.at >= after)), None)


def _largest(lines: list[_Line], pattern: re.Pattern, group: int = 1) -> Optional[float]:
    """The largest value a line matching ``pattern`` gives: with several workers (TP > 1), each logs
    its own, and the slowest one holds the start up."""
    values = [float(m.group(group)) for ln in lines if (m := pattern.search(ln.text)) and m.group(group)]
    return max(values) if values else None


def _either(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a if a is not None else b


def _seconds(a: Optional[datetime], b: Optional[datetime]) -> Optional[float]:
    """``b - a`` in seconds; 0 within the stamps' rounding; None without both or if far negative."""
    if a is None or b is None:
        return None
    s = (b - a).total_seconds()
    return None if s < -1.0 else round(max(0.0, s), 3)


def _compile_seconds(lines: list[_Line]) -> Optional[float]:
    total = _either(_largest(lines, _COMPILE_TOTAL), _largest(lines, _INIT, group=2))
    if total is not None:
        return total
    begins = _first(lines, _CPU_COMPILE_BEGINS)  # vLLM-CPU compiles without logging the time it took
    ends = _first(lines, _CPU_COMPILE_ENDS, after=begins.at) if begins is not None else None
    return _seconds(begins.at, ends.at) if begins is not None and ends is not None else None


def start_phases(log_text: str, *, started_at: Optional[datetime] = None,
                 ready_at: Optional[datetime] = None) -> StartPhases:
    """The phases of an engine start in ``log_text``.

    Without ``started_at``: the server's own log, as the replica writes it (the last start in it,
    between its ``# started`` and ``# ready`` lines). With ``started_at`` and ``ready_at`` (naive
    local times: the deploy, the endpoint answering): lines that Ray's logs hold, where other
    starts' lines may sit too (their marks included): only the lines stamped from ``started_at`` on."""
    raw = log_text.splitlines()
    if started_at is None:
        raw = _last_start(raw)
        marks = {m.group(1): datetime.fromisoformat(m.group(2)) for ln in raw if (m := _MARK.match(ln))}
        started_at, ready_at = marks.get(START_MARK), ready_at or marks.get(READY_MARK)
        lines = _stamped(raw, started_at or (ready_at - timedelta(days=1) if ready_at else None))
    else:
        lines = [ln for ln in _stamped(raw, started_at) if ln.at is not None and ln.at >= started_at - _SECOND]

    load_begins = _first(lines, _LOAD_BEGINS)
    init = next((ln for ln in reversed(lines) if _INIT.search(ln.text)), None)
    compile_s = _compile_seconds(lines)
    graphs_s = _largest(lines, _GRAPHS)
    profile_s = None
    if init is not None:
        init_s = float(_INIT.search(init.text).group(1))
        profile_s = round(max(0.0, init_s - (compile_s or 0.0) - (graphs_s or 0.0)), 3)
    if ready_at is None and (up := _first(lines, _SERVER_UP, after=init.at if init else None)) is not None:
        ready_at = up.at
    cached = None
    if compile_s is not None:
        cached = False if any(_COMPILED.search(ln.text) for ln in lines) else (
            True if any(_FROM_CACHE.search(ln.text) for ln in lines) else None)
    return StartPhases(
        import_s=_seconds(started_at, load_begins.at if load_begins else None),
        load_s=_either(_largest(lines, _MODEL_LOADING), _largest(lines, _WEIGHTS)),
        compile_s=compile_s, graphs_s=graphs_s, profile_s=profile_s,
        ready_s=_seconds(init.at if init else None, ready_at),
        compile_cached=cached)
