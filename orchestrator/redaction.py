"""Secrets stay off disk: what counts as one, and how it is kept out of what the project writes.

A study may carry credentials two ways:

* literally, under a key that names one (``engine.env: {HF_TOKEN: ...}``,
  ``engine.engine_kwargs: {hf_token: ...}``): the value is used, and replaced by ``***`` in
  everything written (``study.json``, the Parquet rows, failure messages, ``recommend``);
* by reference, a ``*_env`` key naming an environment variable of the trial's process
  (``engine_kwargs: {hf_token_env: HF_TOKEN}``, ``engine.api_key_env``): the study and
  its records hold only the variable's name; the value is read when the engine starts.

Values are redacted too, whatever their key: any URL's userinfo (``http://user:pw@proxy``), any
credential-like query or fragment parameter (``?sig=``, ``#access_token=``) and, in free text, a
value assigned to a secret-named key (``HF_TOKEN=...``, ``"api_key": "..."``) become ``***``.
Text that may quote a secret (an engine's log, an exception, a command line) is scrubbed of
every known secret value and of those before it is written or raised: :func:`scrub`
is the one text redactor, and :func:`redact`, :func:`redact_argv` and :func:`shell_line` go
through it. URLs the study names for the tuner to call must not carry credentials at all
(refused when the study is read).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

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


def redact(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A copy of ``value`` (dicts and lists, nested) with every secret-named key's value ``***`` and
    every string :func:`scrub`-bed (URL credentials, the known ``secrets``)."""
    secrets = tuple(secrets)
    if isinstance(value, Mapping):
        return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact(v, secrets))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    if isinstance(value, str):
        return scrub(value, secrets)
    return value


def _secret_flag(word: str) -> tuple[bool, bool]:
    """(whether ``word`` is a secret-named flag, whether its value is in it: ``--api-key=X``)."""
    flag, eq, _ = word.partition("=")
    return flag.startswith("--") and is_secret_key(flag[2:]), bool(eq)


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """Command-line words with the value of every secret-named flag ``***`` (``--hf-token X``,
    ``--api-key=X``) and every other word :func:`scrub`-bed."""
    out: list[str] = []
    hide_next = False
    secrets = tuple(secrets)
    for word in argv:
        secret, inline = _secret_flag(word)
        if hide_next:
            out.append(REDACTED)
        elif secret and inline:
            out.append(f"{word.partition('=')[0]}={REDACTED}")
        else:
            out.append(word if secret else scrub(word, secrets))
        hide_next = secret and not inline and not hide_next
    return out


def argv_secrets(argv: Iterable[str]) -> set[str]:
    """The values of a command line's secret-named flags, and the URL credentials in its words."""
    words = list(argv)
    found: set[str] = set()
    for i, word in enumerate(words):
        secret, inline = _secret_flag(word)
        if secret and inline:
            found.add(word.partition("=")[2])
        elif secret and i + 1 < len(words):
            found.add(words[i + 1])
        found |= url_secrets(word)
    return {s for s in found if s}


# A URL in free text (log lines, JSON, a repr): scheme, then everything up to a space or quote.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
# A query or fragment parameter (also ``#/route?token=`` and ``;``-separated ones).
_PARAM = re.compile(r"([?&#;])([^=&#;?\s]+)=([^&#;\s]*)")
# Outside URLs: NAME=value (HF_TOKEN=hf_..., --api-key=...) and "name": "value" (JSON, a dict's repr).
_ASSIGNED = re.compile(r"(?<![\w.])([A-Za-z][\w.-]*)=(\"[^\"]*\"|'[^']*'|[^\s&;,#'\"]+)")
_QUOTED = re.compile(r"([\"'])([A-Za-z][\w.-]*)\1(\s*:\s*)([\"'])(.*?)(?<!\\)\4")
# A command-line flag and its value, space-separated (``--hf-token hf_...``, ``--api-key KEY``).
_FLAG_VALUE = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)(\s+)([^\s'\"-][^\s'\"]*)")
# Credential-shaped tokens wherever they stand, by the prefixes their issuers give them: Hugging Face,
# OpenAI-style keys, GitHub, GitLab, Slack, AWS access key ids, and a bearer token.
_TOKEN = re.compile(r"\b(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|glpat-[A-Za-z0-9_-]{16,}"
                    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})\b|(?<=Bearer )[A-Za-z0-9._~+/=-]{16,}")


