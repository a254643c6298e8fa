"""Multi-turn sessions from files: ShareGPT conversations with all their turns, and session traces.

Both become :class:`SessionShape` lists (every turn's user message, answer length and, when
the file says, think time and start time); :mod:`.sessions` turns them into requests.

* ShareGPT (``format: sharegpt``): ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}`` (a JSON list or JSONL; ``user``/``assistant`` and
  ``role``/``content`` spellings too). Each (human, gpt) pair is a turn, in order; a leading
  ``system`` message opens the first user message; the conversation ends at the first
  message out of turn (two humans in a row) or an empty one. The answer's text is kept: the
  next turn's history carries the recorded answer, and the turn asks for as many tokens as
  the answer has words (``file.output_len`` replaces it).
* Session trace (``format: session-trace``), JSONL, one turn per line::

      {"session": "a", "turn": 1, "timestamp": 0.0, "input_len": 300, "output_len": 120}
      {"session": "a", "turn": 2, "timestamp": 14.2, "prompt": "and in French?", "output_len": 80, "think_s": 6.0}

  ``session`` (string or integer) and ``turn`` (1, 2, ... without gaps) name the turn; lines
  may come in any order. ``input_len`` (tokens, drawn from the seed) or ``prompt`` (text) is the
  new user message; ``output_len`` the answer's tokens; ``think_s`` (optional) the seconds
  between the previous answer's end and this turn (else ``sessions.think_time_ms``);
  ``timestamp`` (seconds, any origin) of turn 1 is when the session starts, used with
  ``file.timestamps: true``; later turns' timestamps are informative (a replay is closed loop
  within a session: the answer's real end decides when the next turn goes).

Problems raise :class:`~orchestrator.workload.trace.TraceError` naming the file and line.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from orchestrator.workload.datasets import _load_json_or_jsonl
from orchestrator.workload.trace import TraceError

__all__ = ["SessionShape", "SessionTurn", "read_session_file", "read_session_trace", "read_sharegpt_sessions",
           "SESSION_TRACE_KEYS"]

SESSION_TRACE_KEYS = ("session", "turn", "timestamp", "prompt", "input_len", "output_len", "think_s")


@dataclass(frozen=True)
class SessionTurn:
    """One turn: the new user message (text, or a length to draw), the answer's length and text if known."""

    output_len: int
    user_len: Optional[int] = None
    user_text: Optional[str] = None
    answer_text: Optional[str] = None
    think_s: Optional[float] = None  # None: drawn from sessions.think_time_ms


@dataclass(frozen=True)
class SessionShape:
    turns: tuple[SessionTurn, ...]
    start_s: Optional[float] = None  # the first turn's timestamp (session traces)
    line: int = 0  # where it starts in its file, for messages

    @property
    def text(self) -> bool:
        return all(t.user_text is not None for t in self.turns)


def _words(text: str) -> int:
    return len(text.split())


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "system": "system"}


def _messages(obj: Any, where: str) -> list[tuple[str, str]]:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected an object with 'conversations', got {type(obj).__name__}")
    conv = obj.get("conversations", obj.get("conversation", obj.get("messages")))
    if not isinstance(conv, list):
        raise TraceError(f"{where}: 'conversations' must be a list of messages")
    out = []
    for m in conv:
        if not isinstance(m, dict):
            raise TraceError(f"{where}: a message must be an object with 'from' and 'value'")
        role, value = m.get("from", m.get("role")), m.get("value", m.get("content"))
        if not isinstance(value, str):
            raise TraceError(f"{where}: a message must have a string 'value'")
        out.append((_ROLES.get(str(role).lower(), "other"), value))
    return out


def read_sharegpt_sessions(path: Union[str, os.PathLike], output_len: Optional[int] = None) -> list[SessionShape]:
    sessions = []
    for pos, obj in _load_json_or_jsonl(path):
        msgs = _messages(obj, f"{path}:{pos}")
        system = ""
        if msgs and msgs[0][0] == "system":
            system = msgs.pop(0)[1].strip()
        turns = []
        for i in range(0, len(msgs) - 1, 2):
            (r1, user), (r2, answer) = msgs[i], msgs[i + 1]
            if r1 != "user" or r2 != "assistant" or not user.strip() or not answer.strip():
                break  # out of turn, or empty: the conversation as recorded ends here
            if not turns and system:
                user = f"{system} {user}"
            turns.append(SessionTurn(output_len=output_len or max(1, _words(answer)), user_text=user,
                                     answer_text=answer))
        if turns:
            sessions.append(SessionShape(tuple(turns), line=pos))
    if not sessions:
        raise TraceError(f"{path}: no conversation with a user message and an answer")
    return sessions


