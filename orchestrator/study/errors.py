"""Study-file problems: one printable line each, naming the key path, the bad value and what is allowed.

Pydantic's errors are turned into :class:`Problem` lines here. This module knows no
section of the study file: what keys are allowed at a path comes from a ``model_at``
lookup that the schema passes in (:func:`orchestrator.study.spec.parse_study`).
"""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pydantic import BaseModel, ValidationError

from orchestrator.redaction import is_secret_key, redact, scrub

# The model describing the mapping at a key path of a document (None: unknown).
ModelAt = Callable[[Any, tuple[str, ...]], Optional[type[BaseModel]]]


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    value: Any = None
    has_value: bool = False

    def __str__(self) -> str:
        got = f" (got {_short(self.value)})" if self.has_value else ""
        return _one_line(f"{self.path or '<root>'}: {self.message}{got}")


def _one_line(text: str) -> str:
    """Control characters (line breaks included) escaped: a problem is always one printable line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _short(value: Any) -> str:
    """The value redacted (secret keys' values, URL credentials); a long mapping by its keys only,
    a long list of mappings by its length: the offending block may hold a credential under any name; the
    text through the one text redactor (a credential in a string, a flag's value)."""
    value = redact(value)
    text = scrub(json.dumps(value, default=str) if not isinstance(value, str) else repr(value))
    if len(text) <= 80:
        return text
    if isinstance(value, Mapping):
        text = f"a mapping with keys {', '.join(map(str, value))}"
    elif isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        return f"a list of {len(value)} entries"
    return text if len(text) <= 80 else text[:77] + "..."


class StudyFileError(Exception):
    """A study file that cannot be used; ``problems`` holds one entry per bad key."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class LocatedError(ValueError):
    """Cross-field problems that already know their key paths (kept as such in the report)."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


def allowed_keys(model: type[BaseModel]) -> list[str]:
    return [n for n, f in model.model_fields.items() if not f.exclude]


def models_by_tag(union: Any, tag: str) -> dict[str, type[BaseModel]]:
    """``{tag value: model}`` of a discriminated union such as ``Annotated[Union[A, B], Field(discriminator=...)]``."""
    members = typing.get_args(typing.get_args(union)[0])
    return {m.model_fields[tag].default: m for m in members}


def problems_from_validation(err: ValidationError, data: Any, model_at: ModelAt) -> list[Problem]:
    problems = []
    for e in err.errors(include_url=False):
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, LocatedError):
            problems.extend(cause.problems)
            continue
        loc = data_path(data, [str(x) for x in e["loc"]])
        msg = e["msg"].removeprefix("Value error, ")
        etype = e["type"]
        path = ".".join(loc)
        if etype == "extra_forbidden":
            model = model_at(data, tuple(loc[:-1]))
            allowed = allowed_keys(model) if model is not None else []
            close = difflib.get_close_matches(loc[-1], allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msg = f"unknown key{hint}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
            problems.append(Problem(path, msg))
            continue
        if etype == "missing":
            problems.append(Problem(path, "required key is missing"))
            continue
        if etype in ("union_tag_invalid", "literal_error"):
            ctx = e.get("ctx") or {}
            expected = ctx.get("expected_tags") or ctx.get("expected")
            if expected:
                msg = f"not allowed; expected one of {expected}"
            if etype == "union_tag_invalid":  # the bad tag, not the whole block it selects
                e = {**e, "input": ctx.get("tag")}
        shown = "input" in e and etype != "missing" and not _may_be_secret(loc)
        problems.append(Problem(path, msg, e.get("input") if shown else None, has_value=shown))
    return problems


def _may_be_secret(loc: list[str]) -> bool:
    """The value of a secret-named key is never echoed (other values are shown redacted, see :func:`_short`)."""
    return bool(loc) and is_secret_key(loc[-1])


def data_path(data: Any, loc: list[str]) -> list[str]:
    """Drop pydantic's union-member tags (``engine.sim.x`` -> ``engine.x``) from an error location."""
    out: list[str] = []
    cur = data
    for seg in loc:
        if seg.startswith(("function-", "tagged-union[")):
            continue
        if isinstance(cur, dict):
            if seg in cur:
                cur = cur[seg]
                out.append(seg)
            elif cur.get("kind") == seg or cur.get("type") == seg or seg in ("int", "str", "float", "bool"):
                continue
            else:
                out.append(seg)
                cur = None
        elif isinstance(cur, list) and seg.isdigit() and int(seg) < len(cur):
            cur = cur[int(seg)]
            out.append(seg)
        elif cur is None:
            out.append(seg)
        else:
            break  # a shorthand scalar (``output_len: 0``): report at its key
    return out