def _url_parts(url: str) -> tuple[str, str, str, str]:
    """(scheme://, userinfo, host and port, the rest) of a URL; userinfo "" where there is none."""
    scheme, _, rest = url.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, host = rest[:cut].rpartition("@")
    return scheme + "://", userinfo if at else "", host, rest[cut:]


def _credential_params(rest: str) -> list[tuple[str, str]]:
    return [(m[2], m[3]) for m in _PARAM.finditer(rest) if is_secret_key(unquote(m[2]))]


def url_secrets(text: str) -> set[str]:
    """The credentials the URLs in ``text`` carry: userinfo (and its parts), credential parameters' values."""
    found: set[str] = set()
    for url in _URL.findall(text):
        _, userinfo, _, rest = _url_parts(url)
        # user:password, or a token alone (https://TOKEN@host); a user name alone is no secret
        values = [userinfo, userinfo.partition(":")[2]] + [v for _, v in _credential_params(rest)]
        found |= {x for v in values for x in (v, unquote(v))}
    return {s for s in found if s and s != REDACTED}


def _clean_url(match: "re.Match[str]") -> str:
    scheme, userinfo, host, rest = _url_parts(match[0])
    rest = _PARAM.sub(lambda m: f"{m[1]}{m[2]}={REDACTED}" if is_secret_key(unquote(m[2])) else m[0], rest)
    return scheme + (f"{REDACTED}@" if userinfo else "") + host + rest


def scrub(text: Optional[str], secrets: Iterable[str] = ()) -> Optional[str]:
    """``text`` with every occurrence of a known secret value, every URL's userinfo, every
    credential-like URL parameter's value, every value assigned to a secret-named key
    (``HF_TOKEN=...``, ``"api_key": "..."``, ``--hf-token VALUE``) and every credential-shaped token
    (``hf_...``, ``sk-...``, ``ghp_...``, ``AKIA...``) replaced by ``***``: the one text redactor."""
    if not text:
        return text
    for s in sorted({s for s in secrets if s and len(s) >= _MIN_SCRUB_LEN}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    if "://" in text:
        text = _URL.sub(_clean_url, text)
    if "=" in text:
        text = _ASSIGNED.sub(lambda m: f"{m[1]}={REDACTED}" if is_secret_key(m[1]) else m[0], text)
    if ":" in text:
        text = _QUOTED.sub(lambda m: f"{m[1]}{m[2]}{m[1]}{m[3]}{m[4]}{REDACTED}{m[4]}" if is_secret_key(m[2])
                           else m[0], text)
    if "-" in text:
        text = _FLAG_VALUE.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}" if is_secret_key(m[1].lstrip("-")) else m[0], text)
    return _TOKEN.sub(REDACTED, text)


def holds_secret(text: str) -> bool:
    """Whether :func:`scrub` would hide part of ``text`` (or already did)."""
    return REDACTED in text or scrub(text) != text


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
        elif isinstance(v, str):
            found |= url_secrets(v)
    return found


@dataclass(frozen=True)
class EnvRef:
    """An engine argument's value to be read from an environment variable when the engine starts."""

    variable: str

    def __str__(self) -> str:  # how a written command shows it: the shell expands it
        return f"${{{self.variable}}}"


def shell_line(words: Iterable[Any], secrets: Iterable[str] = ()) -> str:
    """A command as one shell line, :func:`redact_argv`-ed; an :class:`EnvRef` ``"${VAR}"``."""
    words = list(words)
    shown = redact_argv([w if isinstance(w, str) else "" for w in words], secrets)
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
    for part, name in ((parts.query, "query string"), (parts.fragment, "fragment")):
        named = sorted({unquote(k) for k, _ in _credential_params("?" + part)})
        if named:
            return (f"the {name} carries a credential ({', '.join(named)}); URLs are recorded and printed: "
                    "put the key in an environment variable and name it in api_key_env")
    return None


def join_url(base: str, route: str) -> str:
    """``route`` appended to ``base``'s path, keeping ``base``'s query (``http://h/p?q`` + ``/v1/x`` =
    ``http://h/p/v1/x?q``)."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + route.lstrip("/")))