def _count(obj: dict, key: str, where: str, minimum: int = 1) -> Optional[int]:
    raw = obj.get(key)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not float(raw).is_integer() or raw < minimum:
        raise TraceError(f"{where}: '{key}' must be an integer >= {minimum} (got {raw!r})")
    return int(raw)


def _seconds(obj: dict, key: str, where: str) -> Optional[float]:
    raw = obj.get(key)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
        raise TraceError(f"{where}: '{key}' must be a number of seconds >= 0 (got {raw!r})")
    return float(raw)


def read_session_trace(path: Union[str, os.PathLike], output_len: Optional[int] = None,
                       need_timestamp: bool = False) -> list[SessionShape]:
    """The sessions of a session trace, in the order their first turn appears in the file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    by_session: dict[str, dict[int, tuple[int, SessionTurn, Optional[float]]]] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - set(SESSION_TRACE_KEYS))
        if unknown:
            raise TraceError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(SESSION_TRACE_KEYS)}")
        sid = obj.get("session")
        if isinstance(sid, bool) or not isinstance(sid, (str, int)):
            raise TraceError(f"{where}: 'session' must be a string or an integer (got {sid!r})")
        turn = _count(obj, "turn", where)
        if turn is None:
            raise TraceError(f"{where}: 'turn' is missing (1 for a session's first turn)")
        prompt, length = obj.get("prompt"), _count(obj, "input_len", where)
        if (prompt is None) == (length is None):
            raise TraceError(f"{where}: give exactly one of 'prompt' (text) and 'input_len' (tokens)")
        if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
            raise TraceError(f"{where}: 'prompt' must be a non-empty string")
        out = output_len or _count(obj, "output_len", where)
        if out is None:
            raise TraceError(f"{where}: 'output_len' is missing (or set sessions.file.output_len)")
        ts = _seconds(obj, "timestamp", where)
        if need_timestamp and turn == 1 and ts is None:
            raise TraceError(f"{where}: a session's first turn needs a 'timestamp' (file.timestamps is true)")
        turns = by_session.setdefault(str(sid), {})
        if turn in turns:
            raise TraceError(f"{where}: session {sid!r} has turn {turn} twice (also line {turns[turn][0]})")
        turns[turn] = (n, SessionTurn(output_len=out, user_len=length, user_text=prompt,
                                      think_s=_seconds(obj, "think_s", where)), ts)
    sessions = []
    for sid, turns in by_session.items():
        missing = [k for k in range(1, len(turns) + 1) if k not in turns]
        first = min(line for line, _, _ in turns.values())
        if missing:
            raise TraceError(f"{path}:{first}: session {sid!r} has no turn {missing[0]} (turns are 1, 2, ...)")
        ordered = [turns[k][1] for k in range(1, len(turns) + 1)]
        if len({t.user_text is None for t in ordered}) > 1:
            raise TraceError(f"{path}:{first}: session {sid!r} mixes 'prompt' and 'input_len' turns; use one")
        sessions.append((first, SessionShape(tuple(ordered), start_s=turns[1][2], line=first)))
    if not sessions:
        raise TraceError(f"{path}: no sessions in the file")
    return [s for _, s in sorted(sessions, key=lambda x: x[0])]


def read_session_file(fmt: str, path: Union[str, os.PathLike], output_len: Optional[int] = None,
                      need_timestamp: bool = False) -> list[SessionShape]:
    if fmt == "sharegpt":
        return read_sharegpt_sessions(path, output_len)
    if fmt == "session-trace":
        return read_session_trace(path, output_len, need_timestamp)
    raise ValueError(f"unknown session file format {fmt!r}; allowed: sharegpt, session-trace")
