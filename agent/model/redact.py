"""What the agent may say about a URL and the credentials it was given: never a secret.

Why one module: header values (API keys, bearer tokens), a URL's ``user:password@`` and the values of
its query (``?api-key=...``) are credentials. Every URL the agent shows (an OTLP collector, a dcgm-exporter,
an inference endpoint, in a log line, ``roofwatch doctor``, a settings error or a source's name) is shown
through :func:`safe_url`, and every message that may quote one through :func:`scrub`; the log formatter
scrubs each line once more with the secrets the settings hold (agent/app/logs.py). Text a server sent (a
redirect's ``Location``, a partial success's message, a reason phrase) is someone else's: clipped and made
printable here. It sits in the model, below every reader, and imports only :mod:`agent.model.text`.
"""

from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

from agent.model.text import one_line

HIDDEN = "<hidden>"
MIN_SECRET_CHARS = 4
"""Header values shorter than this are not searched for in messages (a tenant id "7" would blank every 7)."""

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]*@")
_QUERY_VALUE = re.compile(r"([?&][^=\s&#?]+=)[^&\s#]+")
_SCHEME_TOKEN = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]{6,})")


def _credential_word(word: str) -> bool:
    """Whether the word after ``Bearer``/``Basic`` is a credential: it holds a digit or a token character
    (``+/=._~-``), a capital past its first letter (base64, ``dXNlcjpwYXNz``), or is 20 characters long;
    "basic auth", "Bearer token" and "Basic Authentication" are words, not credentials."""
    return (any(c.isdigit() or c in "+/=._~-" for c in word) or any(c.isupper() for c in word[1:])
            or len(word) >= 20)


_NAMED_SECRET = re.compile(r"(?i)\b(token|api[-_]?key|password|secret)(\s*[=:]\s*)[^\s,;&]+")


def safe_url(url: str, limit: int = 200) -> str:
    """``url`` as it may be shown: no ``user:password@`` (``<hidden>@``), each query value ``<hidden>``,
    no fragment; printable and clipped. Never raises, whatever the text."""
    text = url.strip()
    schemeless = "://" not in text  # "user:pw@host:4318": urlsplit would read "user" as the scheme
    try:
        parts = urlsplit("//" + text if schemeless else text)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = f"{HIDDEN}@{netloc.rpartition('@')[2]}"
        query = "&".join(f"{k}={HIDDEN}" if sep else k
                         for k, sep, _ in (item.partition("=") for item in parts.query.split("&") if item))
        shown = urlunsplit((parts.scheme, netloc, parts.path, query, ""))
        shown = shown.removeprefix("//") if schemeless else shown
    except ValueError:  # an unparseable URL (``http://[x``): only the generic patterns
        shown = scrub(url)
    return one_line(shown, limit)


_remembered: frozenset[str] = frozenset()
"""Credentials the settings of this process hold (:func:`remember`): hidden by :func:`hide` wherever they
appear. A frozenset replaced whole, so readers on other threads never see it half built."""


def remember(secrets: Iterable[str]) -> None:
    """Hide ``secrets`` in every message of this process from now on: the settings call it with their header
    values, tokens and URL credentials as they load (agent/app/config.py), ``fleet-report`` with its token."""
    global _remembered
    _remembered = _remembered | {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_CHARS}


def hide(text: object, secrets: Iterable[str] = ()) -> str:
    """``text`` with every remembered or given secret, URL userinfo, URL query value, ``Bearer``/``Basic``
    token and ``token=``/``password:`` value replaced by ``<hidden>``; otherwise as it was (not clipped, not
    folded): for whole log lines, ``doctor`` reports and errors on stderr."""
    line = str(text)
    known = _remembered | {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_CHARS}
    for secret in sorted(known, key=len, reverse=True):
        if secret in line:
            line = line.replace(secret, HIDDEN)
    line = _USERINFO.sub(lambda m: m.group(1) + HIDDEN + "@", line)
    line = _QUERY_VALUE.sub(lambda m: m.group(1) + HIDDEN, line)
    line = _SCHEME_TOKEN.sub(lambda m: m.group(1) + m.group(2) + HIDDEN if _credential_word(m.group(3)) else m.group(0),
                             line)
    line = _NAMED_SECRET.sub(lambda m: m.group(1) + m.group(2) + HIDDEN, line)
    return line


def scrub(text: object, secrets: Iterable[str] = (), limit: int = 300) -> str:
    """:func:`hide`, then one printable line clipped to ``limit``: for a message quoting what a server sent."""
    return one_line(hide(text, secrets), limit)


_CREDENTIAL_QUERY = re.compile(r"(?i)(token|key|secret|pass|auth|sig|session|credential)")


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: its userinfo (whole, user and password) and the values of query
    parameters named like a credential (``token``, ``api_key``, ``sig``...) or 16 characters and longer;
    short values of other parameters (``?format=text``) are not credentials, and hiding them everywhere
    would blank ordinary words."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        found += [userinfo, *userinfo.split(":", 1)]
        found += [unquote(s) for s in found]  # the decoded forms reach a Basic header
    for name, sep, value in (item.partition("=") for item in parts.query.split("&")):
        if sep and value and (_CREDENTIAL_QUERY.search(name) or len(value) >= 16):
            found += [value, unquote(value)]
    return [s for s in found if s]
