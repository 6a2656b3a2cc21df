"""The one rule for an OTLP header, from every source: the settings file, ``ROOFWATCH_OTLP_HEADERS`` and
``OTEL_EXPORTER_OTLP_[METRICS_]HEADERS``.

Why refuse at start instead of at the first push: a value with a line break (``Bearer%20sk-...%0D%0A``
in the variable) can never be sent, so every push would fail, and the HTTP library's error quotes the
value, which then reached the log and ``roofwatch doctor``. A name must be a token gRPC metadata also
takes; a value printable ASCII on one line (what gRPC metadata and an HTTP header both carry). Errors
name the header, or its position when the name itself is wrong, and never show a value.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

MAX_VALUE_CHARS = 8192
"""gRPC's default metadata limit; an API key or a bearer token is far shorter."""
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_DELIMITER = re.compile(r"[ \t]*,[ \t]*")
_ENV_ENTRY = re.compile(r"[ \t]*[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+[ \t]*=[ \t]*"
                        r"[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*")
"""An entry of the variable as the SDK's liberal parser (``opentelemetry.util.re``) takes it; the SDK logs an
entry it cannot take whole, value included, so anything else is refused here first."""
NOT_SHOWN = "the value is not shown: it may be a credential"


class HeaderError(ValueError):
    """A header that cannot be sent; the message names it (or its position) and never its value."""


def problem(name: Any, value: Any, position: int) -> str | None:
    """What is wrong with one header (``position`` counts from 1, for a name that cannot be shown), or None."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return f"header {position}: its name is not a token (letters, digits, '-', '_' and '.'; not shown)"
    if not isinstance(value, str):
        return f"header {name}: the value must be a string"
    if len(value) > MAX_VALUE_CHARS:
        return f"header {name}: the value is longer than {MAX_VALUE_CHARS} characters ({NOT_SHOWN})"
    if any(not " " <= c <= "~" for c in value):
        return (f"header {name}: the value holds a line break, a control or a non-ASCII character "
                f"({NOT_SHOWN})")
    return None


def check(headers: dict[Any, Any]) -> None:
    """:class:`HeaderError` for the first header of ``headers`` that cannot be sent."""
    for position, (name, value) in enumerate(headers.items(), 1):
        found = problem(name, value, position)
        if found:
            raise HeaderError(found)


def split_pairs(text: str) -> list[tuple[str, str]]:
    """``key=value,key2=value2`` as pairs, stripped (no decoding); :class:`HeaderError` naming the position of
    an entry without ``=`` or a name, never its text."""
    entries = [part for part in text.split(",") if part.strip()]
    pairs = []
    for position, entry in enumerate(entries, 1):
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise HeaderError(f"entry {position} of {len(entries)} is not key=value (key=value,key2=value2; "
                              f"{NOT_SHOWN})")
        pairs.append((key.strip(" \t"), value.strip(" \t")))  # a trailing line break stays, to be refused
    return pairs


def parse_variable(text: str) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_[METRICS_]HEADERS`` as the specification writes it (values URL-encoded), names
    lower-cased, every header checked after decoding (``%0D%0A`` is a line break)."""
    headers: dict[str, str] = {}
    entries = [e for e in _DELIMITER.split(text) if e]
    for position, entry in enumerate(entries, 1):
        if not _ENV_ENTRY.fullmatch(entry.strip()):
            raise HeaderError(f"entry {position} of {len(entries)} is not name=value with the value URL-encoded "
                              f"(%20 for a space; {NOT_SHOWN})")
        name, value = entry.strip().split("=", 1)
        name, value = unquote(name).strip().lower(), unquote(value)
        found = problem(name, value, position)  # before stripping: a trailing %0D%0A is refused too
        if found:
            raise HeaderError(found)
        headers[name] = value.strip()
    return headers
