"""Incremental Server-Sent-Events parser, written once for every OpenAI-style API.

Bytes go in as they come off the socket (any split); complete ``data`` payloads
come out, as bytes (``json.loads`` takes bytes, so nothing is decoded twice).

Follows the SSE rules that matter for OpenAI-compatible servers:

* lines end with ``\\n``, ``\\r\\n`` or a lone ``\\r`` (a ``\\r`` at the end of one
  chunk followed by ``\\n`` at the start of the next is one line end);
* a blank line ends an event; an event's ``data:`` lines are joined with ``\\n``
  (one optional space after the colon is dropped);
* lines starting with ``:`` are comments (keep-alive pings) and are skipped;
  ``event:``, ``id:`` and ``retry:`` are recognised and ignored;
* the payload ``[DONE]`` ends the stream: :attr:`SSEParser.done` turns true,
  it is not returned, and everything after it is ignored.

Any other line (not a known field) is counted in :attr:`SSEParser.invalid_lines`
and its first occurrence kept in :attr:`SSEParser.first_invalid`, so the client can
tell "not an event stream at all" apart from "stream cut short". An event still
open when the stream ends is returned by :meth:`flush` if its lines were complete.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["SSEParser", "DONE"]

DONE = b"[DONE]"
_KNOWN_FIELDS = (b"event", b"id", b"retry")


class SSEParser:
    __slots__ = ("_buf", "_data", "done", "invalid_lines", "first_invalid")

    def __init__(self) -> None:
        self._buf = b""  # an incomplete last line (may end with a held-back \r)
        self._data: list[bytes] = []  # data lines of the event being read
        self.done = False
        self.invalid_lines = 0
        self.first_invalid: Optional[bytes] = None

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add bytes; return the payloads of the events they complete (maybe none)."""
        if self.done:
            return []
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # Hold back a trailing \r: the next chunk may start with its \n.
            held = buf.endswith(b"\r")
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                buf += b"\r"
        out: list[bytes] = []
        start = 0
        if not self._data:
            # Fast path for what servers send: events of one "data: ..." line each.
            find = buf.find
            while (end := find(b"\n\n", start)) >= 0:
                if not buf.startswith(b"data: ", start) or find(b"\n", start, end) >= 0:
                    break
                payload = buf[start + 6:end]
                start = end + 2
                if payload == DONE:
                    self.done = True
                    self._buf = b""
                    return out
                out.append(payload)
            if start:
                buf = buf[start:]
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if self._line(line, out):
                break
        return out

    def flush(self) -> list[bytes]:
        """End of stream: the payload of an event missing only its final blank line."""
        out: list[bytes] = []
        buf, self._buf = self._buf, b""
        if buf.endswith(b"\r") and not self.done:  # a held-back \r ended a line
            self._line(buf[:-1], out)
        elif buf and not self.done and not buf.startswith(b"data"):
            self._line(buf, [])  # an unterminated line: only counted if it is not SSE at all
        if not self.done:
            self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[bytes]) -> bool:
        """Handle one complete line; True once ``[DONE]`` has been seen."""
        if not line:
            if self._data:
                payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                self._data = []
                if payload == DONE:
                    self.done = True
                    self._buf = b""
                    return True
                out.append(payload)
            return False
        if line.startswith(b"data:"):
            value = line[5:]
            if value[:1] == b" ":
                value = value[1:]
            self._data.append(value)
            return False
        if line[:1] == b":":
            return False
        if line == b"data":  # a field name without a colon has an empty value
            self._data.append(b"")
            return False
        name = line.split(b":", 1)[0]
        if name not in _KNOWN_FIELDS:
            self.invalid_lines += 1
            if self.first_invalid is None:
                self.first_invalid = line[:200]
        return False
