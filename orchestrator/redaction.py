"""Secrets stay off disk: what counts as one, and how it is kept out of what the project writes.

A study may carry credentials two ways:

* literally, under a key that names one (``engine.env: {HF_TOKEN: ...}``,
  ``engine.engine_kwargs: {hf_token: ...}``): the value is used, and replaced by ``***`` in
  everything written (``study.json``, the Parquet rows, failure messages, ``recommend``);
* by reference, a ``*_env`` key naming an environment variable of the trial's process
  (``engine_kwargs: {hf_token_env: HF_TOKEN}``, ``engine.api_key_env``): the study and
  its records hold only the variable's name; the value is read when the engine starts.

Text that may quote a secret (an engine's log, an exception) is scrubbed of every known
secret value before it is recorded. URLs must not carry credentials at all (refused when the
study is read): they are recorded, and printed in errors.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional
from urllib.parse import parse_qsl, urlsplit, urlunsplit

REDACTED = "***"
ENV_SUFFIX = "_env"
# A key names a secret when its last word (split on _ - . and case) is one of these (hf_token, api_key,
# AWS_SECRET_ACCESS_KEY, Authorization), or any word is one of ALWAYS_SECRET (client_secret_id). Not
# long_prefill_token_threshold or max_num_batched_tokens: counts of tokens, not credentials.
SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "authorization", "auth",
                          "credential", "credentials", "bearer", "cookie", "signature", "sig"})
ALWAYS_SECRET = frozenset({"secret", "password", "passwd", "authorization", "credential", "credentials"})
_MIN_SCRUB_LEN = 4  # shorter values would blank ordinary text


def is_secret_key(name: Any) -> bool:
    """Whether ``name`` names a credential (a ``*_env`` key names a variable, not a value)."""
    text = str(name)
    if is_reference(text):
        return False
    words = [w for w in re.split(r"[_\-.\s]+", text.lower()) if w]
    return bool(words) and (words[-1] in SECRET_WORDS or any(w in ALWAYS_SECRET for w in words))


def redact(value: Any) -> Any:
    """A copy of ``value`` (dicts and lists, nested) with every secret-named key's value ``***``."""
    if isinstance(value, Mapping):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Command-line words with the value of every secret-named flag ``***`` (``--hf-token X``, ``--api-key=X``)."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = word.partition("=")
        if flag.startswith("--") and is_secret_key(flag[2:]):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(word)
    return out


def scrub(text: Optional[str], secrets: Iterable[str]) -> Optional[str]:
    """``text`` with every occurrence of a secret value replaced by ``***``."""
    if not text:
        return text
    for s in sorted({s for s in secrets if s and len(s) >= _MIN_SCRUB_LEN}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return text


def is_reference(key: Any) -> bool:
    """Whether ``key`` (``hf_token_env``) names an environment variable holding the value."""
    return str(key).lower().endswith(ENV_SUFFIX)


def _items(value: Any) -> Iterable[tuple[Any, Any]]:
    """Every (key, value) of every mapping inside ``value``, nested lists included."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield k, v
            yield from _items(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _items(v)


def secret_values(engine_spec: Any, environ: Mapping[str, str] = os.environ) -> set[str]:
    """Every secret an engine spec carries: its literal ones, and the values (in ``environ``)
    of the variables its ``*_env`` keys name."""
    body = engine_spec.model_dump(mode="json") if hasattr(engine_spec, "model_dump") else dict(engine_spec)
    found = set()
    for k, v in _items(body):
        if is_secret_key(k) and isinstance(v, (str, int)) and v != "":
            found.add(str(v))
        elif is_reference(k) and isinstance(v, str) and environ.get(v):
            found.add(environ[v])
    return found


@dataclass(frozen=True)
class EnvRef:
    """An engine argument's value to be read from an environment variable when the engine starts."""

    variable: str

    def __str__(self) -> str:  # how a written command shows it: the shell expands it
        return f"${{{self.variable}}}"


def shell_line(words: Iterable[Any]) -> str:
    """A command as one shell line: a secret flag's value ``***``, an :class:`EnvRef` ``"${VAR}"``."""
    words = list(words)
    shown = redact_argv([w if isinstance(w, str) else "" for w in words])
    return " ".join(f'"{w}"' if isinstance(w, EnvRef) else shlex.quote(s) for w, s in zip(words, shown))


def env_references(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with every ``name_env: VAR`` entry turned into ``name: EnvRef(VAR)``."""
    out: dict[str, Any] = {}
    for k, v in kwargs.items():
        if isinstance(k, str) and is_reference(k) and isinstance(v, str):
            out[k[: -len(ENV_SUFFIX)]] = EnvRef(v)
        else:
            out[k] = v
    return out


class MissingSecret(LookupError):
    """A ``*_env`` reference names a variable the trial's process does not have."""


def resolve_env_references(kwargs: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``kwargs`` with every :class:`EnvRef` replaced by its variable's value."""
    out: dict[str, Any] = {}
    for k, v in kwargs.items():
        if isinstance(v, EnvRef):
            if not environ.get(v.variable):
                raise MissingSecret(f"engine_kwargs.{k}{ENV_SUFFIX} names {v.variable}, which is not set in the "
                                    "trial's environment (set it where the trials run, e.g. ray job submit "
                                    "--runtime-env-json '{\"env_vars\": ...}')")
            out[k] = environ[v.variable]
        else:
            out[k] = v
    return out


def url_credential_problem(url: str) -> Optional[str]:
    """Why ``url`` must not be recorded as it is (it carries a credential), or None."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        return ("credentials do not belong in the URL (it is recorded); put the key in an environment "
                "variable and name it in api_key_env")
    named = sorted({k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if is_secret_key(k)})
    if named:
        return (f"the query string carries a credential ({', '.join(named)}); URLs are recorded and printed: "
                "put the key in an environment variable and name it in api_key_env")
    return None


def join_url(base: str, route: str) -> str:
    """``route`` appended to ``base``'s path, keeping ``base``'s query (``http://h/p?q`` + ``/v1/x`` =
    ``http://h/p/v1/x?q``)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + route.lstrip("/")))
