"""A generated block of the docs, and the helpers that write a text block's prose.

Two kinds of block sit between markers in ``README.md`` or ``docs/*.md``: a ``table``
(``<!-- table: NAME (DATASETS) -->`` ... ``<!-- /table -->``) and a ``text``
(``<!-- text: NAME (DATASETS) -->`` ... ``<!-- /text -->``): sentences, paragraphs or bullets
whose every figure a function computes from the dataset. :mod:`.registry` registers both and
checks them alike. A text block's function writes its claims from the numbers too: a sentence
that says "the intervals do not overlap" is chosen because they do not, so a dataset that changes
under it changes the sentence (and fails the check) instead of leaving it wrong.
"""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

KINDS = ("table", "text")
WIDTH = 100  # the docs' line length


@dataclass(frozen=True)
class DocBlock:
    """One generated block: its name, the datasets it reads (relative to the repository root),
    the function that builds its markdown from them (called with the resolved paths), and its kind."""

    name: str
    datasets: tuple[str, ...]
    build: Callable[..., str]
    kind: str = "table"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"block {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")


def text(name: str, datasets: Sequence[str], build: Callable[..., str]) -> DocBlock:
    return DocBlock(name, tuple(datasets), build, "text")


# ---------------------------------------------------------------- prose
# A word markdown reads as a block marker when it opens a line (a quote, a heading, a list item).
_OPENER = re.compile(r"^(?:>|#|[-+*]$|\d+[.)]$)")
_GLUE = "\x00"  # joins such a word to the one before it while wrapping; not a space to textwrap


def _fill(text: str, initial: str = "", subsequent: str = "") -> str:
    words = text.split()
    glued = [w if i == 0 or not _OPENER.match(w) else _GLUE + w for i, w in enumerate(words)]
    out = textwrap.fill(" ".join(glued).replace(" " + _GLUE, _GLUE), WIDTH, initial_indent=initial,
                        subsequent_indent=subsequent, break_long_words=False, break_on_hyphens=False)
    return out.replace(_GLUE, " ")


def paragraph(*sentences: str) -> str:
    """The sentences as one paragraph, wrapped at the docs' width (no line opens with a block marker)."""
    return _fill(" ".join(s.strip() for s in sentences if s.strip()))


def bullets(items: Iterable[str], mark: str = "-") -> str:
    """A bulleted list (``mark``: ``-`` or ``*``, as the list it continues), each item wrapped at the docs'
    width with its continuation lines indented."""
    return "\n".join(_fill(i, f"{mark} ", "  ") for i in items if i.strip())


def join(*blocks: str) -> str:
    """Paragraphs and lists, one blank line apart."""
    return "\n\n".join(b for b in blocks if b.strip())


def series(values: Sequence[str], last: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    values = list(values)
    if len(values) <= 1:
        return "".join(values)
    return f"{', '.join(values[:-1])} {last} {values[-1]}"


def ranges(numbers: Iterable[int]) -> str:
    """``0–2``, ``5``, ``1–4, 7–9``: consecutive numbers as ranges."""
    nums = sorted(set(int(n) for n in numbers))
    out: list[str] = []
    start = prev = None
    for n in nums + [None]:
        if start is not None and (n is None or n != prev + 1):
            out.append(str(start) if start == prev else f"{start}–{prev}")
            start = None
        if n is not None and start is None:
            start = n
        prev = n
    return ", ".join(out)


def span(values: Iterable[float], spec: str = ".0f", sep: str = "–") -> str:
    """``min–max`` of ``values`` (one value when they are all equal after formatting)."""
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    lo, hi = format(min(vals), spec), format(max(vals), spec)
    return lo if lo == hi else f"{lo}{sep}{hi}"


def pct(ratio: float, spec: str = "+.0f") -> str:
    """``1.09`` -> ``+9%``: a ratio as a signed percentage change."""
    return f"{format(100 * (ratio - 1), spec)}%"


def count_word(n: int) -> str:
    """Small counts in words, as the docs write them."""
    words = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    return words[n] if 0 <= n < len(words) else str(n)
